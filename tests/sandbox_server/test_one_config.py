"""One server configuration, built once and passed down: the server command (or the caller of ``create_app``)
reads ``ServerSettings`` / ``ServiceConfig`` at start-up, and nothing reads a ``FORKYARD_*`` variable again or
writes one. Real components only: a real uvicorn server over the real local backend, the real server command
in a subprocess, a real node host (in-process, as tests/sandbox_server/test_session_host.py makes one).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from sandbox_server.app import create_app
from sandbox_server.backends import BACKENDS, BackendConfig, Backend, backend_config, make_backend, register_backend
from sandbox_server.settings import ServerSettings, ServiceConfig, corpus_dir
from tests.docker_support import ROOT, SERVER_NAME, UvicornThread, free_port, require_bwrap

#: Packages that run servers and node hosts: none of their modules may write the process environment.
SERVER_PACKAGES = ("sandbox_server", "ray_cluster")
#: Programs of those packages that run inside a sandbox, never in a server: the interpreter's session puts back the
#: environment a copy of it carried (its own, in its own process).
IN_SANDBOX = {"sandbox_server/interpreter_runner.py"}
#: Methods of ``os.environ`` that change it.
ENVIRON_WRITES = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def environ_writes(source: str, filename: str = "<string>") -> list[str]:
    """``file:line what`` of every write to the process environment in ``source``: an assignment, augmented
    assignment or ``del`` of ``os.environ[...]`` (or of ``environ[...]`` imported from os), a call of one of
    :data:`ENVIRON_WRITES` on it, ``os.putenv`` and ``os.unsetenv``."""
    tree = ast.parse(source, filename=filename)

    def is_environ(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "environ":
            return isinstance(node.value, ast.Name) and node.value.id == "os"
        return isinstance(node, ast.Name) and node.id == "environ"

    found = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = list(node.targets) if isinstance(node, ast.Delete) else [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Subscript) and is_environ(sub.value):
                    found.append(f"{filename}:{node.lineno} {type(node).__name__.lower()} of an environ item")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if func.attr in ENVIRON_WRITES and is_environ(func.value):
                found.append(f"{filename}:{node.lineno} environ.{func.attr}()")
            elif func.attr in ("putenv", "unsetenv") and isinstance(func.value, ast.Name) and func.value.id == "os":
                found.append(f"{filename}:{node.lineno} os.{func.attr}()")
    return found


def test_the_scan_sees_every_kind_of_environment_write():
    # The rule below is only as good as the scanner: each of these writes is found, reads are not.
    writes = ("os.environ['A'] = '1'", "os.environ['A'] += '1'", "del os.environ['A']", "os.environ.update(A='1')",
              "os.environ.setdefault('A', '1')", "os.environ.pop('A', None)", "os.putenv('A', '1')",
              "from os import environ\nenviron['A'] = '1'", "def f():\n    os.environ.__setitem__('A', '1')")
    for source in writes:
        assert environ_writes(source), source
    reads = "x = os.environ.get('A')\ny = os.environ['A']\nz = dict(os.environ)\nw = {**os.environ, 'A': '1'}"
    assert environ_writes(reads) == []


def test_no_server_module_writes_the_environment():
    """The settings are passed down, never handed on through ``os.environ`` (the server command wrote every flag
    there; a Ray node host wrote its sandbox label there)."""
    found = [w for pkg in SERVER_PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
             if str(path.relative_to(ROOT)) not in IN_SANDBOX
             for w in environ_writes(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []
    assert environ_writes((ROOT / next(iter(IN_SANDBOX))).read_text())  # the exemption is still needed


def test_the_backend_of_create_app_takes_the_settings_it_was_given(monkeypatch, tmp_path):
    """``create_app(settings=...)`` builds its backend (by name) with those settings: its sandboxes carry the
    settings' server name and show the settings' corpus, whatever the ``FORKYARD_*`` variables say now; and
    nothing reads them again after the app was created (bad values here would raise if anything did)."""
    require_bwrap()
    name = f"{SERVER_NAME}-one-config"
    settings = ServerSettings(server_name=name, backend="local")
    wrong_corpus = tmp_path / "wrong-corpus"
    monkeypatch.setenv("FORKYARD_SERVER_NAME", f"{SERVER_NAME}-wrong")
    monkeypatch.setenv("FORKYARD_CORPUS", str(wrong_corpus))
    monkeypatch.setenv("FORKYARD_BACKEND", "docker")
    monkeypatch.setenv("FORKYARD_LOG_LEVEL", "verbose")  # ServerSettings() would refuse it: nobody may read it
    before = dict(os.environ)
    app = create_app(config=ServiceConfig(min_idle=0, max_total=2), settings=settings)
    srv = UvicornThread(app).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.get("/healthz").json()["status"] == "ok"
            created = http.post("/v1/sandboxes", json={})
            assert created.status_code == 201, created.text
            backend = app.state.service.backend
            assert (backend.name, backend.server_name, backend.server_dir.name) == ("local", name, name)
            assert json.loads((backend.state_dir / "owner.json").read_text())["server_name"] == name
            assert backend.data_dir == os.path.realpath(corpus_dir(settings))
            assert not wrong_corpus.exists()  # the variable's corpus was never built
            listing = http.post(f"/v1/sandboxes/{created.json()['id']}/exec",
                                json={"tool": "ls", "args": {"path": "."}})
            assert listing.status_code == 200 and listing.json()["status"] == "ok", listing.text
            assert http.delete(f"/v1/sandboxes/{created.json()['id']}").status_code == 204
    finally:
        srv.stop()
    assert dict(os.environ) == before


def test_backend_configs_take_the_given_settings_and_read_no_variable(monkeypatch):
    """The config models' defaults are the plain defaults of the settings' fields (one source, no variable read);
    ``settings`` fills what they hold; ``options`` win over both; a plugin's own config gets ``server_name``."""
    monkeypatch.setenv("FORKYARD_SERVER_NAME", "from-the-variable")
    monkeypatch.setenv("FORKYARD_SANDBOX_IMAGE", "from-the-variable:1")
    defaults = backend_config("docker")
    assert (defaults.server_name, defaults.image) == (ServerSettings.model_fields["server_name"].default,
                                                      ServerSettings.model_fields["sandbox_image"].default)
    given = ServerSettings(server_name="srv", sandbox_image="img:2", corpus="/srv/corpus")
    docker = backend_config("docker", settings=given)
    assert (docker.server_name, docker.image) == ("srv", "img:2")
    assert backend_config("docker", settings=given, image="mine:3").image == "mine:3"
    local = backend_config("local", settings=given)
    assert (local.server_name, local.corpus, local.data_dir) == ("srv", "/srv/corpus", None)

    class PluginConfig(BackendConfig):  # a third-party backend: a BackendConfig of its own, no image, no corpus
        type: str = "test-one-config"

        def build(self) -> Backend:
            raise NotImplementedError

    register_backend(PluginConfig)
    try:
        assert backend_config("test-one-config", settings=given).server_name == "srv"
    finally:
        BACKENDS.pop("test-one-config", None)


