"""Sandbox latency: tool calls and fork(4), each against the naive Docker way measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_sandbox.py [--n 60] [--forks 20] [--backend docker|local|both]``
(needs the sandbox image: ``scripts/build-images.sh``). Prints p50 / p95 in milliseconds and ratios;
nothing is asserted (machines here are noisy).

* tool call: ``cat Lib/abc.py`` through the agent (direct: in-process service; HTTP: the client against
  ``python -m sandbox_server`` on loopback) against ``container.exec_run`` through the docker SDK.
* fork(4): service fork (direct and over HTTP) against ``docker commit`` of the sandbox plus creating and
  starting 4 hardened containers from the committed image.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_server.agent_bundle import SANDBOX_AGENT_PATH  # noqa: E402
from sandbox_server.backends import BACKENDS, make_backend  # noqa: E402
from sandbox_server.client import SandboxClient  # noqa: E402
from sandbox_server.service import SandboxService, ServiceConfig  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000


def report(name: str, xs: list[float]) -> tuple[float, float]:
    p50, p95 = pct(xs, 0.5), pct(xs, 0.95)
    print(f"  {name:<44} p50 {p50:8.2f} ms   p95 {p95:8.2f} ms   (n={len(xs)})")
    return p50, p95


def timed(fn, n: int, between=None) -> list[float]:
    out = []
    for _ in range(n):
        if between:
            between()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def wait_idle(status, k: int, limit_s: float = 30.0) -> None:
    end = time.monotonic() + limit_s
    while status() < k and time.monotonic() < end:
        time.sleep(0.01)


def start_server(port: int, backend: str) -> subprocess.Popen:
    env = {**os.environ, "FORKYARD_SERVER_NAME": "bench-http", "FORKYARD_MIN_IDLE": "8", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sandbox_server", "--backend", backend, "--port", str(port),
                             "--log-level", "warning"], env=env)
    c = SandboxClient(f"http://127.0.0.1:{port}")
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if c.pool_status().idle >= 8:
                break
        except Exception:
            time.sleep(0.1)
    c.close()
    return proc


def bench_backend(kind: str, n: int, forks: int) -> dict:
    print(f"\n== backend: {kind} ==")
    backend = make_backend(kind, server_name="bench")
    svc = SandboxService(backend, ServiceConfig(min_idle=8, max_total=40, max_concurrent_starts=2)).start()
    res: dict = {}
    try:
        sb = svc.create(files={"state.txt": b"x" * 4096})
        svc.exec(sb.id, "cat", {"path": "Lib/abc.py"})
        res["exec_direct"] = report("tool call, direct (service.exec cat)", timed(
            lambda: svc.exec(sb.id, "cat", {"path": "Lib/abc.py"}), n))
        idle = lambda: svc.pool_status().idle  # noqa: E731

        def fork4():
            kids = svc.fork(sb.id, 4)
            fork4.kids = kids

        def cleanup():
            for k in getattr(fork4, "kids", []):
                svc.delete(k.id)
            fork4.kids = []
            wait_idle(idle, 8)

        res["fork_direct"] = report("fork(4), direct (service.fork)", timed(fork4, forks, cleanup))
        cleanup()
        if kind == "docker":
            c = backend.container(svc._session(sb.id).sid)
            c.exec_run(["cat", "/data/Lib/abc.py"])
            res["exec_sdk"] = report("baseline: docker exec_run through the SDK", timed(
                lambda: c.exec_run(["cat", "/data/Lib/abc.py"]), max(10, n // 3)))
            kw = backend.run_kwargs()
            kw["labels"] = {"forkyard.sandbox": "bench-naive"}

            def naive():
                img = c.commit()
                argv = ["python3", "-u", "-I", SANDBOX_AGENT_PATH]
                cs = [backend.client.containers.create(img.id, command=argv, stdin_open=True, detach=True, **kw)
                      for _ in range(4)]
                for x in cs:
                    x.start()
                naive.last = (img, cs)

            def naive_cleanup():
                img, cs = getattr(naive, "last", (None, []))
                for x in cs:
                    x.remove(force=True)
                if img is not None:
                    backend.client.images.remove(img.id, force=True)
                naive.last = (None, [])

            res["fork_naive"] = report("baseline: docker commit + start 4 containers", timed(
                naive, max(5, forks // 2), naive_cleanup))
            naive_cleanup()
        svc.delete(sb.id)
    finally:
        svc.close()

    port = 18700 + (kind == "docker")
    proc = start_server(port, kind)
    try:
        with SandboxClient(f"http://127.0.0.1:{port}") as cl:
            sb = cl.create(files={"state.txt": b"x" * 4096})
            cl.exec(sb.id, "cat", {"path": "Lib/abc.py"})
            res["exec_http"] = report("tool call over HTTP (client.exec cat)", timed(
                lambda: cl.exec(sb.id, "cat", {"path": "Lib/abc.py"}), n))
            kids: list = []

            def hfork():
                kids.extend(cl.fork(sb.id, 4))

            def hclean():
                while kids:
                    cl.delete(kids.pop().id)
                wait_idle(lambda: cl.pool_status().idle, 8)

            res["fork_http"] = report("fork(4) over HTTP (client.fork)", timed(hfork, forks, hclean))
            hclean()
            cl.delete(sb.id)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    if "exec_sdk" in res:
        print(f"  ratio: docker exec_run p50 / direct tool call p50 = "
              f"{res['exec_sdk'][0] / res['exec_direct'][0]:.1f}x; "
              f"/ HTTP tool call p50 = {res['exec_sdk'][0] / res['exec_http'][0]:.1f}x")
        print(f"  ratio: naive commit+4 starts p50 / fork(4) HTTP p50 = "
              f"{res['fork_naive'][0] / res['fork_http'][0]:.1f}x"
              f" (p95 {res['fork_naive'][1] / res['fork_http'][1]:.1f}x); / direct p50 = "
              f"{res['fork_naive'][0] / res['fork_direct'][0]:.1f}x")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=60, help="tool calls per measurement")
    ap.add_argument("--forks", type=int, default=20, help="fork(4) calls per measurement")
    ap.add_argument("--backend", choices=[*sorted(BACKENDS), "both"], default="both")
    ns = ap.parse_args()
    print(f"bench_sandbox: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    for kind in (["local", "docker"] if ns.backend == "both" else [ns.backend]):
        bench_backend(kind, ns.n, ns.forks)


if __name__ == "__main__":
    main()
