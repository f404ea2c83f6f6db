"""fork(4) of every registered forkyard env, in-process and over HTTP, against a replay of the same prefix.

Run: ``.venv/bin/python benchmarks/bench_suite.py [--prefix 1 4] [--reps 20] [--only ID ...]``. For each env and
each prefix length k: reset with a seed, play the first k actions of its legal menu, then time

* ``fork(4)``: four independent copies at that state (closed after each repetition), and
* the baseline, a **replay**: four fresh envs each reset with the same seed and stepped through the same k actions
  (what a trainer without forks does to get four siblings at that state).

In-process: bare envs made by ``gymnasium.make`` (sandboxed envs on the local backend). Over HTTP: a
``python -m sandbox_server`` started on loopback (local backend), through :class:`envs.RemoteEnv` (``fork(4)`` +
closing the four children, against four new sessions reset and stepped k times, then closed). Prints p50 times in
milliseconds and the ratio replay / fork (above 1: the fork is cheaper). Nothing is asserted (machines are noisy).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import httpx

from gymnasium.envs.registration import load_env_creator

import envs
from envs.registry import env_spec, forkyard_specs

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefix(env: Any, k: int, seed: int) -> list[str]:
    """Reset ``env`` with ``seed`` and play k actions (the first of each legal menu); returns them."""
    _, info = env.reset(seed=seed)
    played = []
    for _ in range(k):
        if env.done:
            break
        action = info["legal_actions"][0]
        info = env.step(action)[4]
        played.append(action)
    return played


def _p50_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def fork_against_replay(make: Callable[[], Any], k: int, reps: int, seed: int = 7) -> tuple[float, float]:
    """p50 ms of ``fork(4)`` (children closed) and of its baseline, 4 envs from ``make()`` reset with ``seed`` and
    stepped through the same k-action prefix (closed), each path warmed once first (imports, caches)."""
    env = make()
    try:
        actions = _prefix(env, k, seed)

        def fork() -> None:
            for child in env.fork(4):
                child.close()

        def replay() -> None:
            for _ in range(4):
                e = make()
                e.reset(seed=seed)
                for a in actions:
                    e.step(a)
                e.close()

        fork()
        replay()
        return _p50_ms(fork, reps), _p50_ms(replay, reps)
    finally:
        env.close()


def in_process(env_id: str, kwargs: dict[str, Any], k: int, reps: int) -> tuple[float, float]:
    """:func:`fork_against_replay` on bare envs made by ``gymnasium.make``."""
    return fork_against_replay(lambda: gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped, k, reps)


def over_http(url: str, env_id: str, k: int, reps: int) -> tuple[float, float]:
    """:func:`fork_against_replay` on :class:`envs.RemoteEnv` sessions of the server at ``url``."""
    return fork_against_replay(lambda: envs.RemoteEnv(env_id, url), k, reps)


def main(argv: list[str] | None = None) -> None:
    for var in ("FORKYARD_API_KEY", "FORKYARD_API_KEY_FILE"):  # its own loopback server, started without a key
        os.environ.pop(var, None)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, nargs="+", default=[1, 4], help="prefix lengths k (actions before the fork)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", nargs="*", default=None, help="env ids (default: every registered forkyard env)")
    ap.add_argument("--no-http", action="store_true", help="in-process figures only")
    args = ap.parse_args(argv)
    ids = args.only or list(forkyard_specs())
    server, url = None, None
    if not args.no_http:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "sandbox_server", "--port", str(port), "--backend", "local",
                                   "--log-level", "warning"], cwd=ROOT)
        for _ in range(300):
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
    try:
        print(f"fork(4) against replaying a k-step prefix in 4 fresh envs; p50 of {args.reps}, milliseconds")
        print(f"{'env':34} {'k':>2} | {'fork':>8} {'replay':>8} {'ratio':>6} | {'HTTP fork':>9} {'replay':>8} "
              f"{'ratio':>6}")
        for env_id in ids:
            kwargs = {"backend": "local"} if load_env_creator(env_spec(env_id).entry_point).uses_sandbox else {}
            for k in args.prefix:
                f, r = in_process(env_id, kwargs, k, args.reps)
                line = f"{env_id:34} {k:>2} | {f:8.3f} {r:8.3f} {r / f:5.1f}x |"
                if url is not None:
                    hf, hr = over_http(url, env_id, k, max(5, args.reps // 2))
                    line += f" {hf:9.2f} {hr:8.2f} {hr / hf:5.1f}x"
                print(line, flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
