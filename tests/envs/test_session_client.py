"""envs.session_client against a real uvicorn on loopback: both transports (``/v1/envs`` over HTTP and the
OpenEnv WebSocket with the fork extension) give the same episodes for the same seeds and actions, forks and
snapshots included; errors decode to the same exceptions over both; the HTTP connection pool is shared by
threads; and the server answers with the very models the clients decode (envs.wire)."""

from __future__ import annotations

import threading

import httpx
import pytest

from envs.clueprobe import ClueProbeEnv
from envs.core import EnvInfraError, EpisodeFinishedError
from envs.errors import ActionTooLong, InvalidValue, SessionNotFound, UnknownEnv
from envs.http_connections import HttpConnections
from envs.session_client import HttpTransport, SessionClient, make_transport
from envs.wire import ResetResponse, StepResponse
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread

CLUE = "forkyard/ClueProbe-v0"
TRANSPORTS = ("http", "ws")


@pytest.fixture(scope="module")
def server():
    srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=64)).start()
    yield srv
    srv.stop()


def sessions(srv) -> int:
    return len(srv.server.config.app.state.env_sessions)


def wait_sessions(srv, n: int, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while sessions(srv) != n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sessions(srv) == n


def client(srv, transport: str, **kwargs) -> SessionClient:
    return SessionClient(make_transport(transport, srv.url, CLUE, kwargs, 30.0), CLUE, kwargs)


def strip(answer) -> tuple:
    """An answer without its session id (which differs between runs)."""
    if isinstance(answer, StepResponse):
        return answer.observation, answer.reward, answer.terminated, answer.truncated, answer.info
    return answer.observation, answer.info, answer.observation_max_length, answer.action_max_length


def play(srv, transport: str, seed: int) -> list[tuple]:
    """An episode with a fork (two branches) and a snapshot restored into a new session, as answers."""
    c = client(srv, transport, max_turns=4)
    out = [strip(c.reset(seed=seed)), strip(c.step("probe(0)"))]
    kids = c.fork(2)
    out += [strip(k.step(f"probe({i + 1})")) for i, k in enumerate(kids)]
    token = c.snapshot()
    out.append(strip(c.step("probe(2)")))
    other = client(srv, transport)
    out.append(strip(other.restore(token)))  # at the state before probe(2)
    out.append(strip(other.step("probe(2)")))
    out.append(strip(c.step("answer(0)")))
    for x in kids + [c, other]:
        x.close()
    return out


@pytest.mark.parametrize("seed", [0, 7])
def test_both_transports_give_the_same_episodes_as_the_in_process_env(server, seed):
    http, ws = play(server, "http", seed), play(server, "ws", seed)
    assert http == ws
    local = ClueProbeEnv(max_turns=4)
    obs, info = local.reset(seed=seed)
    assert http[0][:2] == (obs, info) and http[0][2] == local.observation_space.max_length
    assert http[1] == local.step("probe(0)")
    a, b = local.fork(2)
    assert http[2:4] == [a.step("probe(1)"), b.step("probe(2)")]
    assert http[5][:2] == (local.last_observation, local.current_info())  # the restored state
    p2 = local.step("probe(2)")
    assert http[4] == http[6] == p2  # the parent and the restored copy go on alike
    assert http[7] == local.step("answer(0)")
    wait_sessions(server, 0)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_errors_decode_alike_over_both_transports(server, transport):
    c = client(server, transport, max_turns=1)
    assert isinstance(c.reset(seed=1), ResetResponse)
    # the clients raise the domain error the server raised (envs.errors), each the builtin the contract names
    with pytest.raises(ActionTooLong, match="HTTP 413|at most"):
        c.step("x" * 40_000)  # too long: refused, nothing ran
    assert c.step("probe(0)").truncated  # max_turns=1: the episode ends
    with pytest.raises(EpisodeFinishedError):
        c.step("probe(0)")
    with pytest.raises(UnknownEnv, match="HTTP 404"):  # an env id the server does not serve: a configuration error
        SessionClient(make_transport(transport, server.url, "forkyard/NoSuch-v0", {}, 30.0),
                      "forkyard/NoSuch-v0").reset()
    with pytest.raises(InvalidValue, match="HTTP 422"):
        client(server, transport, max_turns="many").reset()
    sid = c.session_id
    if transport == "http":
        assert httpx.delete(f"{server.url}/v1/envs/{sid}").status_code == 204  # lost under the client
    else:  # a connection's session is refused over /v1/envs (409 held, field case S58): lost in the store itself
        assert httpx.delete(f"{server.url}/v1/envs/{sid}").status_code == 409
        server.server.config.app.state.env_sessions.pop(sid)
    with pytest.raises(SessionNotFound, match="HTTP 404"):
        c.step("probe(0)")
    c.close()
    wait_sessions(server, 0)
    with pytest.raises(EnvInfraError):
        SessionClient(make_transport(transport, "http://127.0.0.1:9", CLUE, {}, 2.0, connect_retries=0), CLUE).reset()


def test_threads_share_one_http_pool(server):
    transport = HttpTransport(server.url, 30.0)
    transport.refs = 0
    results: dict[int, list] = {}

    def run(k: int) -> None:
        c = SessionClient(transport, CLUE, {"max_turns": 6})
        transport.refs += 1
        c.reset(seed=k)
        results[k] = [strip(c.step(f"probe({i % 3})")) for i in range(5)]
        c.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for k in range(6):
        local = ClueProbeEnv(max_turns=6)
        local.reset(seed=k)
        assert results[k] == [local.step(f"probe({i % 3})") for i in range(5)]
    assert transport.is_closed  # the last client closed it
    wait_sessions(server, 0)


def test_connections_refuse_bad_urls_and_requests_after_close(server):
    with pytest.raises(ValueError, match="server_url"):
        HttpConnections("ftp://example.org", 1.0)
    pool = HttpConnections(server.url, 5.0)
    status, body, _ = pool.request("GET", "/healthz")
    assert status == 200 and b"ok" in body
    pool.close()
    with pytest.raises(EnvInfraError, match="closed"):
        pool.request("GET", "/healthz")


def test_connections_send_the_key_from_the_url_or_the_argument_which_wins():
    key = "session-client-key"
    srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=4, api_key=key)).start()
    try:
        in_url = srv.url.replace("http://", f"http://forkyard:{key}@")
        wrong_in_url = srv.url.replace("http://", "http://forkyard:wrong@")
        # 404: let in, and no such session; 401: refused. A key in the URL's user info goes as the header.
        for url, api_key, status in ((srv.url, None, 401), (in_url, None, 404), (srv.url, key, 404),
                                     (wrong_in_url, key, 404), (in_url, "wrong", 401)):
            pool = HttpConnections(url, 5.0, api_key=api_key)
            assert pool.request("GET", "/v1/envs/nope/tools")[0] == status, (url, api_key)
            pool.close()
    finally:
        srv.stop()
    # the URL is named without its user info (field case S60)
    with pytest.raises(EnvInfraError, match=r"GET http://127\.0\.0\.1:9/healthz failed: ConnectError") as err:
        HttpConnections(f"http://forkyard:{key}@127.0.0.1:9", 2.0, retries=0).request("GET", "/healthz")
    assert key not in str(err.value)


def test_the_server_answers_with_the_models_the_clients_decode():
    from sandbox_server import models

    for name in ("ErrorBody", "ResetResponse", "StepResponse", "ForkResponse", "EnvSnapshotResponse"):
        assert getattr(models, name) is getattr(__import__("envs.wire", fromlist=[name]), name)


def test_decode_builds_what_validation_builds():
    from envs.wire import ForkResponse, decode

    step = {"session_id": "s", "observation": "o", "reward": 0.5, "terminated": False, "truncated": True,
            "info": {"turn": 2}}
    reset = {"session_id": "s", "observation": "o", "info": {"turn": 0}, "observation_max_length": 8,
             "action_max_length": 4, "extra": 1}
    for model, data in ((StepResponse, step), (ResetResponse, reset), (ForkResponse, {"session_id": "s",
                                                                                      "session_ids": ["a"]})):
        got = decode(model, dict(data))
        assert got == model.model_validate({k: v for k, v in data.items() if k != "extra"})
        assert got.model_dump() == model.model_construct(**data).model_dump()
    assert decode(ResetResponse, {"session_id": "s"}).observation_max_length is None

