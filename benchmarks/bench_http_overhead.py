"""Where an HTTP tool call spends its time: the same ``cat`` measured in layers, each beside the one below.

Starts ``python -m sandbox_server --backend B`` on loopback in a subprocess (its own interpreter, as in
production) and measures, all in one run on one machine:

* ``GET /healthz``: the HTTP floor (httpx client, loopback, uvicorn, FastAPI routing, JSON), no service call;
* ``GET /v1/pool``: the floor plus the typed service dependency and a service call under its lock;
* ``POST /v1/sandboxes/{id}/exec`` (``cat Lib/abc.py``): the full tool call over HTTP;
* ``service.exec`` in this process (a service of its own over the same backend kind): the call without HTTP;
* ``anyio.to_thread.run_sync(no-op)`` on an event loop: the worker-thread hop the server adds per blocking call.

Prints p50 / p95 in milliseconds and the differences, so the HTTP overhead of a tool call reads as
floor + dependency + thread hop + the rest (validation, model serialisation). Nothing is asserted.

Run: ``.venv/bin/python benchmarks/bench_http_overhead.py [--backend local|docker] [--n 300]``
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
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_server.backends import make_backend  # noqa: E402
from sandbox_server.service import SandboxService  # noqa: E402
from sandbox_server.settings import ServiceConfig  # noqa: E402

CAT = {"tool": "cat", "args": {"path": "Lib/abc.py"}}


def pct(samples: list[float]) -> tuple[float, float]:
    """(p50, p95) of ``samples`` (seconds) in milliseconds."""
    s = sorted(samples)
    return statistics.median(s) * 1e3, s[int(0.95 * (len(s) - 1))] * 1e3


def timed(fn, n: int, warm: int = 20) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def thread_hop(n: int) -> list[float]:
    async def run() -> list[float]:
        out = []
        for i in range(n + 20):
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(lambda: None)
            if i >= 20:
                out.append(time.perf_counter() - t0)
        return out
    return asyncio.run(run())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    for var in ("FORKYARD_API_KEY", "FORKYARD_API_KEY_FILE"):  # its own loopback servers; raw clients send no key
        os.environ.pop(var, None)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local", help="sandbox backend of the server and of the direct service")
    ap.add_argument("--n", type=int, default=300, help="calls per figure")
    args = ap.parse_args(argv)
    port = free_port()
    env = {**os.environ, "FORKYARD_SERVER_NAME": f"bench-http-{os.getpid()}"}
    server = subprocess.Popen([sys.executable, "-m", "sandbox_server", "--port", str(port), "--backend", args.backend,
                               "--min-idle", "2", "--log-level", "warning"], cwd=ROOT, env=env)
    rows: list[tuple[str, tuple[float, float]]] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for _ in range(300):
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            sid = http.post("/v1/sandboxes", json={}).json()["id"]
            rows.append(("GET /healthz (HTTP floor)", pct(timed(lambda: http.get("/healthz"), args.n))))
            rows.append(("GET /v1/pool (+ service dependency)", pct(timed(lambda: http.get("/v1/pool"), args.n))))
            rows.append(("POST exec cat over HTTP", pct(timed(
                lambda: http.post(f"/v1/sandboxes/{sid}/exec", json=CAT).raise_for_status(), args.n))))
            http.delete(f"/v1/sandboxes/{sid}")
        svc = SandboxService(make_backend(args.backend, server_name=f"bench-direct-{os.getpid()}"),
                             ServiceConfig(min_idle=1, max_total=4)).start()
        try:
            sb = svc.create()
            in_process = timed(lambda: svc.exec(sb.id, "cat", CAT["args"]), args.n)
            rows.append(("service.exec cat in-process", pct(in_process)))
        finally:
            svc.close()
        rows.append(("anyio.to_thread.run_sync(no-op)", pct(thread_hop(args.n))))
    finally:
        server.terminate()
        server.wait(15)
    print(f"HTTP tool call breakdown, backend {args.backend}, n={args.n} per figure, {os.cpu_count()} CPUs")
    for name, (p50, p95) in rows:
        print(f"  {name:<40} p50 {p50:7.3f} ms   p95 {p95:7.3f} ms")
    d = dict((name, p50) for name, (p50, _) in rows)
    over = d["POST exec cat over HTTP"] - d["service.exec cat in-process"]
    print(f"  HTTP overhead of a tool call (p50 difference): {over:.3f} ms, of which the HTTP floor "
          f"{d['GET /healthz (HTTP floor)']:.3f} ms, dependency + service lock "
          f"{d['GET /v1/pool (+ service dependency)'] - d['GET /healthz (HTTP floor)']:.3f} ms, thread hop "
          f"{d['anyio.to_thread.run_sync(no-op)']:.3f} ms, the rest (validation, models, JSON) "
          f"{over - d['GET /v1/pool (+ service dependency)'] - d['anyio.to_thread.run_sync(no-op)']:.3f} ms")


if __name__ == "__main__":
    main()
