"""The HTTP API keeps its contract (field cases S14, S15, S16, S19, S20, S21, S25, S29), on real uvicorn
servers on loopback: one documented error shape for every error status, strict types, bodies over the
limit refused before they are read, failed requests that keep nothing, env kwargs never silently
dropped, factory arguments honoured, FileQA sessions on the server's own sandbox service."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import gymnasium as gym
import httpx
import pytest

import envs
from envs.core import Outcome, TextEnv
from sandbox_server.app import create_app
from sandbox_server.backends import DockerBackend, LocalBackend
from sandbox_server.app import create_env_app
from sandbox_server.env_sessions import GYM_MAKE_KEYWORDS
from sandbox_server.models import ErrorBody
from sandbox_server.service import SandboxService, ServiceConfig
from tests.docker_support import (
    ROOT, SERVER_NAME, UvicornThread, free_port, leftover_containers, require_bwrap, require_docker,
)

CLUE = "forkyard/ClueProbe-v0"


# ---------------------------------------------------------------------------------------------- helpers
def assert_error_body(resp: httpx.Response, status: int, says: str = "") -> dict:
    """The response is ``status`` with exactly the documented ErrorBody (a string detail)."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"detail", "status"}, body
    assert isinstance(body["detail"], str) and isinstance(body["status"], str), body
    ErrorBody.model_validate(body)
    assert says in body["detail"], body
    if status == 503:
        assert int(resp.headers["Retry-After"]) >= 1
    return body


