"""The import graph keeps the layers apart: envs know no service, the service knows envs only by
their public API, the in-sandbox files are stdlib-only, all Ray code is in ``ray_cluster`` (which no other
package imports: they reach it through entry points), and no package imports another in a cycle.

Every ``import`` statement counts, including those inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("envs", "sandbox_server", "trainer", "ray_cluster")
#: The layers below the Ray package: none of them imports it or names it in code, and none imports ``ray``.
LAYERS = ("envs", "sandbox_server", "trainer")


def imports_of(path: Path) -> set[str]:
    """Absolute module names imported anywhere in ``path`` (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def module_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@functools.cache  # the sources do not change during a session: parsed once for the module's tests (read only)
def graph() -> dict[str, set[str]]:
    """``{module file (relative): imported modules}`` for every module of the packages."""
    return {str(p.relative_to(ROOT)): imports_of(p) for pkg in PACKAGES for p in module_files(pkg)}


def test_the_walker_sees_lazy_and_relative_imports(tmp_path):
    # The rules below are only as good as the walker: it must see imports inside functions.
    found = imports_of(ROOT / "envs" / "sandbox.py")
    assert "importlib.metadata" in found
    assert "omegaconf" in imports_of(ROOT / "envs" / "skyrl.py")  # imported inside a function there
    assert any(m.startswith("envs.") for m in imports_of(ROOT / "envs" / "fileqa.py"))


def test_envs_import_neither_the_service_nor_the_trainer():
    bad = {f: sorted(m for m in mods if m.split(".")[0] in ("sandbox_server", "trainer"))
           for f, mods in graph().items() if f.startswith("envs/")}
    assert {f: m for f, m in bad.items() if m} == {}


#: What the service may use of envs: the package (the registry) and its public protocol modules (the API key
#: and the retry policy are the wire's, shared by the server and every client; the plugin loader is every
#: registry's, the server's backends included).
ENVS_PUBLIC = {"envs", "envs.core", "envs.sandbox", "envs.api_key", "envs.client_retry",  # envs.wire: the answers,
               "envs.wire", "envs.session_client",  # one model for both; session_client: ClusterEnv is its shim
               "envs.plugins", "envs.errors"}


def test_the_service_uses_envs_only_through_their_public_api_and_never_the_trainer():
    bad = {}
    for f, mods in graph().items():
        if not f.startswith("sandbox_server/"):
            continue
        wrong = sorted(m for m in mods if m.split(".")[0] == "trainer"
                       or (m.split(".")[0] == "envs" and m not in ENVS_PUBLIC
                           and m.rsplit(".", 1)[0] not in ENVS_PUBLIC - {"envs"}))
        if wrong:
            bad[f] = wrong
    assert bad == {}


def test_the_trainer_reaches_the_service_only_to_start_it():
    # cli.py starts the server; the Ray rollout workers (the service's node hosts) are ray_cluster's.
    users = {f: sorted(m for m in mods if m.startswith("sandbox_server"))
             for f, mods in graph().items() if f.startswith("trainer/")}
    assert {f: m for f, m in users.items() if m} == {
        "trainer/cli.py": ["sandbox_server.__main__", "sandbox_server.__main__.main"]}


def test_the_text_policy_package_imports_one_way():
    """trainer/text/: each module imports only those before it in ``trainer.text.IMPORT_ORDER``; the trainer's core
    imports nothing of it but the command line (cli.py registers text_cli) and the run plots (plot.py: monitors)."""
    from trainer.text import IMPORT_ORDER

    assert sorted(IMPORT_ORDER) == sorted(p.stem for p in (ROOT / "trainer" / "text").glob("*.py")
                                          if p.stem != "__init__")
    for i, name in enumerate(IMPORT_ORDER):
        used = {m.split(".")[2] for m in graph()[f"trainer/text/{name}.py"] if m.startswith("trainer.text.")}
        assert used <= set(IMPORT_ORDER[:i]), f"trainer.text.{name} imports {sorted(used - set(IMPORT_ORDER[:i]))}"
    core = {f: sorted({".".join(m.split(".")[:3]) for m in mods if m.startswith("trainer.text.")})
            for f, mods in graph().items() if f.startswith("trainer/") and not f.startswith("trainer/text/")}
    assert {f: m for f, m in core.items() if m} == {"trainer/cli.py": ["trainer.text.text_cli"],
                                                   "trainer/plot.py": ["trainer.text.monitors"]}


def test_no_layer_imports_the_ray_package_or_ray_itself():
    """envs, sandbox_server and trainer import neither ``ray_cluster`` (not even lazily) nor ``ray``: Ray runs are
    plugins of the entry-point groups ``forkyard.collectors`` and ``forkyard.sandbox_providers``."""
    bad = {f: sorted(m for m in mods if m.split(".")[0] in ("ray_cluster", "ray"))
           for f, mods in graph().items() if f.split("/")[0] in LAYERS}
    assert {f: m for f, m in bad.items() if m} == {}
    assert any(m == "ray" or m.startswith("ray.") for f, mods in graph().items() if f.startswith("ray_cluster/")
               for m in mods)  # the walker sees ray_cluster's own (lazy) imports of ray


def test_the_training_loop_imports_nothing_of_ray_and_finds_the_ray_collector_by_name():
    loop = imports_of(ROOT / "trainer" / "loop.py")
    assert not [m for m in loop if m.split(".")[0] in ("ray", "ray_cluster")]
    assert "trainer.collectors" in loop
    import importlib.metadata

    from trainer.collectors import COLLECTOR_GROUP, collector_names, get_collector

    assert {"local", "ray"} <= set(collector_names())
    assert [ep.value for ep in importlib.metadata.entry_points(group=COLLECTOR_GROUP) if ep.name == "ray"] == [
        "ray_cluster.collector:ray_collector"]
    from ray_cluster.collector import ray_collector

    assert get_collector("ray") is ray_collector


AGENT_MODULES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "sandbox_server" / "agent").glob("*.py"))


