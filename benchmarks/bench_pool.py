"""Sustained sandbox throughput: acquisitions per second with recycling on against destroy-and-replace.

Run: ``.venv/bin/python benchmarks/bench_pool.py [--backend docker|local|both] [--n 2000] [--n-off 40]
[--workers 8]`` (docker needs the sandbox image: ``scripts/build-images.sh``). Prints, per backend, the
rate of a loop of ``service.create()`` + ``service.delete()`` (what an env episode does with its sandbox),
run by one thread and by ``--workers`` threads at once, with ``recycle=True`` (the default) and with
``recycle=False`` (the baseline: every released sandbox destroyed and replaced), both measured in the same
run with the same pool sizes (``min_idle=2``, ``max_total=16``, ``max_sandbox_uses`` at its default, so
the recycled figures include the starts that replace worn-out sandboxes). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_server.backends import BACKENDS, make_backend  # noqa: E402
from sandbox_server.service import SandboxService, ServiceConfig  # noqa: E402


def loop(svc: SandboxService, n: int, workers: int) -> float:
    """``n`` create + delete pairs split over ``workers`` threads; returns acquisitions per second."""
    counts = [n // workers + (i < n % workers) for i in range(workers)]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(k):
                svc.delete(svc.create().id)
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in counts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return n / dt


def settle(svc: SandboxService, limit_s: float = 60.0) -> None:
    """Wait until the pool is back at rest (min_idle idle, nothing starting or being recycled)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        st = svc.pool.status()
        if st["idle"] >= svc.pool.min_idle and st["starting"] == 0 and st["recycling"] == 0 and st["busy"] == 0:
            return
        time.sleep(0.05)


def bench_backend(kind: str, n: int, n_off: int, workers: int) -> dict:
    print(f"\n== backend: {kind} ==")
    out: dict = {}
    for recycle in (True, False):
        cfg = ServiceConfig(min_idle=2, max_total=16, recycle=recycle)
        svc = SandboxService(make_backend(kind, server_name="bench-pool"), cfg).start()
        try:
            label = "recycled" if recycle else "destroyed (baseline)"
            for w in (1, workers):
                settle(svc)
                m = svc.metrics.registry.get_sample_value
                rec0, fail0, ret0 = (m("forkyard_sandboxes_recycled_total") or 0,
                                     m("forkyard_recycle_failures_total") or 0,
                                     m("forkyard_sandboxes_retired_total") or 0)
                s0, c0 = m("forkyard_recycle_seconds_sum") or 0, m("forkyard_recycle_seconds_count") or 0
                iters = n if recycle else n_off
                rate = loop(svc, iters, w)
                out[(recycle, w)] = rate
                extra = ""
                if recycle:
                    settle(svc)
                    s1, c1 = m("forkyard_recycle_seconds_sum") or 0, m("forkyard_recycle_seconds_count") or 0
                    extra = (f"   recycled {int((m('forkyard_sandboxes_recycled_total') or 0) - rec0)}, "
                             f"failed {int((m('forkyard_recycle_failures_total') or 0) - fail0)}, "
                             f"retired {int((m('forkyard_sandboxes_retired_total') or 0) - ret0)}, "
                             f"reset+verify mean {(s1 - s0) / max(1, c1 - c0) * 1000:.2f} ms")
                print(f"  {label:<22} {w} thread{'s' if w > 1 else ' '}  {rate:9.1f} acquisitions/s  "
                      f"(n={iters}){extra}")
        finally:
            svc.close()
    for w in (1, workers):
        ratio = out[(True, w)] / out[(False, w)]
        print(f"  ratio, {w} thread{'s' if w > 1 else ''}: recycled / destroyed = {ratio:.0f}x")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=[*sorted(BACKENDS), "both"], default="both")
    ap.add_argument("--n", type=int, default=2000, help="create + delete pairs per measurement, recycling on")
    ap.add_argument("--n-off", type=int, default=40, help="create + delete pairs per measurement, recycling off")
    ap.add_argument("--workers", type=int, default=8, help="threads of the concurrent measurement")
    ns = ap.parse_args()
    print(f"bench_pool: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
          f"max_sandbox_uses {ServiceConfig().max_sandbox_uses}")
    for kind in (["local", "docker"] if ns.backend == "both" else [ns.backend]):
        bench_backend(kind, ns.n, ns.n_off, ns.workers)


if __name__ == "__main__":
    main()
