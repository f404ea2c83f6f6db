"""Env steps per second in-process and over HTTP (1 and 32 concurrent sessions, one request per step, and 32
sessions batched: one request per step of all 32), and env fork(4) over HTTP.

Starts ``python -m sandbox_server`` (sandbox pool + env sessions) in a subprocess on loopback (so the
client does not share the server's interpreter), measures, and prints figures with the HTTP overhead
as a ratio to in-process in the same run. The batched figures come from the vector client
(:class:`envs.RemoteVectorEnv`, ``POST /v1/envs/batch/step``), each beside its unbatched baseline with as
many sessions. Run:

    .venv/bin/python benchmarks/bench_env_http.py [--env clueprobe|fileqa|both] [--seconds S]
    # where a step's time goes (profile_app, profile_server, profile_fileqa):
    .venv/bin/python benchmarks/bench_env_http.py --profile
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
from envs import RemoteVectorEnv

ENVS = {
    "clueprobe": ("forkyard/ClueProbe-v0", {"max_turns": 5}),
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


async def _http_many(url: str, env_id: str, kwargs: dict, seconds: float, sessions: int, meter=None) -> float:
    """Env steps/s of ``sessions`` sessions, each driven by its own coroutine with one request per step.
    ``meter``: called when the timed window opens and when it closes (the sessions are made before it and
    deleted after it)."""
    # aiohttp as the load generator: httpx's AsyncClient spent more CPU per request than the server
    # here (115 steps/s at 32 sessions against 1,850 with aiohttp on the same server), so it measured itself.
    import aiohttp

    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=sessions)) as c:
        async def post(path, body):
            async with c.post(path, json=body) as r:
                if r.status >= 400:
                    raise RuntimeError(f"POST {path}: HTTP {r.status} {(await r.text())[:300]}")
                return await r.json()

        made = await asyncio.gather(*[post("/v1/envs", {"env_id": env_id, "kwargs": kwargs, "seed": i})
                                      for i in range(sessions)])
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

        if meter:
            meter()
        t0 = time.perf_counter()
        await asyncio.gather(*[drive(m) for m in made])
        rate = count[0] / (time.perf_counter() - t0)
        if meter:
            meter()
        for m in made:
            async with c.delete(f"/v1/envs/{m['session_id']}"):
                pass
        return rate


def http_batched(url: str, env_id: str, kwargs: dict, seconds: float, sessions: int) -> tuple[float, float]:
    """Env steps/s of ``sessions`` sessions stepped together through :class:`RemoteVectorEnv` (one batched
    request per vector step, on one connection), and the p50 ms of one vector step. Sub-envs being reset
    (next-step autoreset) take no step and are not counted, as the unbatched figures count no resets."""
    v = RemoteVectorEnv(env_id, url, sessions, **kwargs)
    try:
        _, infos = v.reset(seed=0)
        ended = [False] * sessions
        n, lat, t0 = 0, [], time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            legal = infos["legal_actions"]
            actions = [legal[i][0] if legal[i] else "" for i in range(sessions)]
            t = time.perf_counter()
            _, _, term, trunc, infos = v.step(actions)
            lat.append(time.perf_counter() - t)
            n += sessions - sum(ended)
            ended = list(term | trunc)
        rate = n / (time.perf_counter() - t0)
    finally:
        v.close()
    return rate, statistics.median(lat) * 1000


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


def _warm(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        _wait_warm(c)


def http_fork(url: str, env_id: str, kwargs: dict, n: int = 40, warm: bool = False) -> tuple[float, float]:
    """p50 / p95 ms of env fork(4) over HTTP. ``warm``: before each fork, wait until the pool is refilled
    (``min_idle`` idle sandboxes, no start in flight) (released sandboxes are destroyed and replaced, so
    back-to-back forks would time container starts instead: that sustained rate is the steps/s figure's business)."""
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


# ---------------------------------------------------------------------------------------------- profile
def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds all processes of the machine have used so far (``/proc/stat``, idle and iowait excluded)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class _Spans:
    """Seconds spent in wrapped functions, by label (sync or async), for in-process timing spans."""

    def __init__(self):
        self.total: dict[str, float] = {}
        self._undo: list = []

    def wrap(self, owner, name: str, label: str) -> None:
        import functools
        import inspect

        fn = getattr(owner, name)
        spans = self

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def timed(*a, **k):
                t = time.perf_counter()
                try:
                    return await fn(*a, **k)
                finally:
                    spans.total[label] = spans.total.get(label, 0.0) + time.perf_counter() - t
        else:
            @functools.wraps(fn)
            def timed(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    spans.total[label] = spans.total.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))

    def undo(self) -> None:
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)
        self._undo.clear()