@pytest.mark.parametrize("name", [*AGENT_MODULES, "sandbox_server/corpus.py"])
def test_files_copied_into_the_sandbox_image_use_the_standard_library_only(name):
    """corpus.py and every module of the agent package (one zipapp in the sandbox) import only the standard
    library and, for the agent, its own package, by relative imports (the package is ``forkyard_agent``
    inside the zipapp, so ``sandbox_server`` is not there to import)."""
    path = ROOT / name
    mods = imports_of(path)
    own = "sandbox_server.agent"
    outside = sorted(m for m in mods if m.split(".")[0] not in sys.stdlib_module_names and m != "__future__"
                     and not m.startswith("__future__.") and not (name in AGENT_MODULES and m.startswith(own)))
    absolute = sorted(ast.dump(n) for n in ast.walk(ast.parse(path.read_text()))
                      if (isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").startswith(own))
                      or (isinstance(n, ast.Import) and any(a.name.startswith(own) for a in n.names)))
    assert outside == [] and absolute == []
    assert len(AGENT_MODULES) > 5  # the package is found (one module per concern)


def test_no_import_cycle_between_packages():
    edges = {pkg: set() for pkg in PACKAGES}
    for f, mods in graph().items():
        src = f.split("/")[0]
        edges[src].update(m.split(".")[0] for m in mods if m.split(".")[0] in PACKAGES and m.split(".")[0] != src)
    assert edges == {"envs": set(), "sandbox_server": {"envs"}, "trainer": {"envs", "sandbox_server"},
                     "ray_cluster": {"envs", "sandbox_server", "trainer"}}


def test_long_modules_state_why():
    """No module over 400 lines without a reason at its top (a docstring line starting ``Why one file:``)."""
    long = []
    for pkg in PACKAGES:
        for p in module_files(pkg):
            text = p.read_text()
            if text.count("\n") > 400 and "Why one file:" not in (ast.get_docstring(ast.parse(text)) or ""):
                long.append(f"{p.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert long == []


def test_every_reference_can_be_opened_by_a_reader_of_the_repo():
    """Code, tests and docs cite papers by name and arXiv id and docs by path: never an issue number of a
    tracker the reader cannot see, nor an unnamed source article."""
    import subprocess

    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml", "*.yaml", "*.sh", "Makefile"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"\bissues? #?\d+|" + "seed" + r"\s+article", re.IGNORECASE)  # split: not a hit itself
    found = [f"{f}:{n}" for f in files if not f.startswith("docker/vendor/") and (ROOT / f).exists()  # not deleted
             for n, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1) if pattern.search(line)]
    assert found == []


def string_modules(package: str, pattern: re.Pattern[str]) -> list[str]:
    """The string constants of ``package``'s modules that name a module as ``pattern`` matches them whole
    (``"pkg.mod"``, ``"pkg.mod:attr"``: an import by name the walker cannot see); docstrings never match."""
    found = []
    for p in module_files(package):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value.strip()):
                found.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def test_envs_name_no_server_or_trainer_module_in_a_string_either():
    """An entry point written as a string (``"sandbox_server.embedded:shared_provider"``) is an import the walker
    cannot see: envs reach the server's provider factory through the ``forkyard.sandbox_providers`` entry-point
    group of the installed metadata (``pyproject.toml``), never by naming it."""
    assert string_modules("envs", re.compile(r"^(sandbox_server|trainer)(\.\w+)*(:\w+)?$")) == []
    import importlib.metadata

    from envs.sandbox import PROVIDER_GROUP
    assert [ep.value for ep in importlib.metadata.entry_points(group=PROVIDER_GROUP) if ep.name == "default"] == [
        "sandbox_server.embedded:shared_provider"]


