"""forkyard's OpenEnv transport side by side with OpenEnv's own server, in one run, on loopback.

Starts two servers in subprocesses: OpenEnv's (``openenv.core.env_server.create_app``, openenv-core 0.3.0)
over a trivial env (a step returns a fixed observation, reward 0, never done), and forkyard's
(``python -m sandbox_server --no-sandboxes``) serving ClueProbe with 64 turns (a step parses the action and
reads one bit: close to trivial). Both are driven over their WebSocket ``/ws`` by the same client code (the
``websockets`` package, one connection per session, one message per step), and by OpenEnv's own
``GenericEnvClient`` for one session; forkyard's ``RemoteEnv`` (HTTP ``/v1/envs``) is measured beside them.
Prints steps/s and the ratio forkyard / OpenEnv for each row, and the client's CPU per step; then, on
forkyard, the cost of getting 4 sessions at a state L steps into an episode by fork + batch delete against
replaying the prefix 4 times. Run:

    .venv/bin/python benchmarks/bench_openenv.py [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import httpx
from websockets.asyncio.client import connect

OPENENV_SERVER = textwrap.dedent("""
    import sys, uvicorn
    from openenv.core.env_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class TextAction(Action):
        action: str

    class TextObservation(Observation):
        text: str = ""

    class Trivial(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State(step_count=0)

        def reset(self, seed=None, episode_id=None, **kw):
            self._state = State(step_count=0)
            return TextObservation(text="start", reward=None, done=False)

        def step(self, action, timeout_s=None, **kw):
            self._state.step_count += 1
            return TextObservation(text="bit 0 of the target is 1.", reward=0.0, done=False)

        @property
        def state(self):
            return self._state

    app = create_app(Trivial, TextAction, TextObservation, env_name="trivial", max_concurrent_envs=64)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], health: str, quiet: bool = False) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.getcwd()},
                            stderr=subprocess.DEVNULL if quiet else None)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(health, timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{cmd} did not start")


async def session(ws_url: str, reset: dict, seconds: float) -> int:
    """Steps one session for ``seconds``: how many steps it took (resetting when an episode ends)."""
    steps = 0
    async with connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "reset", "data": reset}))
        first = json.loads(await ws.recv())
        assert first["type"] == "observation", first
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await ws.send('{"type": "step", "data": {"action": "probe(0)"}}')
            answer = json.loads(await ws.recv())
            assert answer["type"] == "observation", answer
            steps += 1
            if answer["data"]["done"]:
                await ws.send(json.dumps({"type": "reset", "data": reset}))
                await ws.recv()
    return steps


async def concurrent(ws_url: str, reset: dict, n: int, seconds: float) -> float:
    counts = await asyncio.gather(*(session(ws_url, reset, seconds) for _ in range(n)))
    return sum(counts) / seconds


async def fork_against_replay(ws_url: str, prefix: int, n: int = 4, repeats: int = 50) -> tuple[float, float]:
    """Milliseconds to get ``n`` sessions at a state ``prefix`` steps into an episode, over one connection:
    (``fork {n}`` + ``delete`` of the n children in one message, n replays of reset + ``prefix`` steps)."""
    async with connect(ws_url) as ws:
        async def ask(msg: dict) -> dict:
            await ws.send(json.dumps(msg))
            return json.loads(await ws.recv())

        reset = {"type": "reset", "data": {"seed": 1, "kwargs": {"max_turns": 64}}}
        await ask(reset)
        for _ in range(prefix):
            await ask({"type": "step", "data": {"action": "probe(0)"}})
        t = time.perf_counter()
        for _ in range(repeats):
            ids = (await ask({"type": "fork", "data": {"n": n}}))["data"]["session_ids"]
            await ask({"type": "delete", "data": {"session_ids": ids}})
        fork_ms = (time.perf_counter() - t) / repeats * 1e3
        t = time.perf_counter()
        for _ in range(repeats):
            for _ in range(n):
                await ask({"type": "reset", "data": {"seed": 1}})
                for _ in range(prefix):
                    await ask({"type": "step", "data": {"action": "probe(0)"}})
        replay_ms = (time.perf_counter() - t) / repeats * 1e3
    return fork_ms, replay_ms