async def _asgi_call(app, path: str, body: bytes) -> tuple[int, bytes]:
    """One POST through the ASGI app itself (no socket, no uvicorn): the app's own share of a request."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "state": {},
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    out: list[dict] = []

    async def receive():
        if pending:
            return pending.pop()
        await asyncio.sleep(3600)

    async def send(message):
        out.append(message)

    await app(scope, receive, send)
    return out[0]["status"], b"".join(m.get("body", b"") for m in out[1:])


def profile_app(n_single: int = 3000, n_batch: int = 300) -> None:
    """Where a ClueProbe step's time goes inside the server's app (in-process, timing spans, no sockets):
    one request per step (``POST /v1/envs/{id}/step``) and one per 32 steps (``POST /v1/envs/batch/step``)."""
    import orjson
    import starlette.requests
    import fastapi.routing
    from envs.clueprobe import ClueProbeEnv
    from sandbox_server.app import create_env_app

    app = create_env_app()

    async def run() -> None:
        async with app.router.lifespan_context(app):
            made = await _asgi_call(app, "/v1/envs/batch/create", orjson.dumps(
                {"items": [{"env_id": "forkyard/ClueProbe-v0", "kwargs": {"max_turns": 64}, "seed": i}
                           for i in range(32)]}))
            sids = [r["result"]["session_id"] for r in orjson.loads(made[1])["results"]]
            reset = orjson.dumps({"items": [{"session_id": s, "seed": 0} for s in sids]})
            cases = [("one request per step", f"/v1/envs/{sids[0]}/step", orjson.dumps({"action": "probe(0)"}), 1,
                      n_single),
                     ("one request per 32 steps", "/v1/envs/batch/step",
                      orjson.dumps({"items": [{"session_id": s, "action": "probe(0)"} for s in sids]}), 32, n_batch)]
            for name, path, body, steps, n in cases:
                spans = _Spans()
                spans.wrap(starlette.requests.Request, "json", "read body + json.loads")
                spans.wrap(fastapi.routing, "solve_dependencies", "validate (pydantic) + dependencies")
                spans.wrap(fastapi.routing, "run_endpoint_function", "handler")
                spans.wrap(ClueProbeEnv, "step", "env.step")
                total = 0.0
                for k in range(n + n // 10):
                    if k % 60 == 0:
                        await _asgi_call(app, "/v1/envs/batch/reset", reset)
                    if k == n // 10:  # warm-up done
                        spans.total.clear()
                        total = 0.0
                    t = time.perf_counter()
                    status, _ = await _asgi_call(app, path, body)
                    total += time.perf_counter() - t
                    assert status == 200
                spans.undo()
                per = {k: v / n * 1e6 for k, v in spans.total.items()}
                app_us = total / n * 1e6
                handler_rest = per["handler"] - per["env.step"]
                rest = (app_us - per["handler"] - per["validate (pydantic) + dependencies"]
                        - per["read body + json.loads"])
                print(f"  {name} ({steps} step{'s' * (steps > 1)}): app {app_us:.0f} us per request, "
                      f"{app_us / steps:.1f} us per step")
                for label, us in [("env.step (ClueProbe itself)", per["env.step"]),
                                  ("handler besides env.step (lookup, lock, checks, orjson)", handler_rest),
                                  ("validate (pydantic) + dependencies", per["validate (pydantic) + dependencies"]),
                                  ("read body + json.loads", per["read body + json.loads"]),
                                  ("middleware, routing, response (ASGI)", rest)]:
                    print(f"    {label:<58} {us:>7.1f} us  ({us / app_us:>4.0%})")

    asyncio.run(run())


def profile_server(url: str, pid: int, n_single: int = 2000, n_batch: int = 300) -> None:
    """Server CPU per request measured from ``/proc`` (uvicorn, the app, the kernel's share of its syscalls),
    and the client's CPU, for single and batched ClueProbe steps over loopback."""
    import http.client
    from urllib.parse import urlsplit

    import orjson

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port)

    def post(path: str, body: bytes) -> bytes:
        conn.request("POST", path, body=body, headers={"content-type": "application/json"})
        return conn.getresponse().read()

    made = orjson.loads(post("/v1/envs/batch/create", orjson.dumps(
        {"items": [{"env_id": "forkyard/ClueProbe-v0", "kwargs": {"max_turns": 64}, "seed": i} for i in range(32)]})))
    sids = [r["result"]["session_id"] for r in made["results"]]
    reset = orjson.dumps({"items": [{"session_id": s, "seed": 0} for s in sids]})
    for name, path, body, steps, n in [
            ("one request per step", f"/v1/envs/{sids[0]}/step", orjson.dumps({"action": "probe(0)"}), 1, n_single),
            ("one request per 32 steps", "/v1/envs/batch/step",
             orjson.dumps({"items": [{"session_id": s, "action": "probe(0)"} for s in sids]}), 32, n_batch)]:
        srv = cli = 0.0
        for k in range(n):
            if k % 60 == 0:
                post("/v1/envs/batch/reset", reset)
            s0, c0 = _cpu_s(pid), time.process_time()
            post(path, body)
            srv += _cpu_s(pid) - s0
            cli += time.process_time() - c0
        print(f"  {name} ({steps} step{'s' * (steps > 1)}): server process {srv / n * 1e6:.0f} us CPU per request "
              f"({srv / n / steps * 1e6:.1f} us per step); client (http.client) {cli / n * 1e6:.0f} us")
    post("/v1/envs/batch/delete", orjson.dumps({"items": [{"session_id": s} for s in sids]}))
    conn.close()