def test_make_backend_without_settings_reads_them_once_at_that_call(monkeypatch):
    """A library caller that holds no settings: ``ServerSettings()`` read where the backend is made."""
    require_bwrap()
    name = f"{SERVER_NAME}-one-config-lib"
    monkeypatch.setenv("FORKYARD_SERVER_NAME", name)
    backend = make_backend("local")
    try:
        assert backend.server_name == name
    finally:
        backend.close()


#: Runs the server command in-process and prints what changed in its environment once it has stopped.
DRIVER = """
import json, os, sys
before = dict(os.environ)
from sandbox_server.__main__ import main
rc = main(sys.argv[1:])
after = dict(os.environ)
changed = {k: [before.get(k), after.get(k)] for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)}
print("ENVIRONMENT CHANGES " + json.dumps(changed), flush=True)
sys.exit(rc)
"""


@pytest.mark.parametrize("extra", [["--no-sandboxes"], ["--backend", "local", "--min-idle", "0", "--max-total", "2"]],
                         ids=["env sessions", "local pool"])
def test_the_server_command_runs_on_its_flags_and_writes_no_variable(extra):
    """Flags given over bad variables: the server runs on the flags (nothing reads the variables again), its
    sandboxes carry the variable's server name (no flag for it), and after a clean stop its environment is
    what it was."""
    pool = "--backend" in extra
    if pool:
        require_bwrap()
    port = free_port()
    name = f"{SERVER_NAME}-one-config-cmd"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKYARD_")}
    env.update(PYTHONPATH=str(ROOT), FORKYARD_SERVER_NAME=name, FORKYARD_PORT="abc", FORKYARD_LOG_LEVEL="verbose",
               FORKYARD_ALLOWED_HOSTS="", **({"FORKYARD_BACKEND": "nope", "FORKYARD_MIN_IDLE": "-1"} if pool else {}))
    argv = [sys.executable, "-c", DRIVER, *extra, "--port", str(port), "--log-level", "warning",
            "--allowed-hosts", "forkyard.test"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the server exited {proc.returncode}: {proc.stdout.read()[-2000:]}"
            assert time.monotonic() < deadline, "the server did not answer within 60 s"
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=30) as http:
            # --allowed-hosts reached the app (the variable said none): a request for that name is served
            assert http.get("/healthz", headers={"Host": "forkyard.test"}).status_code == 200
            assert http.get("/healthz", headers={"Host": "other.test"}).status_code != 200
            if pool:
                pool_state = http.get("/v1/pool").json()
                assert (pool_state["backend"], pool_state["min_idle"], pool_state["max_total"]) == ("local", 0, 2)
                created = http.post("/v1/sandboxes", json={})
                assert created.status_code == 201, created.text
                assert http.delete(f"/v1/sandboxes/{created.json()['id']}").status_code == 204
        proc.send_signal(signal.SIGINT)  # a clean stop: main returns, and the driver reports
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, out[-2000:]
    changes = [line for line in out.splitlines() if line.startswith("ENVIRONMENT CHANGES ")]
    assert changes and json.loads(changes[-1].removeprefix("ENVIRONMENT CHANGES ")) == {}, out[-2000:]


def test_a_node_host_labels_its_process_providers_without_the_environment(monkeypatch):
    """A Ray node host (made in-process here: the same class a Ray actor runs) makes the shared providers of its
    process with ``<server name>-<node name>`` and writes nothing to the environment; its shutdown gives the
    process its settings back."""
    require_bwrap()
    from ray_cluster.nodes import NodeHost
    from sandbox_server.embedded import shared_provider, shared_settings
    from sandbox_server.shared_providers import close_shared_provider

    backend = "local"
    close_shared_provider(backend)  # one made earlier in this process would keep the label it was made with
    before = dict(os.environ)
    server = f"{SERVER_NAME}-one-config-ray"
    host = NodeHost("n1", capacity=2, server_name=server, backend=backend)
    try:
        assert dict(os.environ) == before
        assert shared_settings().server_name == f"{server}-n1"
        info = host.sandbox("create")
        made = shared_provider(backend).backend
        assert (made.server_name, made.server_dir.name) == (f"{server}-n1", f"{server}-n1")
        host.sandbox("delete", info.id)
    finally:
        host.shutdown()  # closes this process's shared providers too
    assert dict(os.environ) == before
    assert shared_settings().server_name == os.environ["FORKYARD_SERVER_NAME"]  # the variable again
