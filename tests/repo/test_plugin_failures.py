"""Field cases S52 and S53, with real distributions made in a temporary folder (a dist-info with its entry
points beside its modules, as pip leaves them) and seen by subprocesses only (``PYTHONPATH`` or their working
folder): a package that declares forkyard's own names never replaces them, whatever the ``sys.path`` order, and
the refusal names both packages and the entry point (S52); a plugin that raises any exception at import or at
registration (``SystemExit`` with its usage text included) is named and never stops ``import envs``, the server's
app or a trainer, while a real Ctrl-C still does (S53). The plugin rules: :mod:`envs.plugins`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.docker_support import ROOT
from tests.repo.test_entry_point_plugins import plugin_env, run_python


def make_dist(folder: Path, name: str, files: dict[str, str], entry_points: str) -> Path:
    """A real installed distribution ``name`` in ``folder`` (its modules and a dist-info with ``entry_points``,
    as pip leaves them): ``importlib.metadata`` finds it once ``folder`` is on ``sys.path``. Returns ``folder``."""
    info = folder / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(textwrap.dedent(text))
    return folder


# Field case S52: a package that declares forkyard's own names (built in by code, or forkyard's own entry points
# `default` and `ray`); none of `.taken` may even be imported. Its `clash-over` registers over a built-in env.
CLASH_ENTRY_POINTS = """\
    [forkyard.sandbox_providers]
    default = forkyard_clash_plugin.taken:provider
    [forkyard.collectors]
    ray = forkyard_clash_plugin.taken:collector
    local = forkyard_clash_plugin.taken:collector
    [forkyard.backends]
    local = forkyard_clash_plugin.taken:Config
    [forkyard.estimators]
    grpo = forkyard_clash_plugin.taken:estimator
    clash-shared = forkyard_clash_plugin:estimator
    [forkyard.policies]
    tabular = forkyard_clash_plugin.taken:POLICY
    [forkyard.envs]
    forkyard/ClueProbe-v0 = forkyard_clash_plugin.taken:Env
    clash-over = forkyard_clash_plugin:register_over
"""
CLASH_FILES = {
    "forkyard_clash_plugin/__init__.py": """
        import gymnasium
        def estimator(rollout, cfg):
            raise RuntimeError("never called")
        def register_over():  # Gymnasium's own register replaces an id silently
            gymnasium.register(id="forkyard/FileQA-v0", entry_point="forkyard_clash_plugin:estimator")
    """,
    "forkyard_clash_plugin/taken.py": "provider = collector = Config = estimator = POLICY = Env = print\n",
}
CLASH_CHECK = """
    import json, sys
    import envs
    from envs.sandbox import _factory
    from sandbox_server.app import create_env_app
    from sandbox_server.backends import BACKENDS
    from trainer.collectors import _REGISTRY as COLLECTORS, get_collector
    from trainer.estimators import estimator_names, get_estimator
    from trainer.policies import get_policy

    create_env_app()
    try:
        get_estimator("clash-shared")
    except ValueError as exc:
        shared = str(exc)
    print(json.dumps({
        "provider": _factory("default").__module__, "ray": get_collector("ray").__module__,
        "local": get_collector("local").__module__, "backend": BACKENDS["local"].__module__,
        "grpo": get_estimator("grpo").fn.__module__, "tabular": get_policy("tabular").setup,
        "envs": [envs.env_spec(i).entry_point for i in ("forkyard/ClueProbe-v0", "forkyard/FileQA-v0")],
        "estimators": estimator_names(), "shared": shared, "collector_errors": COLLECTORS.plugin_errors,
        "imported": "forkyard_clash_plugin.taken" in sys.modules}))
