"""How many sandboxes one host holds: start N sessions, then measure memory and tool-call latency at that count.

For the chosen backend (docker by default) this starts a :class:`SandboxService` sized for N sandboxes,
creates N sessions, and prints

* the host memory they take: ``MemAvailable`` of /proc/meminfo before and while they are held (bytes per
  sandbox: agent, container runtime shim, engine bookkeeping, page cache of their areas);
* the start rate while they were created (sandboxes/s);
* tool-call latency (``cat Lib/abc.py`` through the service, p50 / p95 over random held sandboxes) at N,
  beside the same figure with one sandbox held, measured first in the same run (the baseline).

Run: ``.venv/bin/python benchmarks/bench_density.py [--n 512] [--backend docker|local] [--calls 300]``.
Nothing is asserted; the sandboxes are removed at the end (and by label at the next start if killed).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_server.backends import make_backend  # noqa: E402
from sandbox_server.service import SandboxService  # noqa: E402
from sandbox_server.settings import ServiceConfig  # noqa: E402

ARGS = {"path": "Lib/abc.py"}


def mem_available() -> int:
    """``MemAvailable`` of /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def latency(svc: SandboxService, ids: list[str], calls: int, rng: random.Random) -> tuple[float, float]:
    """(p50, p95) in ms of ``calls`` tool calls on sandboxes drawn from ``ids``."""
    out = []
    for _ in range(calls):
        sid = rng.choice(ids)
        t0 = time.perf_counter()
        res = svc.exec(sid, "cat", ARGS)
        out.append(time.perf_counter() - t0)
        assert res.status == "ok", res
    out.sort()
    return statistics.median(out) * 1e3, out[int(0.95 * (len(out) - 1))] * 1e3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512, help="sandboxes to hold")
    ap.add_argument("--backend", default="docker")
    ap.add_argument("--calls", type=int, default=300, help="tool calls per latency figure")
    ap.add_argument("--starts", type=int, default=4, help="sandbox starts in flight at once")
    args = ap.parse_args(argv)
    rng = random.Random(0)
    cfg = ServiceConfig(min_idle=0, max_total=args.n, max_concurrent_starts=args.starts, acquire_timeout_s=120,
                        idle_ttl_s=3600)
    svc = SandboxService(make_backend(args.backend, server_name=f"bench-density-{os.getpid()}"), cfg).start()
    try:
        first = svc.create().id
        base = latency(svc, [first], args.calls, rng)
        before = mem_available()
        t0 = time.perf_counter()
        ids = [first]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(args.starts) as ex:
            ids += [s.id for s in ex.map(lambda _: svc.create(), range(args.n - 1))]
        start_s = time.perf_counter() - t0
        time.sleep(5)  # let the engine settle
        held = before - mem_available()
        at_n = latency(svc, ids, args.calls, rng)
        print(f"density: backend {args.backend}, {os.cpu_count()} CPUs, "
              f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB RAM")
        print(f"  held sandboxes:                 {len(ids)}")
        print(f"  start rate:                     {(args.n - 1) / start_s:.1f} sandboxes/s "
              f"({args.starts} starts in flight)")
        print(f"  host memory taken:              {held / 2**20:,.0f} MiB in all, "
              f"{held / max(1, args.n - 1) / 2**20:.1f} MiB per sandbox")
        print(f"  tool call with 1 held (base):   p50 {base[0]:.2f} ms   p95 {base[1]:.2f} ms")
        print(f"  tool call with {len(ids)} held:       p50 {at_n[0]:.2f} ms   p95 {at_n[1]:.2f} ms "
              f"({at_n[0] / base[0]:.2f}x the base p50)")
    finally:
        t0 = time.perf_counter()
        svc.close()
        print(f"  closed in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