def profile_fileqa(url: str, pid: int, seconds: float, sessions: int, backend: str) -> None:
    """Where FileQA's time goes: an in-process step's timing spans (env code, the sandbox service, the agent
    round trip, the tool process as the agent timed it), and during a batched run over HTTP, the CPU of the
    server process against the rest of the machine (sandbox agents and their tool processes, the client)."""
    from envs.fileqa import FileQAEnv
    from sandbox_server.backends.base import AgentBackend
    from sandbox_server.service import SandboxService

    env = gym.make(ENVS["fileqa"][0], disable_env_checker=True, backend=backend, **ENVS["fileqa"][1]).unwrapped
    _, info = env.reset(seed=0)
    spans = _Spans()
    spans.wrap(FileQAEnv, "step", "env.step")
    spans.wrap(SandboxService, "exec", "service.exec")
    spans.wrap(AgentBackend, "exec", "agent round trip")
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        obs, r, te, tr, info = env.step(_action(info))
        n += 1
        if te or tr:
            _, info = env.reset()
    env.close()
    spans.undo()
    per = {k: v / n * 1e3 for k, v in spans.total.items()}
    print(f"  in-process FileQA step ({backend} backend): {per['env.step']:.2f} ms")
    print(f"    env code besides the tool call       {per['env.step'] - per['service.exec']:.2f} ms")
    print(f"    sandbox service (checks, lock)       {per['service.exec'] - per['agent round trip']:.2f} ms")
    print(f"    agent round trip (JSON line, spawn + run the tool process, answer) {per['agent round trip']:.2f} ms")
    marks: list[tuple[float, float, float, float]] = []
    rate = asyncio.run(_http_many(
        url, ENVS["fileqa"][0], ENVS["fileqa"][1], seconds, sessions,
        meter=lambda: marks.append((_machine_busy_s(), _cpu_s(pid), time.process_time(), time.perf_counter()))))
    (m0, s0, c0, t0), (m1, s1, c1, t1) = marks
    steps = rate * (t1 - t0)
    _fileqa_cpu_line(f"unbatched over HTTP ({sessions} sessions, aiohttp)", sessions, steps, m1 - m0, s1 - s0,
                     c1 - c0, t1 - t0)
    _warm(url)
    vec = RemoteVectorEnv(ENVS["fileqa"][0], url, sessions, **ENVS["fileqa"][1])
    try:
        _, infos = vec.reset(seed=0)
        ended, steps = [False] * sessions, 0
        m0, s0, c0, t0 = _machine_busy_s(), _cpu_s(pid), time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            legal = infos["legal_actions"]
            _, _, term, trunc, infos = vec.step([legal[i][0] if legal[i] else "" for i in range(sessions)])
            steps += sessions - sum(ended)
            ended = list(term | trunc)
        m1, s1, c1, t1 = _machine_busy_s(), _cpu_s(pid), time.process_time(), time.perf_counter()
    finally:
        vec.close()
    _fileqa_cpu_line(f"batched over HTTP ({sessions} sessions)", sessions, steps, m1 - m0, s1 - s0, c1 - c0, t1 - t0)