"""


def test_a_plugin_named_like_a_built_in_never_replaces_it_whatever_the_path_order(tmp_path):
    user = make_dist(tmp_path / "user", "forkyard-clash-plugin", CLASH_FILES, CLASH_ENTRY_POINTS)
    twin = make_dist(tmp_path / "twin", "forkyard-clash-twin", {"forkyard_clash_twin.py": "centred = print\n"},
                     "[forkyard.estimators]\nclash-shared = forkyard_clash_twin:centred\n")
    outs = []
    for cwd, paths in ((user, [twin, ROOT]), (ROOT, [ROOT, twin, user]), (tmp_path, [twin, user, ROOT])):
        # run from the user's folder (first on sys.path), or with the plugins after or before forkyard
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(CLASH_CHECK)], capture_output=True, text=True,
                           cwd=cwd, env={**plugin_env(), "PYTHONPATH": os.pathsep.join(map(str, paths))}, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        assert "from forkyard) failed to load" not in r.stderr, r.stderr[-3000:]
        for group, name, holder in (
                ("forkyard.sandbox_providers", "default",
                 "is forkyard's own (sandbox_server.embedded:shared_provider, from forkyard)"),
                ("forkyard.collectors", "ray",
                 "is forkyard's own (ray_cluster.collector:ray_collector, from forkyard)"),
                ("forkyard.collectors", "local", "is already registered (trainer.collectors:local_collector, from "
                                                 "forkyard)"),
                ("forkyard.backends", "local", "is already registered (sandbox_server.backends:LocalBackendConfig, "
                                                 "from forkyard)"),
                ("forkyard.estimators", "grpo", "is already registered (trainer.estimators:grpo, from forkyard)"),
                ("forkyard.policies", "tabular", "is already registered (trainer.tabular:setup, from forkyard)"),
                ("forkyard.envs", "forkyard/ClueProbe-v0", "is already registered (envs.clueprobe:ClueProbeEnv, "
                                                           "from forkyard)")):
            assert (f"the plugin {name!r} of {group} (forkyard_clash_plugin.taken:"
                    f"{'Env' if group == 'forkyard.envs' else ''}") in r.stderr, (group, r.stderr[-3000:])
            assert f"from forkyard-clash-plugin) is refused: {name!r} {holder}" in r.stderr, (group, r.stderr[-3000:])
        assert ("the plugin 'clash-over' of forkyard.envs (forkyard_clash_plugin:register_over, from "
                "forkyard-clash-plugin) replaced or removed 'forkyard/FileQA-v0' (envs.fileqa:FileQAEnv, from "
                "forkyard) while loading: restored") in r.stderr, r.stderr[-3000:]
    assert outs[0] == outs[1] == outs[2]  # never dependent on sys.path order
    out = outs[0]
    assert (out["provider"], out["ray"], out["local"], out["backend"], out["grpo"], out["tabular"]) == (
        "sandbox_server.embedded", "ray_cluster.collector", "trainer.collectors", "sandbox_server.backends",
        "trainer.estimators", "trainer.tabular:setup")
    assert out["envs"] == ["envs.clueprobe:ClueProbeEnv", "envs.fileqa:FileQAEnv"]
    assert out["imported"] is False  # a refused plugin is never even imported
    assert out["collector_errors"].keys() == {"ray", "local"}
    # two other packages declaring one name: both refused, both named, in either order
    assert "clash-shared" not in out["estimators"]
    assert ("'clash-shared' is declared by 2 packages (forkyard_clash_plugin:estimator, from forkyard-clash-plugin; "
            "forkyard_clash_twin:centred, from forkyard-clash-twin): none is loaded") in out["shared"], out["shared"]


# Field case S53: plugins that end the process at import (SystemExit with a usage text, GeneratorExit, a plugin's
# own BaseException, a KeyboardInterrupt that no Ctrl-C raised) or at registration, in every group.
GROUPS = ("forkyard.envs", "forkyard.backends", "forkyard.estimators", "forkyard.policies", "forkyard.collectors",
          "forkyard.sandbox_providers")
EXITING = {  # distribution -> (the end of its module, raised at import; how its failure reads)
    "forkyard-exit-plugin": ('raise SystemExit("usage: forkyard-exit-plugin [--help]")',
                             "SystemExit: usage: forkyard-exit-plugin [--help]"),
    "forkyard-genexit-plugin": ("raise GeneratorExit('closed')", "GeneratorExit: closed"),
    "forkyard-abort-plugin": ("class Abort(BaseException): pass\nraise Abort('the plugin gave up')",
                              "Abort: the plugin gave up"),
    "forkyard-fakeint-plugin": ("class Fake(KeyboardInterrupt): pass\nraise Fake('not a Ctrl-C')",
                                "Fake: not a Ctrl-C"),
}
REGEXIT_PLUGIN = """
    import sys
    print("hello from a plugin")  # printing is fine
    def register():
        sys.exit("usage: regexit")
    class Estimator:
        def __call__(self, rollout, cfg):
            raise RuntimeError("never called")
        @property
        def needs_tree(self):
            raise SystemExit(4)
    BAD = Estimator()
    def fine(rollout, cfg):
        raise RuntimeError("never called")
