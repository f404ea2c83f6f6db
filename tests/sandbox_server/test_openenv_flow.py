"""The server's message flow: an oversize OpenEnv WebSocket message is answered and the session survives (field
case S55); a connection that pipelines, WebSocket messages or HTTP requests, takes turns with the others (field case
S56). Real servers on loopback: the app in a uvicorn thread, and the server command (``python -m sandbox_server``)
in its own process."""

from __future__ import annotations

import base64
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Callable

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from sandbox_server.app import create_env_app
from sandbox_server.openenv_flow import CLOSE_TOO_BIG, WS_FRAME_BYTES, WS_MESSAGE_BYTES
from tests.docker_support import ROOT, UvicornThread, free_port, wait_http_ok

CLUE = "forkyard/ClueProbe-v0"
PATH = f"/openenv/{CLUE}/ws"


@pytest.fixture(scope="module")
def command_server():
    """``python -m sandbox_server --no-sandboxes`` on a free port (its own process: its event loop is the
    server's alone, as in the field)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandbox_server", "--no-sandboxes", "--port", str(port),
                             "--log-level", "warning"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert wait_http_ok(f"http://127.0.0.1:{port}/healthz", 90, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def ask(ws, kind: str, **data) -> dict:
    ws.send(json.dumps({"type": kind, "data": data}))
    return json.loads(ws.recv(timeout=60))


def oversize(n: int) -> str:
    """A step message of exactly ``n`` bytes (valid JSON: the size alone refuses it)."""
    head, tail = '{"type": "step", "data": {"action": "', '"}}'
    return head + "x" * (n - len(head) - len(tail)) + tail


def test_field_case_s55_an_oversize_message_is_answered_and_the_session_survives():
    srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=16)).start()
    try:
        with connect(f"ws://127.0.0.1:{srv.port}{PATH}", max_size=None) as ws:
            sid = ask(ws, "reset", seed=1)["data"]["observation"]["session_id"]
            ask(ws, "step", action="probe(0)")
            kids = ask(ws, "fork", n=3)["data"]["session_ids"]
            for n in (WS_MESSAGE_BYTES + 1, 2 * WS_MESSAGE_BYTES):
                ws.send(oversize(n))
                got = json.loads(ws.recv(timeout=60))
                assert got["type"] == "error", got
                data = got["data"]
                assert (data["code"], data["http_status"], data["status"]) == ("VALIDATION_ERROR", 413, "too_large")
                assert str(WS_MESSAGE_BYTES) in data["message"] and str(n) in data["message"]
            # the connection, its session and every fork it owns are as they were
            after = ask(ws, "step", action="probe(1)")["data"]["observation"]
            assert (after["session_id"], after["info"]["turn"]) == (sid, 2)
            assert ask(ws, "delete", session_ids=kids)["data"]["deleted"] == kids
            # a message just within the limit is parsed (here: an action longer than the env takes, 413 of its own)
            ws.send(oversize(WS_MESSAGE_BYTES))
            assert "characters" in json.loads(ws.recv(timeout=60))["data"]["message"]
    finally:
        srv.stop()


def test_field_case_s55_the_server_command_answers_up_to_its_frame_limit_and_closes_beyond(command_server):
    """``python -m sandbox_server`` sets ``ws_max_size`` to WS_FRAME_BYTES: under it a message too large is
    answered; over it the connection closes with 1009 (and its session with it, as any connection's)."""
    assert WS_MESSAGE_BYTES < WS_FRAME_BYTES < 16 << 20  # below uvicorn's default: the command's own setting
    with connect(f"ws://127.0.0.1:{command_server}{PATH}", max_size=None) as ws:
        ask(ws, "reset", seed=1)
        ws.send(oversize(WS_FRAME_BYTES - 1))
        assert json.loads(ws.recv(timeout=60))["data"]["http_status"] == 413
        assert ask(ws, "step", action="probe(0)")["type"] == "observation"
        ws.send(oversize(WS_FRAME_BYTES + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=60)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_TOO_BIG


# ------------------------------------------------------------------------------------ S56
def _frame(text: bytes) -> bytes:
    """A masked (all-zero mask) client text frame."""
    n = len(text)
    size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
    return b"\x81" + size + b"\0\0\0\0" + text


def _raw_ws(port: int) -> socket.socket:
    """A WebSocket opened over a plain socket: it can send thousands of messages without reading an answer."""
    s = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def send(s: socket.socket, data: bytes) -> None:
    """``s.sendall(data)``, until the socket is closed."""
    try:
        s.sendall(data)
    except OSError:
        pass


def _while_flooding(s: socket.socket, flood: bytes, measure: Callable[[], float]) -> tuple[float, int]:
    """Send ``flood`` on ``s`` from a thread (another drains its answers, so the flood goes on) and return
    (``measure()`` taken meanwhile, bytes answered on ``s`` while it ran); ``s`` is closed after."""
    got = [0]

    def drain() -> None:
        try:
            while chunk := s.recv(1 << 16):
                got[0] += len(chunk)
        except OSError:
            pass

    try:
        threading.Thread(target=drain, daemon=True).start()
        threading.Thread(target=send, args=(s, flood), daemon=True).start()
        time.sleep(0.3)
        before = got[0]
        value = measure()
        return value, got[0] - before
    finally:
        s.shutdown(socket.SHUT_RDWR)
        s.close()


#: Seconds added to twice the idle p99: a loaded two-core machine preempts a server at 100% CPU for some ms
#: (seen: 9-11 ms busy against 0.5-4.8 ms idle while other test suites ran); a starved connection waits 100s of ms.
SLACK_S = 0.025


def _p99(ws, seconds: float, least: int = 200) -> float:
    """The 99th percentile (s) of step round trips of ``ws`` over ``seconds`` (longer until ``least`` steps, but
    never longer than four times ``seconds``: a starved connection's few steps are its measure)."""
    start = time.monotonic()
    out: list[float] = []
    while (time.monotonic() < start + seconds or len(out) < least) and time.monotonic() < start + 4 * seconds:
        msg = '{"type": "reset", "data": {"seed": 1}}' if len(out) % 4 == 0 else \
            '{"type": "step", "data": {"action": "probe(1)"}}'
        t = time.perf_counter()
        ws.send(msg)
        ws.recv(timeout=60)
        out.append(time.perf_counter() - t)
    return statistics.quantiles(out, n=100)[98] if len(out) > 1 else out[0]


def test_field_case_s56_a_pipelining_connection_does_not_starve_the_others(command_server):
    """One raw connection floods step messages (hundreds of thousands, sent without waiting for any answer; a
    thread of its own drains the answers, so the flood goes on); another connection's step p99 during the flood
    stays within twice its idle p99 measured just before in the same try. The machine is noisy (two cores,
    other work): up to five tries, one within the bound passes, and the bound has a floor of SLACK_S for the
    scheduler's preemption of a server at 100% CPU on two cores (before the fix: 450-1,360 ms each try)."""
    flood = _frame(b'{"type": "step", "data": {"action": "probe(1)"}}') * 400_000
    results = []
    for _ in range(5):
        with connect(f"ws://127.0.0.1:{command_server}{PATH}") as ws:
            ask(ws, "reset", seed=0)
            idle = _p99(ws, 1.0)
            s = _raw_ws(command_server)
            s.sendall(_frame(b'{"type": "reset", "data": {"kwargs": {"max_turns": 64}}}'))
            busy, answered = _while_flooding(s, flood, lambda: _p99(ws, 1.0))
            assert answered > 100_000, answered  # the flood was being answered all along (> 1,000 answers)
            results.append((busy, idle))
        if busy <= 2 * idle + SLACK_S:
            break
    print("S56 p99 (busy, idle) ms:", [(round(b * 1e3, 2), round(i * 1e3, 2)) for b, i in results])
    assert any(b <= 2 * i + SLACK_S for b, i in results), [(round(b * 1e3, 2), round(i * 1e3, 2)) for b, i in results]


def _http_p99(c: httpx.Client, sid: str, seconds: float, least: int = 200) -> float:
    """The 99th percentile (s) of REST reset / step round trips of session ``sid`` (as :func:`_p99`)."""
    start = time.monotonic()
    out: list[float] = []
    while (time.monotonic() < start + seconds or len(out) < least) and time.monotonic() < start + 4 * seconds:
        t = time.perf_counter()
        if len(out) % 4 == 0:
            c.post(f"/v1/envs/{sid}/reset", json={"seed": 1}).raise_for_status()
        else:
            c.post(f"/v1/envs/{sid}/step", json={"action": "probe(1)"}).raise_for_status()
        out.append(time.perf_counter() - t)
    return statistics.quantiles(out, n=100)[98] if len(out) > 1 else out[0]


def test_field_case_s56_a_connection_pipelining_http_requests_does_not_starve_the_others(command_server):
    """The same over HTTP/1.1: one raw keep-alive connection pipelines 200,000 step requests (sent without
    waiting; a thread drains the answers); another client's REST p99 during the flood stays within twice its
    idle p99 (plus SLACK_S), up to five tries. Before the fix (uvicorn's httptools protocol read ahead after every
    answer, so the queue of read requests grew by a socket buffer per answer): 0.9-2.6 s against 12-24 ms idle,
    and the flood itself got about 50 answers a second."""
    url = f"http://127.0.0.1:{command_server}"
    results = []
    with httpx.Client(base_url=url, timeout=60) as c:
        sid = c.post("/v1/envs", json={"env_id": CLUE}).json()["session_id"]
        flood_sid = c.post("/v1/envs", json={"env_id": CLUE, "kwargs": {"max_turns": 64}}).json()["session_id"]
        body = b'{"action": "probe(1)"}'
        request = (f"POST /v1/envs/{flood_sid}/step HTTP/1.1\r\nHost: 127.0.0.1:{command_server}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        for _ in range(5):
            idle = _http_p99(c, sid, 1.0)
            s = socket.create_connection(("127.0.0.1", command_server))
            busy, answered = _while_flooding(s, request * 200_000, lambda: _http_p99(c, sid, 1.0))
            assert answered > 40_000, answered  # the flood was being answered all along (> 100 answers)
            results.append((busy, idle))
            if busy <= 2 * idle + SLACK_S:
                break
    print("S56 HTTP p99 (busy, idle) ms:", [(round(b * 1e3, 2), round(i * 1e3, 2)) for b, i in results])
    assert any(b <= 2 * i + SLACK_S for b, i in results), [(round(b * 1e3, 2), round(i * 1e3, 2)) for b, i in results]
