"""Plugins from an installed package: tests/plugins/forkyard_example_plugin declares an env, a sandbox backend,
an advantage estimator and a policy in the entry-point groups ``forkyard.envs``, ``forkyard.backends``,
``forkyard.estimators`` and ``forkyard.policies``, and nothing in the repo names them.

The package is built and installed (``pip install --no-deps --no-build-isolation --target``) into a temporary
folder that only the subprocesses of these tests see (``PYTHONPATH``), and removed at the end: this process
and other tests never see the plugin. Each kind is then used the ways a user has: ``gymnasium.make``,
``forkyard train --env/--estimator/--policy``, ``python -m sandbox_server --backend`` and env sessions served
over HTTP by that server (a real one, on a free loopback port). A second, broken package (its entry points
name a module that does not exist) shows that a plugin that fails is reported by name and never stops the
server or the trainer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.docker_support import ROOT, free_port, require_bwrap, wait_http_ok
from envs.suite import SUITE

PLUGIN_SRC = ROOT / "tests" / "plugins" / "forkyard_example_plugin"
BROKEN_ENTRY_POINTS = """\
[forkyard.backends]
example-broken = forkyard_no_such_module:Config

[forkyard.envs]
example/Broken-v0 = forkyard_no_such_module:Env

[forkyard.estimators]
example-broken = forkyard_no_such_module:estimator

