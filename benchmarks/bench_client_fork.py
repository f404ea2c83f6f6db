"""Fork against replay through each of forkyard's own clients, and batched steps of ``RemoteVectorEnv``.

Starts a forkyard server (``python -m sandbox_server --no-sandboxes``) on loopback and, for each client
(``RemoteEnv`` over HTTP, ``RemoteEnv(transport="ws")``, ``RemoteVectorEnv``, ``ForkyardEnvClient``) and each
prefix length k in 1, 2, 4, 8, measures the milliseconds to get 4 sessions at a state k steps into a ClueProbe
episode (64 turns) two ways, in the same client over the same transport:

* fork: ``fork(4)`` of a session k steps in, then deleting the 4 children (``envs.remote.close_many`` for
  ``RemoteEnv``; ``close()`` of the forked vector env; one ``delete`` message for ``ForkyardEnvClient``);
* replay (the baseline): 4 sessions already open, each reset and stepped k times (``RemoteVectorEnv``: one
  batched reset and k batched steps of a 4-env vector env; ``ForkyardEnvClient``: 4 connected clients).

The two are timed in alternation (the load of a shared machine falls on both alike). A row ``RemoteEnv ws, +1
step`` adds one step in each child (and in each replayed session): a child that is used attaches over a
connection of its own, kept idle from the round before.

and prints both and the ratio replay / fork (above 1: the fork is faster). Then ``RemoteVectorEnv`` with 32
sessions: env steps/s and the client's CPU per env step (``time.process_time``), against the same batched
request sent by a bare ``httpx.Client`` (its body encoded once, its answer not decoded): what the vector env
adds to the library. Figures are medians of ``--repeats`` rounds. Run:

    .venv/bin/python benchmarks/bench_client_fork.py [--repeats R] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import httpx
import orjson

CLUE = "forkyard/ClueProbe-v0"
KW = {"max_turns": 64}
PREFIXES = (1, 2, 4, 8)
N = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    """``python -m sandbox_server --no-sandboxes`` on 127.0.0.1:``port``, once ``/healthz`` answers.

    Raises:
        RuntimeError: it did not answer within 60 s."""
    proc = subprocess.Popen([sys.executable, "-m", "sandbox_server", "--no-sandboxes", "--port", str(port),
                             "--log-level", "warning"], env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not start")


def timed(fork: Callable[[], Any], replay: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median milliseconds of ``fork()`` and of ``replay()`` over ``repeats`` rounds each, the two interleaved (so
    that both see the same load on a shared machine), after one warm-up call of each."""
    fork()
    replay()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((fork, times[0]), (replay, times[1])):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


# ------------------------------------------------------------------------------------------ fork against replay
def remote_env(url: str, transport: str, prefix: int, repeats: int, step: bool = False) -> tuple[float, float]:
    """``RemoteEnv`` over ``transport``: (ms of fork(4) + closing the 4 children, ms of 4 x (reset + k steps)); with
    ``step``, one step more in each child and in each replayed session (a child that is used: over the WebSocket
    it attaches then, on a connection kept from the last round)."""
    import envs.remote as remote
    from envs.remote import RemoteEnv

    close_many = getattr(remote, "close_many", None)  # the batched close (a release before it had none)
    parent = RemoteEnv(CLUE, url, transport=transport, **KW)
    replay = [RemoteEnv(CLUE, url, transport=transport, **KW) for _ in range(N)]
    try:
        parent.reset(seed=1)
        for _ in range(prefix):
            parent.step("probe(0)")
        for env in replay:
            env.reset(seed=1)

        def fork() -> None:
            children = parent.fork(N)
            if step:
                for child in children:
                    child.step("probe(1)")
            if close_many is not None:
                close_many(children)
            else:
                for child in children:
                    child.close()

        def again() -> None:
            for env in replay:
                env.reset(seed=1)
                for _ in range(prefix):
                    env.step("probe(0)")
                if step:
                    env.step("probe(1)")

        return timed(fork, again, repeats)
    finally:
        for env in [parent, *replay]:
            env.close()


def vector_env(url: str, prefix: int, repeats: int) -> tuple[float, float]:
    """``RemoteVectorEnv``: (ms of fork(4) of a 1-env vector env + close of the 4-env child, ms of a batched
    reset and k batched steps of a 4-env vector env)."""
    from envs.remote_vector import RemoteVectorEnv

    parent, replay = RemoteVectorEnv(CLUE, url, 1, **KW), RemoteVectorEnv(CLUE, url, N, **KW)
    try:
        parent.reset(seed=1)
        for _ in range(prefix):
            parent.step(["probe(0)"])
        replay.reset(seed=1)

        def fork() -> None:
            parent.fork(N).close()

        def again() -> None:
            replay.reset(seed=1)
            for _ in range(prefix):
                replay.step(["probe(0)"] * N)

        return timed(fork, again, repeats)
    finally:
        parent.close()
        replay.close()


