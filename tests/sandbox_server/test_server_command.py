"""The one server command (``python -m sandbox_server``, ``forkyard serve``): every flag reaches the running
server, ``forkyard serve`` is the same command, options that would have no effect are refused; and the app
it serves documents each model once (no module-qualified schema names)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from sandbox_server.app import create_app, create_env_app
from tests.docker_support import ROOT, SERVER_NAME, free_port, require_bwrap

FORKYARD = str(ROOT / ".venv" / "bin" / "forkyard")


class Server:
    """A server command as a subprocess on a free port, without FORKYARD_* settings in its environment
    (the flags alone decide), stopped with SIGTERM."""

    def __init__(self, argv: list[str], name: str, **settings: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORKYARD_")}
        env.update(PYTHONPATH=str(ROOT), FORKYARD_SERVER_NAME=f"{SERVER_NAME}-{name}", **settings)
        self.proc = subprocess.Popen([*argv, "--port", str(self.port), "--log-level", "warning"], env=env, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"{argv} exited {self.proc.returncode}: {self.proc.stdout.read()[-2000:]}"
            assert time.monotonic() < deadline, f"{argv} did not answer within 60 s"
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM; returns the exit status (uvicorn shuts down, then lets the signal end the process: -15)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)


@pytest.mark.parametrize("command", [[sys.executable, "-m", "sandbox_server"], [FORKYARD, "serve"]],
                         ids=["python -m sandbox_server", "forkyard serve"])
def test_backend_and_pool_flags_reach_the_running_server(command):
    require_bwrap()
    srv = Server([*command, "--backend", "local", "--min-idle", "1", "--max-total", "3"], "cmd-pool",
                 FORKYARD_ACQUIRE_TIMEOUT_S="1")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.get("/healthz").json()["backend"] == "local"
            pool = http.get("/v1/pool").json()
            assert (pool["backend"], pool["min_idle"], pool["max_total"]) == ("local", 1, 3), pool
            held = [http.post("/v1/sandboxes", json={}) for _ in range(4)]
            assert [r.status_code for r in held].count(201) == 3, [r.text for r in held]  # --max-total holds
            assert held[-1].status_code == 503
            for r in held[:3]:
                assert http.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
    finally:
        assert srv.stop() in (0, -signal.SIGTERM)


def test_no_sandboxes_serves_env_sessions_alone():
    srv = Server([sys.executable, "-m", "sandbox_server", "--no-sandboxes"], "cmd-envs")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            health = http.get("/healthz").json()
            assert (health["status"], health["env_sessions"], health["env_session_counts"]["groups"]) == ("ok", 0, [])
            assert http.get("/v1/pool").status_code == 404 and http.post("/v1/sandboxes", json={}).status_code == 404
            r = http.post("/v1/envs", json={"env_id": "forkyard/ClueProbe-v0", "seed": 0})
            assert r.status_code == 201 and http.get("/healthz").json()["env_sessions"] == 1
            fileqa = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0"})
            assert fileqa.status_code == 422 and "no sandbox service" in fileqa.json()["detail"]
    finally:
        assert srv.stop() in (0, -signal.SIGTERM)


@pytest.mark.parametrize("args, says", [
    (["--no-sandboxes", "--max-total", "3"], "--max-total"),
    (["--no-sandboxes", "--backend", "local"], "--backend"),
    (["--no-sandboxes", "--unsafe-no-isolation"], "--unsafe-no-isolation"),
    (["--backend", "docker", "--unsafe-no-isolation"], "local backend only"),
    (["--backend", "nope"], "accepted values: docker, local"),
    (["--ray", "auto", "--backend", "docker"], "--ray puts the sandboxes on the cluster's nodes"),
    (["--ray", "auto", "--min-idle", "1"], "--min-idle"),
    (["--ray", "auto", "--no-sandboxes"], "choose one"),
])
def test_options_without_an_effect_are_refused(args, says):
    for command in ([sys.executable, "-m", "sandbox_server"], [FORKYARD, "serve"]):
        r = subprocess.run([*command, *args, "--port", str(free_port())], cwd=ROOT, capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 2 and says in r.stderr, (command, r.stderr)


def _refusal(args: list[str], **settings: str) -> str:
    """Run the server command with ``args`` and ``settings`` (no other FORKYARD_* variable); it must exit 2 at
    once, without a traceback. Returns its last line of stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKYARD_")}
    r = subprocess.run([sys.executable, "-m", "sandbox_server", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env={**env, "PYTHONPATH": str(ROOT), **settings})
    assert r.returncode == 2 and "Traceback" not in r.stderr, (args, settings, r.stderr[-2000:])
    return r.stderr.strip().splitlines()[-1]


#: (field, a refused value): every setting the command also takes as a flag
FLAG_REFUSALS = [("log_level", "warn"), ("log_level", "verbose"), ("port", "70000"), ("backend", "nope"),
                 ("min_idle", "-1"), ("max_total", "many")]  # more of each: tests/sandbox_server/test_settings.py


@pytest.mark.parametrize("field,value", FLAG_REFUSALS, ids=[f"{f}={v!r}" for f, v in FLAG_REFUSALS])
def test_a_bad_setting_reads_the_same_as_flag_and_as_variable(field, value):
    """Field case S33: ``--log-level warn`` and ``FORKYARD_LOG_LEVEL=warn`` (it crashed with uvicorn's
    KeyError), and the same for every flag: exit 2 with one message naming the flag and the variable."""
    flag, var = "--" + field.replace("_", "-"), f"FORKYARD_{field.upper()}"
    by_flag = _refusal([flag, value])
    assert by_flag == _refusal([], **{var: value})
    assert f"{flag} / {var}: " in by_flag and repr(value) in by_flag
    if field == "log_level":
        assert all(repr(level) in by_flag for level in ("critical", "error", "warning", "info", "debug", "trace"))


@pytest.mark.parametrize("var,value", [("FORKYARD_IDLE_TTL_S", "inf"), ("FORKYARD_MAX_BODY_BYTES", "0"),
                                       ("FORKYARD_SNAPSHOT_KEY", "not-a-fernet-key")])
def test_a_bad_variable_without_a_flag_is_refused_before_the_server_starts(var, value):
    said = _refusal([], **{var: value})
    assert f"{var}: " in said
    assert (value not in said) if var == "FORKYARD_SNAPSHOT_KEY" else (repr(value) in said)


def test_every_bad_setting_is_named_at_once():
    said = _refusal(["--port", "abc"], FORKYARD_LOG_LEVEL="verbose", FORKYARD_IDLE_TTL_S="-1")
    assert all(name in said for name in ("--port / FORKYARD_PORT", "--log-level / FORKYARD_LOG_LEVEL",
                                         "FORKYARD_IDLE_TTL_S"))


def test_forkyard_serve_is_the_server_command():
    """Same options and help: ``forkyard serve`` hands its arguments to ``sandbox_server.__main__.main``."""
    mod = subprocess.run([sys.executable, "-m", "sandbox_server", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    cli = subprocess.run([FORKYARD, "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert mod.returncode == cli.returncode == 0
    options = [line.split()[0] for line in mod.stdout.split("options:")[1].splitlines() if line.startswith("  -")]
    assert options == [line.split()[0] for line in cli.stdout.split("options:")[1].splitlines()
                       if line.startswith("  -")]
    assert {"--backend", "--no-sandboxes", "--unsafe-no-isolation", "--min-idle", "--max-total", "--host", "--port",
            "--log-level", "--ray"} <= set(options)
    # --ray reaching a running server: tests/ray_cluster/test_ray.py (its "front" scenario serves FileQA sessions
    # through `python -m sandbox_server --ray auto` in front of a simulated cluster).


def test_openapi_schema_names_each_model_once():
    """Every model is declared once (``sandbox_server.models``), so no schema name is module-qualified
    (FastAPI writes ``module__Name`` when two classes share a name)."""
    for app in (create_app(backend="local"), create_env_app()):
        names = list(app.openapi()["components"]["schemas"])
        assert [n for n in names if "__" in n] == [], names
        assert "ForkRequest" in names and "ErrorBody" in names


@pytest.mark.parametrize("extra", [[], ["--backend", "local"]], ids=["env sessions", "local pool"])
def test_a_flag_wins_over_a_bad_variable_everywhere(extra):
    """``--port`` / ``--log-level`` / ``--backend`` given: the variables they replace are never read again,
    however bad (the app, the backends and the corpus read the settings later, field case S33)."""
    if extra:
        require_bwrap()
    argv = [sys.executable, "-m", "sandbox_server", *(extra or ["--no-sandboxes"])]
    srv = Server(argv, "cmd-flag-wins", FORKYARD_PORT="abc", FORKYARD_LOG_LEVEL="verbose",
                 **({"FORKYARD_BACKEND": "nope", "FORKYARD_MIN_IDLE": "0"} if extra else {}))
    try:
        assert httpx.get(f"{srv.url}/healthz", timeout=10).status_code == 200
    finally:
        assert srv.stop() in (0, -signal.SIGTERM)