"""
EXIT_CHECK = """
    import json
    import envs
    from envs.sandbox import provider_for
    from sandbox_server.app import create_env_app
    from sandbox_server.backends import make_backend
    from trainer.collectors import get_collector
    from trainer.estimators import estimator_names, get_estimator
    from trainer.policies import get_policy

    create_env_app()
    out = {"envs": envs.registry.ENV_PLUGINS.plugin_errors, "estimators": estimator_names()}
    for dist in DISTS:
        short = dist.removeprefix("forkyard-").removesuffix("-plugin")
        for kind, lookup in (("backends", make_backend), ("estimators", get_estimator), ("policies", get_policy),
                             ("collectors", get_collector), ("sandbox_providers", lambda n: provider_for(None, n))):
            try:
                lookup(short)
            except (ValueError, ImportError) as exc:
                out[f"{dist} {kind}"] = str(exc)
    try:
        get_estimator("regexit-bad")
    except ValueError as exc:
        out["registration"] = str(exc)
    print(json.dumps(out))
"""


def test_a_plugin_that_exits_at_import_or_registration_is_named_and_never_fatal(tmp_path):
    folder = tmp_path / "site"
    for dist, (last_line, _) in EXITING.items():
        module = dist.replace("-", "_")
        short = dist.removeprefix("forkyard-").removesuffix("-plugin")
        make_dist(folder, dist, {f"{module}.py": f"print('importing {module}')\n{last_line}\n"},
                  "".join(f"[{g}]\n{'ns/' + short + '-v0' if g == 'forkyard.envs' else short} = {module}:thing\n"
                          for g in GROUPS))
    make_dist(folder, "forkyard-regexit-plugin", {"forkyard_regexit_plugin.py": REGEXIT_PLUGIN},
              "[forkyard.envs]\nregexit = forkyard_regexit_plugin:register\n[forkyard.estimators]\n"
              "regexit-bad = forkyard_regexit_plugin:BAD\nregexit-fine = forkyard_regexit_plugin:fine\n")
    r = run_python(f"DISTS = {list(EXITING)!r}\n{textwrap.dedent(EXIT_CHECK)}", folder)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "hello from a plugin" in r.stdout and out["estimators"][-1] == "regexit-fine"
    for dist, (_, failure) in EXITING.items():
        module, short = dist.replace("-", "_"), dist.removeprefix("forkyard-").removesuffix("-plugin")
        for group in GROUPS:
            name = f"ns/{short}-v0" if group == "forkyard.envs" else short
            message = out["envs"][name] if group == "forkyard.envs" else out[f"{dist} {group.split('.')[1]}"]
            assert (f"the plugin {name!r} of {group} ({module}:thing, from {dist}) failed to load: "
                    f"{failure}") in message, message
        assert f"the plugin 'ns/{short}-v0' of forkyard.envs ({module}:thing" in r.stderr  # logged at import
    assert ("the plugin 'regexit' of forkyard.envs (forkyard_regexit_plugin:register, from forkyard-regexit-plugin) "
            "failed to load: SystemExit: usage: regexit") == out["envs"]["regexit"]
    assert ("the plugin 'regexit-bad' of forkyard.estimators (forkyard_regexit_plugin:BAD, from "
            "forkyard-regexit-plugin) failed to load: SystemExit: 4") in out["registration"], out["registration"]
    # every trainer runs, the env plugins named at its start
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "train", "--iterations", "1", "--group-size", "2",
                        "--eval-episodes", "2", "--device", "cpu", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, cwd=ROOT, env=plugin_env(folder), timeout=300)
    assert r.returncode == 0 and "greedy evaluation: " in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    assert "from forkyard-exit-plugin) failed to load: SystemExit: usage: forkyard-exit-plugin" in r.stderr


def test_a_real_ctrl_c_while_a_plugin_loads_still_stops_the_process(tmp_path):
    folder = make_dist(tmp_path / "site", "forkyard-sigint-plugin", {"forkyard_sigint_plugin.py": """
        import os, signal, time
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does
        time.sleep(30)
    """}, "[forkyard.estimators]\nsigint = forkyard_sigint_plugin:fn\n")
    # Ctrl-C as in a terminal: SIGINT's default action restored in the child (a runner that started this suite in
    # the background, as a non-interactive shell does with `cmd &`, ignores SIGINT, and a child inherits that)
    r = subprocess.run([sys.executable, "-c", "from trainer.estimators import estimator_names; "
                        "print(estimator_names()); print('survived')"], capture_output=True, text=True, cwd=ROOT,
                       env=plugin_env(folder), timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode != 0 and "survived" not in r.stdout, r.stdout
    assert "KeyboardInterrupt" in r.stderr, r.stderr[-2000:]