[forkyard.policies]
example-broken = forkyard_no_such_module:POLICY
"""


@pytest.fixture(scope="module")
def plugin_dirs():
    """(folder the example plugin is installed in, folder of the broken plugin's metadata); both removed after."""
    with tempfile.TemporaryDirectory(prefix="forkyard-plugins-") as tmp:
        src, target, broken = Path(tmp) / "src", Path(tmp) / "site", Path(tmp) / "broken"
        shutil.copytree(PLUGIN_SRC, src)  # the build writes build/ and *.egg-info beside its sources: not in the repo
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                            "--quiet", "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        info = broken / "forkyard_broken_plugin-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: forkyard-broken-plugin\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(BROKEN_ENTRY_POINTS)
        yield target, broken


def plugin_env(*paths: Path) -> dict[str, str]:
    """The environment of a subprocess that sees the plugins in ``paths`` (and the checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "FORKYARD_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT)])
    return env


def run_python(code: str, *paths: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that sees the plugins in ``paths``."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env=plugin_env(*paths), timeout=timeout)


def test_every_kind_joins_its_registry_and_gymnasium_make(plugin_dirs):
    target, _ = plugin_dirs
    r = run_python("""
        import json
        import gymnasium as gym
        import envs
        from sandbox_server.backends import BACKENDS
        from trainer.estimators import estimator_names, get_estimator
        from trainer.policies import get_policy, policy_names

        env = gym.make("example/Coin-v0").unwrapped
        envs.check_fork_contract(env)
        obs, info = env.reset(seed=3)
        obs, reward, *_ = env.step("peek()")
        more = gym.make("example/CoinMore-v0").unwrapped
        module_form = gym.make("forkyard_example_plugin.unlisted:CoinToo-v0").unwrapped
        print(json.dumps({
            "envs": sorted(envs.forkyard_specs()), "obs": obs, "more": type(more).__name__,
            "module_form": type(module_form).__name__, "backends": sorted(BACKENDS),
            "estimators": list(estimator_names()), "needs_tree": get_estimator("example-centred").needs_tree,
            "policies": list(policy_names()), "policy_help": get_policy("example-tabular").help,
            "errors": [envs.registry.ENV_PLUGINS.plugin_errors, BACKENDS.plugin_errors]}))
    """, target)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["envs"] == sorted(["CoinToo-v0", "example/Coin-v0", "example/CoinMore-v0", "forkyard/ClueProbe-v0",
                                  "forkyard/FileQA-v0", *(env_id for env_id, _, _ in SUITE)])
    assert out["obs"].startswith(("the coin is 0", "the coin is 1"))
    assert out["more"] == out["module_form"] == "CoinEnv"
    assert out["backends"] == ["docker", "example-local", "local"]
    assert out["estimators"][-1] == "example-centred" and out["needs_tree"] is False
    assert out["policies"] == ["tabular", "lm", "example-tabular"]
    assert "step size of 0.5" in out["policy_help"]
    assert out["errors"] == [{}, {}]


def test_forkyard_train_takes_a_plugin_env_estimator_and_policy(plugin_dirs, tmp_path):
    target, _ = plugin_dirs
    help_text = subprocess.run([sys.executable, "-m", "trainer.cli", "train", "--policy", "example-tabular", "--help"],
                               capture_output=True, text=True, cwd=ROOT, env=plugin_env(target), timeout=300)
    assert help_text.returncode == 0, help_text.stderr[-2000:]
    assert "example-tabular" in help_text.stdout and "--note" in help_text.stdout  # the plugin config's own option
    assert "example-centred" in help_text.stdout  # --estimator's choices
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "train", "--policy", "example-tabular", "--env",
                        "example/Coin-v0", "--estimator", "example-centred", "--iterations", "3", "--group-size", "4",
                        "--eval-episodes", "8", "--device", "cpu", "--note", "from the test",
                        "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, cwd=ROOT, env=plugin_env(target), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])  # the plugin policy's own report
    assert out["policy"] == "example-tabular" and out["note"] == "from the test" and out["lr"] == 0.5
    assert out["iterations"] == 3 and out["evaluation"]["episodes"] == 8
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["env_id"] == "example/Coin-v0" and config["estimator"] == "example-centred"
    # Gymnasium's "module:Id" form is kept as given (no forkyard/ prefix), with the built-in policy
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "train", "--env",
                        "forkyard_example_plugin.unlisted:CoinToo-v0", "--iterations", "2", "--group-size", "4",
                        "--eval-episodes", "4", "--device", "cpu"],
                       capture_output=True, text=True, cwd=ROOT, env=plugin_env(target), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "greedy evaluation: " in r.stdout


def test_a_broken_plugin_is_named_and_never_fatal(plugin_dirs):
    target, broken = plugin_dirs
    r = run_python("""
        import json
        import envs
        from sandbox_server.backends import make_backend
        from trainer.estimators import estimator_names, get_estimator
        from trainer.policies import get_policy

        out = {"envs": sorted(envs.forkyard_specs()), "estimators": list(estimator_names())}
        for name, lookup in (("backend", make_backend), ("estimator", get_estimator), ("policy", get_policy)):
            try:
                lookup("example-broken")
            except ValueError as exc:
                out[name] = str(exc)
        print(json.dumps(out))
    """, broken, target)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "example/Coin-v0" in out["envs"] and "example/Broken-v0" not in out["envs"]  # the good one still loads
    assert "example-centred" in out["estimators"]
    for kind in ("backend", "estimator", "policy"):
        assert "the plugin 'example-broken' of forkyard." in out[kind], out[kind]
        assert "from forkyard-broken-plugin) failed to load: ModuleNotFoundError" in out[kind], out[kind]
    assert "the plugin 'example/Broken-v0' of forkyard.envs" in r.stderr  # logged at import, as a warning
    # the server command refuses the broken backend with its reason, as a usage error (status 2)
    r = subprocess.run([sys.executable, "-m", "sandbox_server", "--backend", "example-broken", "--port",
                        str(free_port())], capture_output=True, text=True, cwd=ROOT, env=plugin_env(broken),
                       timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "the plugin 'example-broken' of forkyard.backends" in r.stderr and "ModuleNotFoundError" in r.stderr


def test_the_plugin_backend_meets_the_contract(plugin_dirs):
    require_bwrap()
    target, _ = plugin_dirs
    r = run_python("""
        from forkyard_example_plugin.backend import ExampleLocalBackend
        from sandbox_server.backends import make_backend
        from sandbox_server.backends.checks import check_backend_contract

        backend = make_backend("example-local")
        try:
            check_backend_contract(backend)
        finally:
            backend.close()
        print(type(backend).__name__, ExampleLocalBackend.started)
    """, target)
    assert r.returncode == 0, r.stderr[-3000:]
    name, started = r.stdout.split()[-2:]
    assert name == "ExampleLocalBackend" and int(started) >= 5  # one sandbox per check at least


def test_the_server_runs_the_plugin_backend_and_serves_plugin_envs(plugin_dirs, tmp_path):
    require_bwrap()
    target, broken = plugin_dirs
    port, log = free_port(), tmp_path / "server.log"
    env = {**plugin_env(broken, target), "FORKYARD_SERVER_NAME": f"pytest-plugins-{os.getpid()}"}
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "sandbox_server", "--backend", "example-local", "--port",
                                 str(port), "--min-idle", "1", "--log-level", "warning",
                                 "--env-modules", "forkyard_example_plugin.unlisted"],
                                cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_http_ok(f"{url}/healthz", 120, proc, log), log.read_text()[-2000:]
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/healthz").json()["backend"] == "example-local"
            sid = http.post("/v1/sandboxes", json={"files": {"note.txt": "from a plugin backend\n"}}).json()["id"]
            res = http.post(f"/v1/sandboxes/{sid}/exec", json={"tool": "cat", "args": {"path": "/scratch/note.txt"}})
            assert res.status_code == 200 and res.json()["stdout"] == "from a plugin backend\n", res.text
            assert http.delete(f"/v1/sandboxes/{sid}").status_code == 204
            listed = [s["env_id"] for s in http.get("/v1/envs").json()]
            assert "example/Coin-v0" in listed and "example/CoinMore-v0" in listed
            for env_id in ("example/Coin-v0", "forkyard_example_plugin.unlisted:CoinToo-v0"):
                r = http.post("/v1/envs", json={"env_id": env_id, "seed": 3})
                assert r.status_code == 201, r.text
                assert r.json()["observation"] == "A coin is hidden. Turn 1: peek(). Turn 2: guess(b)."
                step = http.post(f"/v1/envs/{r.json()['session_id']}/step", json={"action": "peek()"})
                assert step.status_code == 200 and step.json()["observation"].startswith("the coin is "), step.text
            r = http.post("/v1/envs", json={"env_id": "example/Broken-v0"})
            assert r.status_code == 404 and "ModuleNotFoundError" in r.text, r.text
            # a client's "module:Id" never makes the server import a module: only the operator's (or a plugin's)
            for env_id in ("forkyard_no_such_module:X-v0", "antigravity:X-v0", "forkyard_example_plugin.other:Coin-v0"):
                r = http.post("/v1/envs", json={"env_id": env_id})
                assert r.status_code == 404 and "never imports a module a client names" in r.text, r.text
    finally:
        proc.terminate()
        proc.wait(60)
    text = log.read_text()
    assert "the plugin 'example/Broken-v0' of forkyard.envs" in text  # named at start-up, and the server ran


def test_the_server_refuses_to_start_without_an_env_module_its_operator_named(tmp_path):
    # one that cannot be imported is a bad setting (exit 2, named), flag and variable alike: never fewer envs served
    for args, env in (["--env-modules", "forkyard_no_such_module"], {}),\
                     ([], {"FORKYARD_ENV_MODULES": "json,forkyard_no_such_module"}):
        r = subprocess.run([sys.executable, "-m", "sandbox_server", "--port", str(free_port()), *args],
                           capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=120)
        assert r.returncode == 2 and "cannot import the env module 'forkyard_no_such_module'" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "sandbox_server", "--env-modules", "not a module"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "not module names" in r.stderr, r.stderr