def openenv_client(url: str, prefix: int, repeats: int) -> tuple[float, float]:
    """``ForkyardEnvClient`` (async, one event loop): (ms of fork(4) + one delete message, ms of 4 connected
    clients each reset and stepped k times)."""
    from envs.openenv_client import ForkyardEnvClient

    base = f"{url}/openenv/{CLUE}"

    async def measure() -> tuple[float, float]:
        parent = ForkyardEnvClient(base_url=base)
        replay = [ForkyardEnvClient(base_url=base) for _ in range(N)]
        try:
            await parent.reset(seed=1, kwargs=KW)
            for _ in range(prefix):
                await parent.step({"action": "probe(0)"})
            for c in replay:
                await c.reset(seed=1, kwargs=KW)

            async def fork() -> None:
                await parent.delete(await parent.fork(N))

            async def again() -> None:
                for c in replay:
                    await c.reset(seed=1)
                    for _ in range(prefix):
                        await c.step({"action": "probe(0)"})

            await fork()
            await again()
            times: tuple[list[float], list[float]] = ([], [])
            for _ in range(repeats):  # interleaved, as timed()
                for fn, out in ((fork, times[0]), (again, times[1])):
                    t = time.perf_counter()
                    await fn()
                    out.append((time.perf_counter() - t) * 1e3)
            return statistics.median(times[0]), statistics.median(times[1])
        finally:
            for c in [parent, *replay]:
                await c.close()

    return asyncio.run(measure())


# ------------------------------------------------------------------------------------------ batched steps
def vector_steps(url: str, seconds: float, n: int = 32) -> tuple[float, float]:
    """``RemoteVectorEnv`` of ``n`` sessions stepped for ``seconds``: (env steps/s, client CPU us per env step)."""
    from envs.remote_vector import RemoteVectorEnv

    vec = RemoteVectorEnv(CLUE, url, n, **KW)
    try:
        vec.reset(seed=0)
        actions = ["probe(0)"] * n
        steps, cpu, t, end = 0, time.process_time(), time.perf_counter(), time.perf_counter() + seconds
        while time.perf_counter() < end:
            vec.step(actions)  # 64 turns: an autoreset every 64 steps, one request more
            steps += n
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    finally:
        vec.close()
    return steps / wall, cpu / steps * 1e6


def bare_httpx(url: str, seconds: float, n: int = 32) -> tuple[float, float]:
    """The baseline of :func:`vector_steps`: the same ``POST /v1/envs/batch/step`` of ``n`` sessions through a
    bare ``httpx.Client`` (body encoded once, answer not decoded; a batched reset every 64 steps, as the vector
    env's autoresets): (env steps/s, client CPU us per env step)."""
    with httpx.Client(base_url=url, timeout=60, headers={"Content-Type": "application/json"}) as client:
        made = client.post("/v1/envs/batch/create", content=orjson.dumps(
            {"items": [{"env_id": CLUE, "kwargs": KW, "seed": i} for i in range(n)]}))
        sids = [r["result"]["session_id"] for r in made.json()["results"]]
        body = orjson.dumps({"items": [{"session_id": s, "action": "probe(0)"} for s in sids]})
        again = orjson.dumps({"items": [{"session_id": s, "seed": None} for s in sids]})
        try:
            steps, cpu, t, end = 0, time.process_time(), time.perf_counter(), time.perf_counter() + seconds
            while time.perf_counter() < end:
                r = client.post("/v1/envs/batch/step", content=body)
                assert r.status_code == 200, r.text[:200]
                steps += n
                if steps % (64 * n) == 0:
                    client.post("/v1/envs/batch/reset", content=again)
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        finally:
            client.post("/v1/envs/batch/delete", content=orjson.dumps({"items": [{"session_id": s} for s in sids]}))
    return steps / wall, cpu / steps * 1e6


def main() -> None:
    for var in ("FORKYARD_API_KEY", "FORKYARD_API_KEY_FILE"):  # its own loopback server, no key
        os.environ.pop(var, None)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=40, help="rounds per figure (median)")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds of each batched-step run")
    args = ap.parse_args()
    port = free_port()
    server = start_server(port)
    url = f"http://127.0.0.1:{port}"
    clients: dict[str, Callable[[int], tuple[float, float]]] = {
        "RemoteEnv http": lambda k: remote_env(url, "http", k, args.repeats),
        "RemoteEnv ws": lambda k: remote_env(url, "ws", k, args.repeats),
        "RemoteEnv ws, +1 step": lambda k: remote_env(url, "ws", k, args.repeats, step=True),
        "RemoteVectorEnv": lambda k: vector_env(url, k, args.repeats),
        "ForkyardEnvClient": lambda k: openenv_client(url, k, args.repeats),
    }
    try:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"4 sessions at a state k steps in (ms, median of {args.repeats}): fork(4) + delete of the children "
              "against 4 x (reset + k steps); ratio replay / fork")
        print(f"{'client':22s} {'k':>2s} {'fork':>8s} {'replay':>8s} {'ratio':>7s}")
        for name, run in clients.items():
            for k in PREFIXES:
                fork_ms, replay_ms = run(k)
                print(f"{name:22s} {k:2d} {fork_ms:8.2f} {replay_ms:8.2f} {replay_ms / fork_ms:6.2f}x", flush=True)
        steps, cpu = vector_steps(url, args.seconds)
        base_steps, base_cpu = bare_httpx(url, args.seconds)
        print(f"\nRemoteVectorEnv, 32 sessions, batched steps: {steps:,.0f} env steps/s, {cpu:.1f} us of client CPU "
              f"per env step ({cpu * 32:.0f} per batch)")
        print(f"bare httpx.Client, the same requests (encoded once, not decoded): {base_steps:,.0f} env steps/s, "
              f"{base_cpu:.1f} us per env step; RemoteVectorEnv: {steps / base_steps:.2f}x the steps/s, "
              f"{cpu / base_cpu:.2f}x the CPU")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