def generic_client(base: str, reset: dict, seconds: float) -> tuple[float, float]:
    """OpenEnv's own sync client, one session: (steps/s, client CPU microseconds per step)."""
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=base).sync() as env:
        env.reset(**reset)
        steps, cpu, end = 0, time.process_time(), time.perf_counter() + seconds
        while time.perf_counter() < end:
            if env.step({"action": "probe(0)"}).done:
                env.reset(**reset)
            steps += 1
        cpu = time.process_time() - cpu
    return steps / seconds, cpu / steps * 1e6


def remote_env(url: str, seconds: float, transport: str) -> tuple[float, float]:
    """forkyard's RemoteEnv over ``transport`` (``http``: /v1/envs; ``ws``: the OpenEnv transport), one
    session: (steps/s, client CPU microseconds per step)."""
    import gymnasium as gym

    import envs  # noqa: F401 - registers the ids

    env = gym.make("forkyard/ClueProbe-v0", max_turns=64, server_url=url, transport=transport).unwrapped
    try:
        env.reset(seed=0)
        steps, cpu, end = 0, time.process_time(), time.perf_counter() + seconds
        while time.perf_counter() < end:
            _, _, term, trunc, _ = env.step("probe(0)")
            if term or trunc:
                env.reset()
            steps += 1
        cpu = time.process_time() - cpu
    finally:
        env.close()
    return steps / seconds, cpu / steps * 1e6


def main() -> None:
    for var in ("FORKYARD_API_KEY", "FORKYARD_API_KEY_FILE"):  # its own loopback servers; raw clients send no key
        os.environ.pop(var, None)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    p_open, p_fork = free_port(), free_port()
    # OpenEnv's server logs a traceback for every client that leaves while it answers: kept off the output.
    openenv = start([sys.executable, "-c", OPENENV_SERVER, str(p_open)], f"http://127.0.0.1:{p_open}/health",
                    quiet=True)
    forkyard = start([sys.executable, "-m", "sandbox_server", "--no-sandboxes", "--port", str(p_fork),
                      "--log-level", "warning"], f"http://127.0.0.1:{p_fork}/healthz")
    try:
        bases = {"OpenEnv": (f"http://127.0.0.1:{p_open}", {}),
                 "forkyard": (f"http://127.0.0.1:{p_fork}/openenv/forkyard/ClueProbe-v0",
                              {"kwargs": {"max_turns": 64}})}
        rows = []
        for label, n in [("1 session, websockets client", 1), ("32 sessions, websockets client", 32)]:
            figs = {k: asyncio.run(concurrent(b.replace("http", "ws") + "/ws", r, n, args.seconds))
                    for k, (b, r) in bases.items()}
            rows.append((label, figs))
        clients = {k: generic_client(b, r, args.seconds) for k, (b, r) in bases.items()}
        rows.append(("1 session, OpenEnv's GenericEnvClient", {k: v[0] for k, v in clients.items()}))
        remote = {t: remote_env(f"http://127.0.0.1:{p_fork}", args.seconds, t) for t in ("http", "ws")}
        print(f"{'steps/s':44s} {'OpenEnv':>10s} {'forkyard':>10s} {'ratio':>7s}")
        for label, f in rows:
            print(f"{label:44s} {f['OpenEnv']:10.0f} {f['forkyard']:10.0f} {f['forkyard'] / f['OpenEnv']:6.2f}x")
        for t, (steps, _) in remote.items():
            label = f"1 session, forkyard RemoteEnv transport={t}"
            print(f"{label:44s} {clients['OpenEnv'][0]:10.0f} {steps:10.0f} {steps / clients['OpenEnv'][0]:6.2f}x  "
                  "(against GenericEnvClient on OpenEnv)")
        print("client CPU per step (us): GenericEnvClient on OpenEnv %.0f, GenericEnvClient on forkyard %.0f, "
              "RemoteEnv http %.0f, RemoteEnv ws %.0f" % (clients["OpenEnv"][1], clients["forkyard"][1],
                                                          remote["http"][1], remote["ws"][1]))
        ws_fork = bases["forkyard"][0].replace("http", "ws") + "/ws"
        print("\n4 sessions at a state L steps in, forkyard over /ws (ms): fork(4) + delete in one message "
              "against 4 x (reset + L steps)")
        for prefix in (0, 1, 2, 4, 8):
            f, r = asyncio.run(fork_against_replay(ws_fork, prefix))
            print(f"  L={prefix}: fork {f:.2f}, replay {r:.2f} ({r / f:.1f}x)")
    finally:
        for proc in (openenv, forkyard):
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
