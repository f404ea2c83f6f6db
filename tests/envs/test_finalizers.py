"""A client env dropped without ``close`` frees its server session (and a sandboxed env its sandbox) from its
finalizer, and that finalizer never blocks an event loop: the garbage collector may run it on a server's own loop
thread, where a blocking delete sent to that same server waits on itself (an in-process uvicorn server stopped
answering until the delete timed out). Real uvicorn servers on loopback, real clients."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

import envs  # noqa: F401 - registers the forkyard ids
from envs.remote import RemoteEnv
from envs.remote_vector import RemoteVectorEnv
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread

CLUE = "forkyard/ClueProbe-v0"


@pytest.fixture
def server():
    srv = UvicornThread(create_env_app(ttl_s=600)).start()
    yield srv
    srv.stop()


def sessions(srv: UvicornThread) -> int:
    return len(srv.server.config.app.state.env_sessions)


def make(kind: str, url: str):
    if kind == "vector":
        env = RemoteVectorEnv(CLUE, url, 2, max_turns=3)
        env.reset(seed=0)
    else:
        env = RemoteEnv(CLUE, url, transport=kind, max_turns=3)
        env.reset(seed=0)
    return env


def drop_on_the_servers_loop(srv: UvicornThread, env) -> None:
    """Hand the only reference of ``env`` to a coroutine on the server's event loop, which drops it there."""
    box = [env]
    del env

    async def drop() -> None:
        box.clear()  # the last reference: the finalizer runs here, on the server's loop thread

    loop = srv.server.servers[0].get_loop()
    asyncio.run_coroutine_threadsafe(drop(), loop).result(timeout=30)


@pytest.mark.parametrize("kind", ["http", "ws", "vector"])
def test_an_env_dropped_on_the_servers_own_loop_frees_its_sessions_and_the_loop_goes_on(server, kind):
    drop_on_the_servers_loop(server, make(kind, server.url))
    t0 = time.monotonic()
    assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200  # the loop was never blocked
    assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 10
    while sessions(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sessions(server) == 0


@pytest.mark.parametrize("kind", ["http", "ws", "vector"])
def test_an_env_dropped_on_a_plain_thread_frees_its_sessions_before_the_drop_returns(server, kind):
    env = make(kind, server.url)
    assert sessions(server) >= 1
    del env
    assert sessions(server) == 0


def test_a_sandboxed_env_dropped_in_a_running_loop_gives_its_sandbox_back():
    import gymnasium as gym

    from sandbox_server.embedded import shared_provider

    provider = shared_provider("local")

    def live() -> set[str]:
        return {box.id for box in provider.list()}

    before = live()

    async def play_and_drop() -> None:
        env = gym.make("forkyard/FileQA-v0", backend="local", max_turns=3)
        env.reset(seed=0)
        assert len(live() - before) == 1
        del env  # in a coroutine: the release goes to the finalizer thread

    asyncio.run(play_and_drop())
    deadline = time.monotonic() + 30
    while live() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live() - before == set()