def _fileqa_cpu_line(what: str, sessions: int, steps: float, busy: float, srv: float, cli: float, wall: float) -> None:
    per = 1e3 / steps
    print(f"  {what}: {steps / wall:,.0f} steps/s, {busy / wall:.2f} of {os.cpu_count()} cores busy; machine CPU "
          f"{busy * per:.2f} ms per step = server process {srv * per:.2f} + client {cli * per:.2f} + the rest "
          f"(sandbox agents and their tool processes, pool refills, other load) {(busy - srv - cli) * per:.2f}")


def main(argv: list[str] | None = None) -> None:
    for var in ("FORKYARD_API_KEY", "FORKYARD_API_KEY_FILE"):  # its own loopback servers; raw clients send no key
        os.environ.pop(var, None)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", choices=["clueprobe", "fileqa", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--url", default=None, help="measure an existing server (e.g. docker compose up) instead")
    ap.add_argument("--backend", default="local", help="FileQA's sandbox backend in-process (local or docker)")
    ap.add_argument("--profile", action="store_true", help="print where a step's time goes instead of the figures")
    ap.add_argument("--max-total", type=int, default=48, help="the started server's sandbox pool size: FileQA "
                    "holds one sandbox per session (--sessions of them at once), plus --min-idle")
    args = ap.parse_args(argv)
    server = None
    if args.url:
        url = args.url.rstrip("/")
    else:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "sandbox_server", "--port", str(port), "--backend", args.backend, "--min-idle", "8",
             "--max-total", str(args.max_total), "--log-level", "warning"],
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
        if args.profile:
            if server is None:
                raise SystemExit("--profile measures a server it starts itself (no --url)")
            if "clueprobe" in names:
                print("ClueProbe step, inside the app (in-process ASGI calls, timing spans):")
                profile_app()
                print("ClueProbe step, whole server process over loopback (/proc CPU accounting):")
                profile_server(url, server.pid)
            if "fileqa" in names:
                print("FileQA step:")
                _warm(url)
                profile_fileqa(url, server.pid, args.seconds, args.sessions, args.backend)
            return
        print(f"env steps over HTTP to {where}; FileQA sandbox backend {args.backend}; {args.seconds:g} s per figure")
        for name in names:
            env_id, kw = ENVS[name]
            # in-process FileQA takes the backend as a kwarg; over HTTP the server's --backend decides
            local = in_process(env_id, {**kw, "backend": args.backend} if name == "fileqa" else kw, args.seconds)
            one, p50 = http_one(url, env_id, kw, args.seconds)
            one_async = asyncio.run(_http_many(url, env_id, kw, args.seconds, 1))
            # FileQA holds one sandbox per session: 8 (the older figure) and --sessions, within --max-total.
            n_sessions = args.sessions if name == "clueprobe" else min(args.sessions, 8)
            many = asyncio.run(_http_many(url, env_id, kw, args.seconds, n_sessions))
            if name == "fileqa" and n_sessions != args.sessions:
                if not args.url:
                    _warm(url)
                many_all = asyncio.run(_http_many(url, env_id, kw, args.seconds, args.sessions))
            else:
                many_all = many
            if name == "fileqa" and not args.url:
                _warm(url)
            batched, b50 = http_batched(url, env_id, kw, args.seconds, args.sessions)
            f50, f95 = http_fork(url, env_id, kw, warm=name == "fileqa")
            print(f"{env_id}:")
            print(f"  in-process:                 {local:>10,.0f} steps/s")
            print(f"  HTTP, 1 session (httpx):    {one:>10,.0f} steps/s  "
                  f"(p50 {p50:.2f} ms; in-process / HTTP = {local / one:.1f}x)")
            print(f"  HTTP, 1 session (aiohttp):  {one_async:>10,.0f} steps/s  "
                  f"(in-process / HTTP = {local / one_async:.1f}x)")
            print(f"  HTTP, {n_sessions:>2} sessions (aiohttp): {many:>10,.0f} steps/s  "
                  f"(in-process / HTTP = {local / many:.1f}x)")
            if many_all is not many:
                print(f"  HTTP, {args.sessions:>2} sessions (aiohttp): {many_all:>10,.0f} steps/s  "
                      f"(in-process / HTTP = {local / many_all:.1f}x)")
            print(f"  HTTP, {args.sessions:>2} sessions batched:  {batched:>10,.0f} steps/s  "
                  f"(p50 {b50:.2f} ms per batch; "
                  f"batched / unbatched = {batched / many_all:.1f}x; in-process / HTTP = {local / batched:.1f}x)")
            warm_note = " (pool refilled before each fork)" if name == "fileqa" else ""
            print(f"  env fork(4) over HTTP:      p50 {f50:.2f} ms, p95 {f95:.2f} ms{warm_note}")
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