def test_no_layer_names_the_ray_package_in_a_string_and_the_server_finds_its_provider_by_name():
    """The server and the trainer reach ``ray_cluster`` only through the entry points of ``pyproject.toml``."""
    named = re.compile(r"^ray_cluster(\.\w+)*(:\w+)?$")
    assert [s for pkg in LAYERS for s in string_modules(pkg, named)] == []
    import importlib.metadata

    from envs.sandbox import PROVIDER_GROUP, _factory
    from ray_cluster.sandboxes import RayProvider

    assert [ep.value for ep in importlib.metadata.entry_points(group=PROVIDER_GROUP) if ep.name == "ray"] == [
        "ray_cluster.sandboxes:RayProvider"]
    assert _factory("ray") is RayProvider


#: The modules that raise or read HTTP errors: the routes and the HTTP contract (the one table from domain errors
#: to answers).
HTTP_EDGE = ("sandbox_server/routes/", "sandbox_server/http_contract.py")


def test_no_status_code_below_the_routes():
    """The session core, the service and the Ray node hosts raise domain errors (``envs.errors``,
    ``sandbox_server.errors``); only the edge translates them to HTTP."""
    http = {"fastapi.HTTPException", "starlette.exceptions.HTTPException", "fastapi.exceptions.HTTPException"}
    bad = {f: sorted(m & http) for f, m in graph().items()
           if f.startswith(("sandbox_server/", "ray_cluster/")) and not f.startswith(HTTP_EDGE) and m & http}
    assert bad == {}


def test_every_python_parse_goes_through_the_one_locked_parser():
    """CPython 3.11's AST constructor keeps its recursion depth in state shared by threads (CPython gh-106905):
    a Ray collector's FileQA envs parsing the corpus at once raised ``SystemError``. So no shipped module calls
    ``ast.parse`` (or ``compile`` to an AST) but :func:`envs.actions.parse_python`, which holds one lock. The
    interpreter family's runner is exempt: a program of its own in the sandbox, one thread, never imported here."""
    calls = {}
    for pkg in PACKAGES + ("benchmarks", "experiments"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "parse" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "ast"):
                    calls.setdefault(rel, []).append(node.lineno)
    assert calls.pop("sandbox_server/interpreter_runner.py", None) is not None  # the in-sandbox program
    assert list(calls) == ["envs/actions.py"] and len(calls["envs/actions.py"]) == 1, calls
