"""Field case S59: a client used on both sides of ``os.fork``. Against a real server (``python -m
sandbox_server`` on loopback, local backend), each forkyard client is made and used before a real ``os.fork``
(or a multiprocessing ``fork`` pool), then parent and child issue many requests concurrently on the same
client object: each process gets its own answers (every episode equals the in-process env's for its seed;
every sandbox answer names the process's own sandbox), the child is refused the parent's session, and after the
child closed the client and exited, the parent's connection and session still work (same session id)."""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import os
import select
import signal
import threading

import gymnasium as gym
import pytest

import envs  # noqa: F401 - registers the forkyard ids
from envs.clueprobe import ClueProbeEnv
from envs.openenv_client import ForkyardEnvClient
from envs.process_local import InheritedConnectionError
from envs.remote_vector import RemoteVectorEnv
from sandbox_server.client import AsyncSandboxClient, SandboxClient
from tests.docker_support import SERVER_NAME, ServerProcess, require_bwrap, wait_http_ok

CLUE = "forkyard/ClueProbe-v0"
KW = {"bits": 6, "max_turns": 8}
PROBES = [f"probe({k})" for k in range(6)]
PARENT, CHILD = range(100, 112), range(200, 212)


def local(seed: int) -> list[str]:
    env = ClueProbeEnv(**KW)
    return [env.reset(seed=seed)[0]] + [env.step(a)[0] for a in PROBES]


EXPECT = {s: local(s) for s in [*PARENT, *CHILD, 300, 301]}


@pytest.fixture(scope="module")
def server():
    require_bwrap()
    srv = ServerProcess(f"{SERVER_NAME}-forked", backend="local", FORKYARD_MIN_IDLE="2", FORKYARD_MAX_TOTAL="8")
    try:
        assert wait_http_ok(f"{srv.url}/healthz", 120, srv.proc)
        yield srv
    finally:
        srv.stop()


