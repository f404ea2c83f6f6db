"""Env steps per second in-process and over HTTP (1 and 32 concurrent sessions), and env fork(4) over HTTP.

Starts ``python -m sandbox_server`` (sandbox pool + env sessions) in a subprocess on loopback (so the
client does not share the server's interpreter), measures, and prints figures with the HTTP overhead
as a ratio to in-process in the same run. Run:

    .venv/bin/python benchmarks/bench_env_http.py [--env clueprobe|fileqa|both] [--seconds S]
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

import gymnasium as gym
import httpx

import envs  # noqa: F401

ENVS = {
    "clueprobe": ("forkyard/ClueProbe-v0", {"turns": 5}),
    # 60 turns: a step is a tool call; a reset (a fresh sandbox each episode) every 60 steps.
    "fileqa": ("forkyard/FileQA-v0", {"max_turns": 60, "kinds": ["line_count"]}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _action(info: dict) -> str:
    legal = info["legal_actions"]
    return legal[0]


def in_process(env_id: str, kwargs: dict, seconds: float) -> float:
    env = gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped
    obs, info = env.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        obs, r, te, tr, info = env.step(_action(info))
        n += 1
        if te or tr:
            obs, info = env.reset()
    rate = n / (time.perf_counter() - t0)
    env.close()
    return rate


def http_one(url: str, env_id: str, kwargs: dict, seconds: float) -> tuple[float, float]:
    with httpx.Client(base_url=url, timeout=60) as c:
        d = c.post("/v1/envs", json={"env_id": env_id, "kwargs": kwargs, "seed": 0}).json()
        sid, info = d["session_id"], d["info"]
        lat, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            r = c.post(f"/v1/envs/{sid}/step", json={"action": _action(info)}).json()
            lat.append(time.perf_counter() - t)
            info = r["info"]
            if r["terminated"] or r["truncated"]:
                info = c.post(f"/v1/envs/{sid}/reset", json={}).json()["info"]
        rate = len(lat) / (time.perf_counter() - t0)
        c.delete(f"/v1/envs/{sid}")
    return rate, statistics.median(lat) * 1000


async def _http_many(url: str, env_id: str, kwargs: dict, seconds: float, sessions: int) -> float:
    # aiohttp as the load generator: httpx's AsyncClient spent more CPU per request than the server
    # here (115 steps/s at 32 sessions against 1,850 with aiohttp on the same server), so it measured itself.
    import aiohttp

    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=sessions)) as c:
        async def post(path, body):
            async with c.post(path, json=body) as r:
                if r.status >= 400:
                    raise RuntimeError(f"POST {path}: HTTP {r.status} {(await r.text())[:300]}")
                return await r.json()

        made = await asyncio.gather(*[post("/v1/envs", {"env_id": env_id, "kwargs": kwargs, "seed": i}) for i in range(sessions)])
        count = [0]
        stop = time.perf_counter() + seconds

        async def drive(d):
            sid, info = d["session_id"], d["info"]
            while time.perf_counter() < stop:
                r = await post(f"/v1/envs/{sid}/step", {"action": _action(info)})
                count[0] += 1
                info = r["info"]
                if r["terminated"] or r["truncated"]:
                    info = (await post(f"/v1/envs/{sid}/reset", {}))["info"]
            async with c.delete(f"/v1/envs/{sid}"):
                pass

        t0 = time.perf_counter()
        await asyncio.gather(*[drive(m) for m in made])
        return count[0] / (time.perf_counter() - t0)


def _wait_warm(c: httpx.Client, timeout_s: float = 30.0) -> None:
    """Wait until the server's sandbox pool is refilled: ``min_idle`` idle, none starting (no-op
    without a pool)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        r = c.get("/v1/pool")
        if r.status_code != 200:
            return
        st = r.json()
        if st["idle"] >= st["min_idle"] and st["starting"] == 0:
            time.sleep(0.1)  # let the deferred destroys of the last fork's sandboxes finish
            return
        time.sleep(0.05)


def http_fork(url: str, env_id: str, kwargs: dict, n: int = 40, warm: bool = False) -> tuple[float, float]:
    """p50 / p95 ms of env fork(4) over HTTP. ``warm``: before each fork, wait until the pool is refilled
    (``min_idle`` idle sandboxes, no start in flight) (released sandboxes are destroyed and replaced, so back-to-back forks would time
    container starts instead: that sustained rate is the steps/s figure's business)."""
    with httpx.Client(base_url=url, timeout=60) as c:
        d = c.post("/v1/envs", json={"env_id": env_id, "kwargs": kwargs, "seed": 0}).json()
        sid = d["session_id"]
        c.post(f"/v1/envs/{sid}/step", json={"action": _action(d["info"])})
        lat = []
        for _ in range(n):
            if warm:
                _wait_warm(c)
            t = time.perf_counter()
            kids = c.post(f"/v1/envs/{sid}/fork", json={"n": 4}).json()["session_ids"]
            lat.append(time.perf_counter() - t)
            for k in kids:
                c.delete(f"/v1/envs/{k}")
        c.delete(f"/v1/envs/{sid}")
    lat.sort()
    return statistics.median(lat) * 1000, lat[int(0.95 * (len(lat) - 1))] * 1000


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", choices=["clueprobe", "fileqa", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--url", default=None, help="measure an existing server (e.g. docker compose up) instead")
    ap.add_argument("--backend", default="local", help="FileQA's sandbox backend in-process (local or docker)")
    args = ap.parse_args(argv)
    server = None
    if args.url:
        url = args.url.rstrip("/")
    else:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "sandbox_server", "--port", str(port), "--backend", args.backend, "--min-idle", "8",
             "--log-level", "warning"],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
    try:
        for _ in range(200):
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        names = ["clueprobe", "fileqa"] if args.env == "both" else [args.env]
        where = args.url or "uvicorn on loopback (1 process)"
        print(f"env steps over HTTP to {where}; FileQA sandbox backend {args.backend}; {args.seconds:g} s per figure")
        for name in names:
            env_id, kw = ENVS[name]
            # in-process FileQA takes the backend as a kwarg; over HTTP the server's --backend decides
            local = in_process(env_id, {**kw, "backend": args.backend} if name == "fileqa" else kw, args.seconds)
            one, p50 = http_one(url, env_id, kw, args.seconds)
            one_async = asyncio.run(_http_many(url, env_id, kw, args.seconds, 1))
            # FileQA holds one sandbox per session: stay within the pool's default max_total (16).
            n_sessions = args.sessions if name == "clueprobe" else min(args.sessions, 8)
            many = asyncio.run(_http_many(url, env_id, kw, args.seconds, n_sessions))
            f50, f95 = http_fork(url, env_id, kw, warm=name == "fileqa")
            print(f"{env_id}:")
            print(f"  in-process:                 {local:>10,.0f} steps/s")
            print(f"  HTTP, 1 session (httpx):    {one:>10,.0f} steps/s  (p50 {p50:.2f} ms; in-process / HTTP = {local / one:.1f}x)")
            print(f"  HTTP, 1 session (aiohttp):  {one_async:>10,.0f} steps/s  (in-process / HTTP = {local / one_async:.1f}x)")
            print(f"  HTTP, {n_sessions:>2} sessions (aiohttp): {many:>10,.0f} steps/s  (in-process / HTTP = {local / many:.1f}x)")
            warm_note = " (pool refilled before each fork)" if name == "fileqa" else ""
            print(f"  env fork(4) over HTTP:      p50 {f50:.2f} ms, p95 {f95:.2f} ms{warm_note}")
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
