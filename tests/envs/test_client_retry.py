"""Clients on a busy server and on connections the server closes while idle (field case S42; envs/client_retry.py).

Busy: the env-session cap (or the sandbox pool) of a real server is full, the server answers 503 with
``Retry-After``; every client waits and retries within ``busy_timeout_s`` and gets its session once room is
made, or gives up after the budget. Idle close: a loopback proxy in front of a real server closes a reused
keep-alive connection as a request arrives on it (what a server's keep-alive timeout does in a race); a
request that is safe to repeat is sent once more on a new connection, a step is never sent twice."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

import envs  # noqa: F401 - registers the forkyard ids
from envs.client_retry import BusyWait, retry_after_s, safe_to_repeat
from envs.core import EnvInfraError
from envs.remote import RemoteEnv
from envs.remote_vector import RemoteVectorEnv
from sandbox_server.app import create_app, create_env_app
from sandbox_server.client import SandboxClient
from sandbox_server.errors import ServiceUnavailable
from sandbox_server.settings import ServiceConfig
from tests.docker_support import UvicornThread, require_bwrap

CLUE = "forkyard/ClueProbe-v0"


@pytest.fixture
def full_server():
    """An env server whose cap (1 session) is taken by ``holder``."""
    srv = UvicornThread(create_env_app(max_sessions=1)).start()
    holder = httpx.post(f"{srv.url}/v1/envs", json={"env_id": CLUE, "seed": 0}).json()["session_id"]
    yield srv, holder
    srv.stop()


def free_later(url: str, sid: str, after_s: float) -> threading.Timer:
    t = threading.Timer(after_s, lambda: httpx.delete(f"{url}/v1/envs/{sid}"))
    t.start()
    return t


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_remote_env_waits_for_room_on_a_full_server(full_server, transport):
    srv, holder = full_server
    with pytest.raises(EnvInfraError, match="503|CAPACITY"):
        RemoteEnv(CLUE, srv.url, transport=transport, busy_timeout_s=0).reset(seed=1)
    t0 = time.monotonic()
    free_later(srv.url, holder, 0.5)
    env = RemoteEnv(CLUE, srv.url, transport=transport)
    obs, _ = env.reset(seed=1)  # answered 503 + Retry-After first, then given the freed slot
    waited = time.monotonic() - t0
    assert "Turn 1" in obs and waited >= 4.5  # it waited what Retry-After said (5 s), not less
    env.close()


def test_remote_env_gives_up_after_its_budget(full_server):
    srv, _ = full_server
    t0 = time.monotonic()
    with pytest.raises(EnvInfraError, match="503"):
        RemoteEnv(CLUE, srv.url, busy_timeout_s=1.0).reset(seed=1)
    assert 1.0 <= time.monotonic() - t0 < 10  # the budget bounds the wait, not the server's Retry-After (5 s)


def test_vector_env_retries_only_the_items_that_found_no_room(full_server):
    srv, holder = full_server
    free_later(srv.url, holder, 0.5)
    vec = RemoteVectorEnv(CLUE, srv.url, 1)
    obs, _ = vec.reset(seed=3)
    assert len(obs) == 1 and vec.session_ids[0] is not None
    vec.close()
    srv2 = UvicornThread(create_env_app(max_sessions=1)).start()
    try:
        httpx.post(f"{srv2.url}/v1/envs", json={"env_id": CLUE})
        vec = RemoteVectorEnv(CLUE, srv2.url, 1, busy_timeout_s=0, errors="mark")
        _, infos = vec.reset(seed=3)
        assert infos["termination_reason"][0] == "infra_error"  # no budget: the 503 is the answer
        vec.close()
    finally:
        srv2.stop()


def test_sandbox_client_waits_for_a_free_sandbox():
    require_bwrap()
    cfg = ServiceConfig(min_idle=0, max_total=1, acquire_timeout_s=0.5)
    srv = UvicornThread(create_app("local", cfg, warm=False)).start()
    try:
        with SandboxClient(srv.url) as c:
            first = c.create()
            with pytest.raises(ServiceUnavailable):
                SandboxClient(srv.url, busy_timeout_s=0).create()
            threading.Timer(1.0, lambda: c.delete(first.id)).start()
            with SandboxClient(srv.url) as waiting:
                second = waiting.create()  # the pool's 503 first, then the sandbox the first session gave back
                assert second.id != first.id
                waiting.delete(second.id)
    finally:
        srv.stop()


class ClosingProxy:
    """A loopback TCP proxy to ``target_port``: bytes pass both ways, except that after :meth:`arm` the next
    request arriving on a connection that already carried an answer closes that connection unanswered (the
    request never reaches the server), as a server closing an idle keep-alive connection does; after
    :meth:`arm_answer` the next answer on such a connection is dropped instead (the request ran, its client
    never hears of it)."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.answer_armed = threading.Event()
        self.cut = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self) -> None:
        self.armed.set()

    def arm_answer(self) -> None:
        self.answer_armed.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the server has stopped: the client sees its connection closed
                client.close()
                continue
            answered = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, answered), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, answered), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, answered: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                if answered.is_set() and self.armed.is_set():
                    self.armed.clear()
                    self.cut += 1
                    break
                upstream.sendall(data)
        except OSError:
            pass
        for s in (client, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _down(self, upstream: socket.socket, client: socket.socket, answered: threading.Event) -> None:
        try:
            while data := upstream.recv(65536):
                if answered.is_set() and self.answer_armed.is_set():
                    self.answer_armed.clear()
                    self.cut += 1
                    client.shutdown(socket.SHUT_RDWR)
                    break
                # Set before the bytes go: once the client has the answer it may send its next request at once,
                # and _up must already count this connection as one that carried an answer.
                answered.set()
                client.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def test_a_safe_request_is_repeated_after_an_idle_close_and_a_step_never_is():
    srv = UvicornThread(create_env_app()).start()
    proxy = ClosingProxy(srv.port)
    try:
        env = RemoteEnv(CLUE, proxy.url)
        env.reset(seed=5)
        proxy.arm()
        obs, _ = env.reset(seed=5)  # cut unanswered, then sent again on a new connection
        assert proxy.cut == 1 and "Turn 1" in obs
        proxy.arm()
        assert env.tool_schemas()  # a GET: repeated too
        assert proxy.cut == 2
        proxy.arm()
        with pytest.raises(EnvInfraError, match="RemoteProtocolError|ReadError|disconnected"):
            env.step("probe(0)")  # it may have run: never sent twice
        assert proxy.cut == 3
        sid = env.session_id
        assert httpx.get(f"{srv.url}/v1/envs/{sid}").json()["turn"] == 0  # the cut step never reached the server
        assert env.step("probe(0)")[4]["turn"] == 1  # the next one, on a new connection
        env.close()
        assert srv.server.config.app.state.env_sessions.__len__() == 0
    finally:
        proxy.close()
        srv.stop()


def test_sandbox_client_repeats_safe_calls_and_a_delete_that_ran_is_done():
    require_bwrap()
    srv = UvicornThread(create_app("local", ServiceConfig(min_idle=0, max_total=2), warm=False)).start()
    proxy = ClosingProxy(srv.port)
    try:
        with SandboxClient(proxy.url) as c:
            sb = c.create(files={"q.txt": b"hi"})
            proxy.arm()
            assert c.exec(sb.id, "cat", {"path": "/scratch/q.txt"}).stdout == "hi"  # cut, then sent again
            proxy.arm_answer()
            assert c.delete(sb.id) is None  # it ran, its answer was lost; sent again: 404, which means done
            assert proxy.cut == 2 and c.list() == []
            sb2 = c.create()
            proxy.arm()
            with pytest.raises(ServiceUnavailable, match="did not answer"):
                c.fork(sb2.id, 1)  # a fork may have run: never sent twice
            assert len(c.list()) == 1  # the cut fork never reached the server
    finally:
        proxy.close()
        srv.stop()


def test_the_policy_functions():
    assert safe_to_repeat("GET", "/v1/envs/x/tools") and safe_to_repeat("DELETE", "/v1/envs/x")
    assert safe_to_repeat("POST", "/v1/envs/x/reset") and safe_to_repeat("POST", "/v1/sandboxes/x/exec")
    for path in ("/v1/envs/x/step", "/v1/envs", "/v1/envs/x/fork", "/v1/sandboxes/x/snapshot", "/v1/envs/batch/step"):
        assert not safe_to_repeat("POST", path)
    assert retry_after_s("5") == 5.0 and retry_after_s(None) == retry_after_s("soon") == retry_after_s("0") == 0.05
    assert retry_after_s("nan") == retry_after_s(float("inf")) == retry_after_s("-inf") == 0.05
    with pytest.raises(ValueError):
        BusyWait(-1)
    budget = BusyWait(0.2)
    t0 = time.monotonic()
    assert budget.wait(10.0) and not budget.wait(10.0)  # clipped to what is left, then spent
    assert time.monotonic() - t0 < 1.0