def forked(work, timeout_s: float = 120.0):
    """Run ``work()`` in a fork child (it returns JSON); returns a ``join()`` that gives the child's result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(r)
            out = json.dumps({"ok": work()})
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = json.dumps({"error": repr(exc)})
        finally:
            os.write(w, out.encode())
            os._exit(code)
    os.close(w)

    def join():
        chunks = []
        while select.select([r], [], [], timeout_s)[0]:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        result = json.loads(b"".join(chunks) or b'{"error": "the child was killed (hung)"}')
        assert status == 0 and "ok" in result, result
        return result["ok"]

    return join


def play(env, seed: int) -> list[str]:
    return [env.reset(seed=seed)[0]] + [env.step(a)[0] for a in PROBES]


def refused(call) -> str:
    try:
        call()
    except InheritedConnectionError as exc:
        return str(exc)
    return "not refused"


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_remote_env_on_both_sides_of_a_fork(server, transport):
    env = gym.make(CLUE, server_url=server.url, transport=transport, **KW)
    env.reset(seed=0)
    env.step("probe(0)")  # a session and an open connection before the fork
    sid = env.unwrapped.session_id

    def child():
        out = {"refused": refused(lambda: env.step("probe(1)"))}
        out["bad"] = [s for s in CHILD if play(env, s) != EXPECT[s]]
        out["sid"] = env.unwrapped.session_id
        env.close()  # the child's own session; the parent's connection and session are left alone
        gc.collect()
        return out

    join = forked(child)
    bad = [s for s in PARENT if play(env, s) != EXPECT[s]]
    out = join()
    assert bad == [] and out["bad"] == []
    assert "belongs to that process" in out["refused"] and "reset()" in out["refused"]
    assert out["sid"] not in (None, sid)
    assert play(env, 300) == EXPECT[300] and env.unwrapped.session_id == sid  # the same session, not a new one
    env.close()


def test_vector_env_on_both_sides_of_a_fork(server):
    vec = RemoteVectorEnv(CLUE, server.url, 2, **KW)
    vec.reset(seed=0)
    sids = list(vec.session_ids)

    def vplay(seed: int) -> list[list[str]]:
        return [list(vec.reset(seed=seed)[0])] + [list(vec.step([a, a])[0]) for a in PROBES]

    def want(seed: int) -> list[list[str]]:
        return [list(x) for x in zip(EXPECT[seed], EXPECT[seed + 1], strict=True)]

    def child():
        out = {"refused": refused(lambda: vec.step(["probe(0)"] * 2))}
        out["bad"] = [s for s in CHILD[::2] if vplay(s) != want(s)]
        out["sids"] = vec.session_ids
        vec.close()
        return out

    join = forked(child)
    bad = [s for s in PARENT[::2] if vplay(s) != want(s)]
    out = join()
    assert bad == [] and out["bad"] == [] and "RemoteVectorEnv" in out["refused"]
    assert not set(out["sids"]) & set(sids)
    assert vplay(300) == want(300) and vec.session_ids == sids
    vec.close()


_POOL_ENV = None


def _pool_play(seed: int) -> tuple[int, bool]:
    return os.getpid(), play(_POOL_ENV, seed) == EXPECT[seed]


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_a_fork_pool_of_workers_shares_one_env_object(server, transport):
    global _POOL_ENV
    _POOL_ENV = env = gym.make(CLUE, server_url=server.url, transport=transport, **KW)
    env.reset(seed=0)
    sid = env.unwrapped.session_id
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            pending = pool.map_async(_pool_play, CHILD)
            bad = [s for s in PARENT if play(env, s) != EXPECT[s]]
            results = pending.get(120)
        assert bad == [] and all(ok for _, ok in results) and os.getpid() not in {p for p, _ in results}
        assert play(env, 301) == EXPECT[301] and env.unwrapped.session_id == sid
    finally:
        _POOL_ENV = None
        env.close()


def test_openenv_client_on_both_sides_of_a_fork(server):
    client = ForkyardEnvClient(base_url=f"{server.url}/openenv/{CLUE}").sync()
    client.connect()
    sid = client.reset(seed=0, kwargs=KW).observation["session_id"]

    def oplay(seed: int) -> tuple[list[str], set[str]]:
        answers = [client.reset(seed=seed, kwargs=KW)] + [client.step({"action": a}) for a in PROBES]
        return [a.observation["text"] for a in answers], {a.observation["session_id"] for a in answers}

    def child():
        out = {"refused": refused(lambda: client.step({"action": "probe(0)"}))}
        plays = [(s, *oplay(s)) for s in CHILD]
        out["bad"] = [s for s, texts, _ in plays if texts != EXPECT[s]]
        out["sids"] = sorted(set().union(*(ids for _, _, ids in plays)))
        client.close()
        return out

    join = forked(child)
    plays = [(s, *oplay(s)) for s in PARENT]
    out = join()
    assert [s for s, texts, _ in plays if texts != EXPECT[s]] == [] and out["bad"] == []
    assert "ForkyardEnvClient" in out["refused"] and sid not in out["sids"]
    texts, ids = oplay(300)
    assert texts == EXPECT[300] and ids == {sid}  # the parent's connection and session outlived the child
    client.close()


def sandbox_work(client: SandboxClient, tag: str, n: int = 15) -> int:
    sb = client.create(files={"who.txt": tag.encode()}, metadata={"who": tag})
    try:
        return sum((client.get(sb.id).state.metadata != {"who": tag})
                   + (client.exec(sb.id, "cat", {"path": "/scratch/who.txt"}).stdout != tag) for _ in range(n))
    finally:
        client.delete(sb.id)


def test_sandbox_client_on_both_sides_of_a_fork(server):
    client = SandboxClient(server.url)
    assert client.health().status == "ok"  # a keep-alive connection before the fork

    def child():
        bad = sandbox_work(client, f"child-{os.getpid()}")
        client.close()  # this process's connections only
        return bad

    join = forked(child)
    bad = sandbox_work(client, "parent")
    assert join() == 0 and bad == 0
    assert client.health().status == "ok" and sandbox_work(client, "parent", 2) == 0
    client.close()


async def async_sandbox_work(client: AsyncSandboxClient, tag: str, n: int = 15) -> int:
    sb = await client.create(files={"who.txt": tag.encode()}, metadata={"who": tag})
    bad = 0
    try:
        for _ in range(n):
            bad += (await client.get(sb.id)).state.metadata != {"who": tag}
            bad += (await client.exec(sb.id, "cat", {"path": "/scratch/who.txt"})).stdout != tag
    finally:
        await client.delete(sb.id)
    return bad


def test_async_sandbox_client_on_both_sides_of_a_fork(server):
    loop = asyncio.new_event_loop()  # the parent's client lives on a loop in a thread, as a server's would
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    run = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result(120)  # noqa: E731
    client = AsyncSandboxClient(server.url)
    try:
        assert run(client.health()).status == "ok"

        def child():
            async def main():
                bad = await asyncio.wait_for(async_sandbox_work(client, f"child-{os.getpid()}"), 60)
                await client.aclose()
                return bad
            return asyncio.run(main())

        join = forked(child)
        bad = run(async_sandbox_work(client, "parent"))
        assert join() == 0 and bad == 0
        assert run(client.health()).status == "ok" and run(async_sandbox_work(client, "parent", 2)) == 0
        run(client.aclose())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_client_given_its_own_http_is_refused_in_a_fork_child(server):
    import httpx

    client = SandboxClient(server.url, http=httpx.Client(base_url=server.url))
    assert client.health().status == "ok"
    message = forked(lambda: refused(client.health))()
    assert "http= client" in message and "in this process, after the fork" in message
    assert client.health().status == "ok"
    client.close()