class RawConnection:
    """One keep-alive HTTP/1.1 connection on a plain socket: a closed connection is seen, not hidden
    by a client that reconnects."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        self.sock.sendall(head + data)
        return self.read_response()

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection mid-body")
            self.buf += chunk
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def close(self) -> None:
        self.sock.close()


class BoomEnv(TextEnv):
    """A test env whose code raises where ``boom`` says (``init``, ``reset``, ``step``, ``fork``);
    ``open_envs`` counts instances not closed, so a half-made session shows."""

    open_envs = 0
    max_observation_length = 256
    max_action_length = 64

    def __init__(self, boom: str = "", max_turns: int = 3):
        super().__init__(max_turns=max_turns, kwargs={"boom": boom, "max_turns": max_turns})
        self.boom = boom
        if boom == "init":
            raise RuntimeError("kaboom in __init__")
        self._open = True
        BoomEnv.open_envs += 1

    def _reset_task(self, options):
        if self.boom == "reset" or (options or {}).get("boom"):
            raise RuntimeError("kaboom in reset")
        return "Say anything."

    def _act(self, call):
        if self.boom == "step":
            raise KeyError("kaboom in step")
        return Outcome(observation="ok")

    def _fork_into(self, children):
        if self.boom == "fork":
            raise RuntimeError("kaboom in fork")
        for c in children:
            c._open = True
        BoomEnv.open_envs += len(children)

    def close(self):
        if getattr(self, "_open", False):
            self._open = False
            BoomEnv.open_envs -= 1


BOOM = "test/Boom-v0"


@pytest.fixture
def boom_env():
    """BoomEnv registered as a forkyard env (Gymnasium's registry, which the server reads), removed afterwards."""
    envs.register_env(BOOM, f"{__name__}:BoomEnv")
    BoomEnv.open_envs = 0
    yield
    gym.envs.registry.pop(BOOM, None)


@pytest.fixture
def env_app_server():
    """A factory of env-only servers (stopped at the end)."""
    started = []

    def start(**kw):
        app = create_env_app(**kw)
        srv = UvicornThread(app).start()
        started.append(srv)
        return app, srv

    yield start
    for srv in started:
        srv.stop()


def local_service(data, kind: str = "local", **cfg) -> SandboxService:
    """A service over an isolated local backend (skipped, or failed in CI, without bubblewrap), or over
    docker with ``kind="docker"`` (skipped, or failed in CI, without an engine)."""
    base = dict(min_idle=1, max_total=4, acquire_timeout_s=1.0, default_timeout_s=5, max_timeout_s=10)
    if kind == "docker":
        require_docker()
        backend = DockerBackend(server_name=f"{SERVER_NAME}-contract", data_dir=data)
    else:
        require_bwrap()
        backend = LocalBackend(data, server_name=f"{SERVER_NAME}-contract")
    return SandboxService(backend, ServiceConfig(**{**base, **cfg}))


@pytest.fixture(scope="module")
def full_server(fixture_data):
    """The full app (sandbox routes + env routes) over its own local-backend service."""
    svc = local_service(fixture_data)
    app = create_app(service=svc)
    srv = UvicornThread(app).start()
    yield app, srv, svc
    srv.stop()


@pytest.fixture
def http(full_server):
    with httpx.Client(base_url=full_server[1].url, timeout=30) as c:
        yield c


# ----------------------------------------------------------------------------------------- S15: schema
def _spec_errors(spec: dict) -> list[str]:
    problems = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for code, resp in op["responses"].items():
                if code[0] in "45":
                    schema = resp.get("content", {}).get("application/json", {}).get("schema", {})
                    if schema.get("$ref") != "#/components/schemas/ErrorBody":
                        problems.append(f"{method} {path} {code}: {resp}")
    return problems


def test_s15_openapi_documents_one_error_shape_and_every_status(full_server, env_app_server):
    _, srv, _ = full_server
    spec = httpx.get(f"{srv.url}/openapi.json").json()
    _, env_srv = env_app_server()
    env_spec = httpx.get(f"{env_srv.url}/openapi.json").json()
    for s in (spec, env_spec):
        assert _spec_errors(s) == []
        assert "HTTPValidationError" not in json.dumps(s)
        assert s["components"]["schemas"]["ErrorBody"]["properties"]["detail"]["type"] == "string"
    codes = {(m.upper(), p): set(op["responses"]) for p, ops in spec["paths"].items() for m, op in ops.items()}
    assert {"404", "413", "422", "503"} <= codes[("POST", "/v1/sandboxes/{sandbox_id}/exec")]
    assert {"404", "422", "503"} <= codes[("POST", "/v1/snapshots/{snapshot_id}/clone")]
    assert {"404", "409", "413", "422", "503"} <= codes[("POST", "/v1/envs/{session_id}/step")]
    assert {"404", "413", "422", "503"} <= codes[("POST", "/v1/envs")]
    assert {"404", "422", "503"} <= codes[("POST", "/v1/envs/{session_id}/fork")]
    assert "404" in codes[("GET", "/v1/envs/{session_id}")] and "404" in codes[("DELETE", "/v1/envs/{session_id}")]
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"] and metrics["text/plain"]["schema"]["type"] == "string"
    # one ForkRequest, strict: n is an integer and unknown fields are refused
    fork = spec["components"]["schemas"]["ForkRequest"]
    assert fork["properties"]["n"]["type"] == "integer" and fork["additionalProperties"] is False
    fork_refs = {spec["paths"][p]["post"]["requestBody"]["content"]["application/json"]["schema"].get("$ref")
                 or str(spec["paths"][p]["post"]["requestBody"]["content"]["application/json"]["schema"])
                 for p in ("/v1/sandboxes/{sandbox_id}/fork", "/v1/envs/{session_id}/fork")}
    assert all("ForkRequest" in r for r in fork_refs)


def _session(http) -> str:
    r = http.post("/v1/envs", json={"env_id": CLUE, "seed": 0})
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


@pytest.mark.parametrize("route, body", [
    ("exec", {"tool": 5, "args": []}),
    ("exec", {"tool": "cat", "args": {"path": "a.txt"}, "timeout_s": True}),
    ("exec", {"tool": "cat", "args": {"path": "a.txt"}, "extra": 1}),
    ("fork", {"n": True}),
    ("fork", {"n": 2.0}),
    ("fork", {"n": "2"}),
    ("clone", {"n": True}),
    ("snapshot", {"ttl_s": True}),
    ("create", {"cwd": 5}),
    ("create", {"metadata": {"k": "\ud800"}}),
    ("files", {"files": {"a": "x"}, "encoding": "latin-1"}),
    ("env_create", {"env_id": CLUE, "seed": True}),
    ("env_create", {"env_id": CLUE, "seed": 1.0}),
    ("env_create", {"env_id": CLUE, "seeds": 1}),
    ("env_reset", {"seed": True}),
    ("env_fork", {"n": True}),
    ("env_step", {"action": 5}),
    ("env_step", {"action": "probe(\ud800)"}),
])
def test_s15_strict_types_and_one_error_shape(http, route, body):
    sb = http.post("/v1/sandboxes", json={}).json()["id"]
    snap = http.post(f"/v1/sandboxes/{sb}/snapshot", json={}).json()["id"]
    sid = _session(http)
    url = {"exec": f"/v1/sandboxes/{sb}/exec", "fork": f"/v1/sandboxes/{sb}/fork",
           "clone": f"/v1/snapshots/{snap}/clone", "snapshot": f"/v1/sandboxes/{sb}/snapshot",
           "create": "/v1/sandboxes", "files": f"/v1/sandboxes/{sb}/files",
           "env_create": "/v1/envs", "env_reset": f"/v1/envs/{sid}/reset", "env_fork": f"/v1/envs/{sid}/fork",
           "env_step": f"/v1/envs/{sid}/step"}[route]
    try:
        before = (len(http.get("/v1/sandboxes").json()["sandboxes"]), http.get(f"/v1/envs/{sid}").json())
        method = "PUT" if route == "files" else "POST"
        data = json.dumps(body).encode()  # (json.dumps writes a lone surrogate as its \\ud800 escape)
        resp = http.request(method, url, content=data, headers={"content-type": "application/json"})
        assert_error_body(resp, 422)
        assert (len(http.get("/v1/sandboxes").json()["sandboxes"]), http.get(f"/v1/envs/{sid}").json()) == before
    finally:
        http.delete(f"/v1/sandboxes/{sb}")
        http.delete(f"/v1/envs/{sid}")


@pytest.mark.parametrize("path", ["/v1/sandboxes", "/v1/envs"])
@pytest.mark.parametrize("content, says", [
    (b"{not json", "malformed JSON"),
    (b'{"env_id": "forkyard/ClueProbe-v0", "metadata": {"x": NaN}, "options": {"x": NaN}}', "not a JSON number"),
    (b'{"env_id": "forkyard/ClueProbe-v0", "metadata": {"x": [1e400]}, "kwargs": {"x": [1e400]}}', "not a JSON number"),
    (b'{"env_id": "\xff\xfe"}', "could not be parsed"),  # not UTF-8: FastAPI's own 400, answered 422
    (b"[" * 5000 + b"]" * 5000, ""),                        # nested past the parser's depth
])
def test_s15_malformed_json_is_422_with_the_error_body(http, path, content, says):
    resp = http.post(path, content=content, headers={"content-type": "application/json"})
    assert_error_body(resp, 422, says)


def test_s15_unknown_routes_and_methods_answer_the_error_body(http):
    assert_error_body(http.get("/v1/nope"), 404)
    resp = http.put("/v1/sandboxes")
    assert_error_body(resp, 405)
    assert resp.headers["allow"]
    assert_error_body(http.get("/v1/sandboxes/nope"), 404, "nope")
    assert_error_body(http.post("/v1/envs/nope/step", json={"action": "probe(0)"}), 404, "no env session")


# ---------------------------------------------------------------------------------------- S14: kwargs
@pytest.mark.parametrize("kwargs, names", [
    ({"max_turns": 5, "max_episode_steps": 2}, "max_episode_steps"),
    *[({kw: True}, kw) for kw in sorted(GYM_MAKE_KEYWORDS)],  # max_episode_steps, autoreset, ...
    ({"foo": 1}, "foo"),
    ({"max_turns": True}, "max_turns"),
    ({"max_turns": 3.0}, "max_turns"),
    ({"bits": "3"}, "bits"),
    ({"server_url": "http://x"}, "server_url"),
    ({"render_mode": "human"}, "render_mode"),
])
def test_s14_kwargs_are_honoured_or_refused_never_dropped(http, full_server, kwargs, names):
    held = len(full_server[0].state.env_sessions)
    resp = http.post("/v1/envs", json={"env_id": CLUE, "kwargs": kwargs, "seed": 0})
    assert_error_body(resp, 422, names)
    assert len(full_server[0].state.env_sessions) == held


def test_s14_env_kwargs_that_are_taken_are_honoured(http):
    r = http.post("/v1/envs", json={"env_id": CLUE, "kwargs": {"max_turns": 2, "render_mode": "ansi"}, "seed": 1})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    step = http.post(f"/v1/envs/{sid}/step", json={"action": "probe(0)"}).json()
    assert step["info"]["turn"] == 1 and not step["truncated"]
    end = http.post(f"/v1/envs/{sid}/step", json={"action": "answer(1)"}).json()
    assert end["terminated"] and end["info"]["turn"] == 2  # max_turns=2 was honoured
    assert http.delete(f"/v1/envs/{sid}").status_code == 204


# ------------------------------------------------------------------------------------ S16: huge bodies
def _rss_kb(pid: int, field: str = "VmHWM") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


def _stream_chunked(port: int, path: str, total: int) -> tuple[int, int, bytes]:
    """POST ``total`` bytes with chunked encoding while reading the answer; returns (bytes the kernel
    accepted, seconds until the answer, answer bytes)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    answer = bytearray()
    got = threading.Event()  # the answer's head arrived: stop sending
    whole = threading.Event()  # its body too (Content-Length bytes), or the connection ended

    def complete() -> bool:
        head, sep, body = bytes(answer).partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        return bool(sep) and (length is None or len(body) >= int(length.group(1)))

    def read():
        try:
            while chunk := sock.recv(65536):
                answer.extend(chunk)
                if b"\r\n\r\n" in answer:
                    got.set()
                if complete():
                    break
        except OSError:
            pass
        got.set()
        whole.set()

    reader = threading.Thread(target=read, daemon=True)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())
    reader.start()
    t0 = time.monotonic()
    sent, chunk = 0, b'{"action": "' + b"x" * (1 << 20)
    try:
        while sent < total and not got.is_set():
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
    except OSError:
        pass
    got.wait(30)
    took = time.monotonic() - t0
    whole.wait(10)  # the body may trail the head on a loaded machine
    sock.close()
    return sent, took, bytes(answer)


def test_s16_huge_bodies_are_refused_before_they_are_read(tmp_path):
    """A server process (so its memory is its own): a 64 MB action to /step, declared then streamed."""
    port = free_port()
    code = ("import uvicorn; from sandbox_server.app import create_env_app; "
            f"uvicorn.run(create_env_app(), host='127.0.0.1', port={port}, log_level='warning')")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        sid = httpx.post(f"{base}/v1/envs", json={"env_id": CLUE, "seed": 0}).json()["session_id"]
        for _ in range(3):  # warm the code paths before measuring
            httpx.post(f"{base}/v1/envs/{sid}/step", json={"action": "x" * 40_000})  # a 413: no turn used
            _stream_chunked(port, f"/v1/envs/{sid}/step", 1 << 20)
        hwm = _rss_kb(proc.pid)

        # Declared: 64 MB announced, not one body byte sent: refused from the header alone.
        conn = RawConnection(port)
        conn.sock.sendall(f"POST /v1/envs/{sid}/step HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {64 << 20}\r\n\r\n".encode())
        t0 = time.monotonic()
        status, headers, body = conn.read_response()
        assert time.monotonic() - t0 < 2.0
        conn.close()
        assert status == 413 and headers["connection"] == "close"
        detail = ErrorBody.model_validate_json(body)
        assert "at most 32768 characters" in detail.detail and detail.status == "too_large"

        # Streamed (chunked): answered 413 once past the route's small limit; never read to the end.
        sent, took, answer = _stream_chunked(port, f"/v1/envs/{sid}/step", 64 << 20)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sent < 64 << 20 and took < 5.0
        assert b'"too_large"' in answer
        assert _rss_kb(proc.pid) - hwm < 8 * 1024, "server peak memory grew by more than 8 MB"
        # The session is untouched, and a legal action still works.
        r = httpx.post(f"{base}/v1/envs/{sid}/step", json={"action": "probe(0)"})
        assert r.status_code == 200 and r.json()["info"]["turn"] == 1
    finally:
        proc.terminate()
        proc.wait(30)


def test_s16_sandbox_routes_limit_bodies_by_max_body_bytes(fixture_data):
    svc = local_service(fixture_data)
    srv = UvicornThread(create_app(service=svc, max_body_bytes=4096)).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            sb = http.post("/v1/sandboxes", json={}).json()["id"]
            ok = http.put(f"/v1/sandboxes/{sb}/files", json={"files": {"a.txt": "x" * 3000}})
            assert ok.status_code == 204, ok.text
            big = http.put(f"/v1/sandboxes/{sb}/files", json={"files": {"a.txt": "x" * 5000}})
            assert_error_body(big, 413, "4096 bytes")
            cat = http.post(f"/v1/sandboxes/{sb}/exec", json={"tool": "cat", "args": {"path": "/scratch/a.txt"}})
            assert cat.json()["stdout"] == "x" * 3000  # the refused write changed nothing
            http.delete(f"/v1/sandboxes/{sb}")
    finally:
        srv.stop()


def test_s16_the_default_limit_fits_the_largest_upload(http):
    from sandbox_server.settings import MAX_WRITE_BYTES, ServerSettings

    MAX_BODY_BYTES = ServerSettings().max_body_bytes

    payload = json.dumps({"files": {"big.bin": __import__("base64").b64encode(b"\xff" * MAX_WRITE_BYTES).decode()},
                          "encoding": "base64"}).encode()
    assert len(payload) < MAX_BODY_BYTES
    sb = http.post("/v1/sandboxes", json={}).json()["id"]
    try:
        r = http.put(f"/v1/sandboxes/{sb}/files", content=payload, headers={"content-type": "application/json"})
        assert r.status_code != 413, r.text
    finally:
        http.delete(f"/v1/sandboxes/{sb}")


# ------------------------------------------------------------------------------ S19: failed fork orphans
def test_s19_a_fork_past_the_session_cap_leaves_exactly_the_parent(env_app_server):
    app, srv = env_app_server(max_sessions=3)
    store = app.state.env_sessions
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        sid = _session(http)
        assert_error_body(http.post(f"/v1/envs/{sid}/fork", json={"n": 4}), 503, "env sessions")
        assert len(store) == 1
        assert http.get(f"/v1/envs/{sid}").json()["turn"] == 0
        kids = http.post(f"/v1/envs/{sid}/fork", json={"n": 2}).json()["session_ids"]
        assert len(store) == 3
        assert_error_body(http.post(f"/v1/envs/{sid}/fork", json={"n": 1}), 503)
        assert_error_body(http.post("/v1/envs", json={"env_id": CLUE}), 503)
        assert len(store) == 3
        for k in [sid, *kids]:
            assert http.delete(f"/v1/envs/{k}").status_code == 204
        assert len(store) == 0


def test_s19_env_code_failures_in_create_reset_step_fork_keep_nothing(env_app_server, boom_env):
    app, srv = env_app_server(max_sessions=8)
    store = app.state.env_sessions
    conn = RawConnection(srv.port)  # one keep-alive connection for everything
    try:
        for kwargs, options in (({"boom": "init"}, None), ({"boom": "reset"}, None), ({}, {"boom": True})):
            status, headers, body = conn.request("POST", "/v1/envs",
                                                 {"env_id": BOOM, "kwargs": kwargs, "options": options})
            assert status == 503 and int(headers["retry-after"]) >= 1, body
            assert "kaboom" in ErrorBody.model_validate_json(body).detail
            assert len(store) == 0 and BoomEnv.open_envs == 0
        status, _, body = conn.request("POST", "/v1/envs", {"env_id": BOOM, "kwargs": {"boom": "fork"}})
        assert status == 201, body
        sid = json.loads(body)["session_id"]
        status, _, body = conn.request("POST", f"/v1/envs/{sid}/fork", {"n": 3})
        assert status == 503 and b"kaboom in fork" in body
        assert len(store) == 1 and BoomEnv.open_envs == 1
        status, _, body = conn.request("POST", f"/v1/envs/{sid}/reset", {"options": {"boom": True}})
        assert status == 503 and b"kaboom in reset" in body
        status, _, body = conn.request("POST", "/v1/envs", {"env_id": BOOM, "kwargs": {"boom": "step"}})
        step_sid = json.loads(body)["session_id"]
        status, _, body = conn.request("POST", f"/v1/envs/{step_sid}/step", {"action": "probe(1)"})
        assert status == 503 and b"kaboom in step" in body
        for s in (sid, step_sid):
            assert conn.request("DELETE", f"/v1/envs/{s}")[0] == 204
        assert len(store) == 0 and BoomEnv.open_envs == 0
    finally:
        conn.close()


# ----------------------------------------------------------------------------------- S21: negative seed
@pytest.mark.parametrize("seed", [-1, -(2**70), True, 0.5])
def test_s21_a_bad_seed_is_422_no_session_and_the_connection_lives(full_server, seed):
    app, srv, _ = full_server
    store = app.state.env_sessions
    held = len(store)
    conn = RawConnection(srv.port)
    try:
        status, _, body = conn.request("POST", "/v1/envs", {"env_id": CLUE, "seed": seed})
        assert status == 422 and ErrorBody.model_validate_json(body).status == "invalid", body
        assert len(store) == held
        status, _, body = conn.request("POST", "/v1/envs", {"env_id": CLUE, "seed": 3})  # same connection
        assert status == 201
        sid = json.loads(body)["session_id"]
        status, _, body = conn.request("POST", f"/v1/envs/{sid}/reset", {"seed": seed})
        assert status == 422, body
        status, _, body = conn.request("GET", f"/v1/envs/{sid}")
        assert status == 200 and json.loads(body)["turn"] == 0
        assert conn.request("DELETE", f"/v1/envs/{sid}")[0] == 204
        assert len(store) == held
    finally:
        conn.close()


def test_unexpected_errors_are_a_documented_500_and_keep_the_connection(env_app_server):
    app, srv = env_app_server()

    @app.get("/test-bug")
    async def bug():
        raise ZeroDivisionError("a bug")

    conn = RawConnection(srv.port)
    try:
        status, _, body = conn.request("GET", "/test-bug")
        assert status == 500 and ErrorBody.model_validate_json(body).status == "internal"
        assert conn.request("GET", "/healthz")[0] == 200
    finally:
        conn.close()


# ------------------------------------------------------------------------------- S20: factory arguments
def test_s20_create_env_app_honours_ttl_and_holds_nothing_after_shutdown(boom_env):
    app = create_env_app(ttl_s=0.5)
    store = app.state.env_sessions
    assert store.ttl_s == 0.5
    srv = UvicornThread(app).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            old = _session(http)
            time.sleep(1.0)
            assert_error_body(http.get(f"/v1/envs/{old}"), 404, "expired")
            for _ in range(2):
                assert http.post("/v1/envs", json={"env_id": BOOM}).status_code == 201
            assert BoomEnv.open_envs == 2 and len(store) == 2
    finally:
        srv.stop()
    assert app.state.env_sessions is store and len(store) == 0 and BoomEnv.open_envs == 0


def test_s20_env_ttl_and_cap_come_from_the_service_config(monkeypatch):
    monkeypatch.setenv("FORKYARD_ENV_TTL_S", "7.5")
    monkeypatch.setenv("FORKYARD_MAX_ENV_SESSIONS", "5")
    for app in (create_env_app(), create_app(backend="local")):
        assert (app.state.env_sessions.ttl_s, app.state.env_sessions.max_sessions) == (7.5, 5)
    app = create_app(backend="local", config=ServiceConfig(env_ttl_s=3.0, max_env_sessions=2))
    assert (app.state.env_sessions.ttl_s, app.state.env_sessions.max_sessions) == (3.0, 2)
    with pytest.raises(ValueError):
        create_app(backend="local", service=object())  # a service brings its own config


def test_s20_create_app_honours_its_service_config(fixture_data, boom_env):
    svc = local_service(fixture_data, env_ttl_s=0.5, max_env_sessions=2)
    app = create_app(service=svc)
    srv = UvicornThread(app).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            a, b = _session(http), _session(http)
            assert_error_body(http.post("/v1/envs", json={"env_id": CLUE}), 503)
            time.sleep(1.0)
            assert_error_body(http.get(f"/v1/envs/{a}"), 404)
            assert http.post("/v1/envs", json={"env_id": BOOM}).status_code == 201
    finally:
        srv.stop()
    assert len(app.state.env_sessions) == 0 and BoomEnv.open_envs == 0 and b


# ------------------------------------------------------------------------- S25: abandoned work keeps nothing
def test_s25_concurrent_creates_leave_only_the_sessions_clients_got(fixture_data):
    svc = local_service(fixture_data, min_idle=0, max_total=2, acquire_timeout_s=0.5)
    srv = UvicornThread(create_app(service=svc)).start()
    try:
        async def burst():
            async with httpx.AsyncClient(base_url=srv.url, timeout=30,
                                         limits=httpx.Limits(max_connections=64)) as c:
                return await asyncio.gather(*[c.post("/v1/sandboxes", json={}) for _ in range(50)])

        answers = asyncio.run(burst())
        statuses = [r.status_code for r in answers]
        assert set(statuses) <= {201, 503} and statuses.count(503) > 0, statuses
        for r in answers:
            if r.status_code == 503:
                assert_error_body(r, 503)
        got = {r.json()["id"] for r in answers if r.status_code == 201}
        assert {s.id for s in svc.list()} == got
        for sid in got:
            svc.delete(sid)
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_s25_a_create_whose_client_hung_up_releases_its_sandbox(fixture_data, kind):
    svc = local_service(fixture_data, kind, min_idle=0, max_total=2, acquire_timeout_s=3.0)
    srv = UvicornThread(create_app(service=svc)).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            held = [http.post("/v1/sandboxes", json={}).json()["id"] for _ in range(2)]
            with pytest.raises(httpx.ReadTimeout):  # waits in acquire; the client gives up and hangs up
                httpx.post(f"{srv.url}/v1/sandboxes", json={}, timeout=0.5)
            time.sleep(0.3)
            http.delete(f"/v1/sandboxes/{held[0]}")  # a sandbox frees up while the abandoned create waits
            time.sleep(3.5)  # past its acquire timeout: it has got the sandbox (and let it go) or given up
            assert [s.id for s in svc.list()] == [held[1]]
            assert svc.pool_status().busy == 1
            http.delete(f"/v1/sandboxes/{held[1]}")
    finally:
        srv.stop()
    if kind == "docker":
        assert leftover_containers(f"{SERVER_NAME}-contract") == []


def test_s25_work_past_the_deadline_releases_what_it_took(fixture_data):
    """The route's give-up, direct: the deadline passes while create waits for a sandbox; the sandbox
    it gets later is released, not registered."""
    from sandbox_server.work import run_blocking as _blocking

    svc = local_service(fixture_data, min_idle=0, max_total=1, acquire_timeout_s=3.0).start()
    try:
        first = svc.create()

        async def main():
            threading.Timer(0.5, lambda: svc.delete(first.id)).start()
            with pytest.raises(Exception) as exc:
                await _blocking(svc.create, deadline_s=0.2, undo=lambda info: svc.delete(info.id))
            assert "did not answer within" in str(exc.value)
            await asyncio.sleep(1.5)

        asyncio.run(main())
        assert svc.list() == []
        assert svc.pool_status().busy == 0
    finally:
        svc.close()


# ------------------------------------------------------------------------ S29: FileQA on the server's pool
@pytest.mark.parametrize("kind", ["local", "docker"])
def test_s29_fileqa_sessions_take_sandboxes_from_the_servers_service(fixture_data, kind):
    svc = local_service(fixture_data, kind, min_idle=0, max_total=3, acquire_timeout_s=1.0)
    app = create_app(service=svc)
    srv = UvicornThread(app).start()
    store = app.state.env_sessions
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            for kw in ({"backend": "local"}, {"backend": "docker"}, {"sandbox_provider": "x"},
                       {"server_url": srv.url}, {"corpus_dir": "/etc"}):
                assert_error_body(http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": kw}), 422,
                                  next(iter(kw)))
            made = []
            for _ in range(5):
                r = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "seed": 1,
                                                "kwargs": {"kinds": ["log_errors"]}})
                if r.status_code != 201:
                    assert_error_body(r, 503)  # the pool is exhausted: never a 500
                    break
                made.append(r.json())
            assert 1 <= len(made) < 5 and len(store) == len(made)
            assert len(svc.list()) == len(made)  # each session's sandbox is one of the server's own
            step = http.post(f"/v1/envs/{made[0]['session_id']}/step", json={"action": "wc('/scratch/app.log')"})
            assert step.status_code == 200 and step.json()["info"]["turn"] == 1
            assert {svc.backend.name} == {s.backend for s in svc.list()}  # the server's own backend
            for m in made:
                assert http.delete(f"/v1/envs/{m['session_id']}").status_code == 204
            assert svc.list() == []
    finally:
        srv.stop()
    if kind == "docker":
        assert leftover_containers(f"{SERVER_NAME}-contract") == []


def test_s29_a_server_without_a_sandbox_service_refuses_fileqa(env_app_server):
    app, srv = env_app_server()
    r = httpx.post(f"{srv.url}/v1/envs", json={"env_id": "forkyard/FileQA-v0"}, timeout=30)
    assert_error_body(r, 422, "no sandbox service")
    assert len(app.state.env_sessions) == 0


def test_s29_a_server_whose_backend_is_down_answers_503_for_fileqa(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    app = create_app(backend="docker", config=ServiceConfig(min_idle=0))
    srv = UvicornThread(app).start()
    try:
        r = httpx.post(f"{srv.url}/v1/envs", json={"env_id": "forkyard/FileQA-v0"}, timeout=30)
        assert_error_body(r, 503, "sandbox")
        assert httpx.post(f"{srv.url}/v1/envs", json={"env_id": CLUE}, timeout=30).status_code == 201
    finally:
        srv.stop()


@pytest.mark.parametrize("depth", [33, 400, 700])
def test_deeply_nested_json_is_a_422_that_keeps_nothing(depth):
    """Free-form JSON (metadata, kwargs, options) nested past MAX_JSON_DEPTH is refused before anything is
    made: a value the server could not answer back (the JSON encoder stops at 255 levels) once left a
    session behind and made every later list a 500."""
    from sandbox_server.models import MAX_JSON_DEPTH
    from sandbox_server.service import SandboxService, ServiceConfig
    from sandbox_server.backends import LocalBackend
    from sandbox_server.app import create_app

    nested = '{"a":' * depth + "1" + "}" * depth
    svc = SandboxService(LocalBackend(server_name=f"{SERVER_NAME}-deep"), ServiceConfig(min_idle=1, max_total=4))
    srv = UvicornThread(create_app(service=svc)).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            for method, path, body in [
                ("POST", "/v1/sandboxes", '{"metadata": ' + nested + "}"),
                ("POST", "/v1/envs", '{"env_id": "forkyard/ClueProbe-v0", "kwargs": {"x": ' + nested + "}}"),
                ("POST", "/v1/envs", '{"env_id": "forkyard/ClueProbe-v0", "options": ' + nested + "}"),
            ]:
                r = c.request(method, path, content=body, headers={"content-type": "application/json"})
                assert r.status_code == 422 and str(MAX_JSON_DEPTH) in r.json()["detail"], r.text[:300]
            sb = c.post("/v1/sandboxes", json={}).json()["id"]
            r = c.patch(f"/v1/sandboxes/{sb}/state", content='{"metadata": ' + nested + "}",
                        headers={"content-type": "application/json"})
            assert r.status_code == 422
            assert c.get(f"/v1/sandboxes/{sb}").json()["state"]["metadata"] == {}
            assert [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]] == [sb]
            assert c.get("/v1/envs").status_code == 200
            ok = '{"a":' * (MAX_JSON_DEPTH - 1) + "1" + "}" * (MAX_JSON_DEPTH - 1)  # the metadata object is level 1
            assert c.patch(f"/v1/sandboxes/{sb}/state", content='{"metadata": ' + ok + "}",
                           headers={"content-type": "application/json"}).status_code == 200
            assert c.get("/v1/sandboxes").status_code == 200
    finally:
        srv.stop()
    with pytest.raises(ValueError):  # in-process callers get the same refusal
        from sandbox_server.models import SessionState

        SessionState(metadata=__import__("json").loads(nested))


def test_clients_that_hang_up_leave_nothing_behind_on_any_route():
    """S25's kind on every route that makes sandboxes: a client hangs up while its request waits for a
    sandbox (the pool is full); a sandbox then comes free and the waiting work takes it, but nobody will
    learn of it: it is released, never held for the TTL."""
    import json as _json
    import socket
    import time

    from sandbox_server.app import create_app
    from sandbox_server.backends import LocalBackend
    from sandbox_server.service import SandboxService, ServiceConfig

    svc = SandboxService(LocalBackend(server_name=f"{SERVER_NAME}-hangup"),
                         ServiceConfig(min_idle=0, max_total=3, acquire_timeout_s=4))
    app = create_app(service=svc)
    srv = UvicornThread(app).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            seed = c.post("/v1/sandboxes", json={"files": {"a": "x"}}).json()["id"]
            snap = c.post(f"/v1/sandboxes/{seed}/snapshot", json={}).json()["id"]
            fq = c.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "seed": 0}).json()["session_id"]
            for path, body in [("/v1/sandboxes", {}), (f"/v1/sandboxes/{seed}/fork", {"n": 1}),
                               (f"/v1/snapshots/{snap}/clone", {"n": 1}),
                               ("/v1/envs", {"env_id": "forkyard/FileQA-v0", "seed": 1}),
                               (f"/v1/envs/{fq}/fork", {"n": 1})]:
                blocker = c.post("/v1/sandboxes").json()["id"]  # the pool is full now
                raw = _json.dumps(body).encode()
                sock = socket.create_connection(("127.0.0.1", srv.port))
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
                time.sleep(0.5)
                sock.close()  # the client gives up while its request waits for a sandbox
                time.sleep(0.3)
                assert c.delete(f"/v1/sandboxes/{blocker}").status_code == 204  # one comes free
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    pool = c.get("/v1/pool").json()
                    if pool["busy"] == 2 and pool["starting"] == 0:
                        break
                    time.sleep(0.1)
                time.sleep(0.5)
                pool = c.get("/v1/pool").json()
                assert (pool["sessions"], pool["busy"]) == (2, 2), (path, pool)  # the seed and FileQA's sandbox
                assert len(app.state.env_sessions) == 1, path
    finally:
        srv.stop()


def test_routes_without_files_refuse_big_bodies_before_reading_them():
    """Only creation and file writes carry files: a 10 MB body to fork, clone, exec, snapshot or a state
    update is a 413 from its declared length (it was read and parsed, up to 12 MB each)."""
    from sandbox_server.app import create_app
    from sandbox_server.http_contract import SMALL_BODY_BYTES
    from sandbox_server.backends import LocalBackend
    from sandbox_server.service import SandboxService, ServiceConfig

    svc = SandboxService(LocalBackend(server_name=f"{SERVER_NAME}-small"), ServiceConfig(min_idle=1, max_total=4))
    srv = UvicornThread(create_app(service=svc)).start()
    big = b'{"metadata": {"x": "' + b"a" * (10 << 20) + b'"}}'
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            sb = c.post("/v1/sandboxes", json={}).json()["id"]
            snap = c.post(f"/v1/sandboxes/{sb}/snapshot", json={}).json()["id"]
            for method, path in [("PATCH", f"/v1/sandboxes/{sb}/state"), ("POST", f"/v1/sandboxes/{sb}/fork"),
                                 ("POST", f"/v1/sandboxes/{sb}/exec"), ("POST", f"/v1/sandboxes/{sb}/snapshot"),
                                 ("POST", f"/v1/snapshots/{snap}/clone")]:
                r = c.request(method, path, content=big, headers={"content-type": "application/json"})
                assert r.status_code == 413 and str(SMALL_BODY_BYTES) in r.json()["detail"], (path, r.text[:200])
            assert c.get(f"/v1/sandboxes/{sb}").json()["state"]["metadata"] == {}
            # metadata at its bound still fits the small limit
            from sandbox_server.models import MAX_METADATA_BYTES

            ok = c.patch(f"/v1/sandboxes/{sb}/state", json={"metadata": {"x": "a" * (MAX_METADATA_BYTES - 16)}})
            assert ok.status_code == 200, ok.text[:200]
            too = c.patch(f"/v1/sandboxes/{sb}/state", json={"metadata": {"x": "a" * MAX_METADATA_BYTES}})
            assert too.status_code == 422 and "metadata" in too.json()["detail"]
    finally:
        srv.stop()
