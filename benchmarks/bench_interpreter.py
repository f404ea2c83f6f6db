"""The live interpreter (``run_cell``): a cell's cost, and a rollback that resumes the interpreter's stopped
``os.fork`` copy against rebuilding its state by re-running the cells (the baseline, measured in the same run).

Run: ``.venv/bin/python benchmarks/bench_interpreter.py [--reps 10] [--backend local|docker|both] [--ints 500000]
[--work 0]`` (docker needs the sandbox image: ``scripts/build-images.sh``). The session's state is built by three
cells: a list of ``--ints`` integers, a dict over 100,000 of them, a sum (plus a pure-Python loop of ``--work``
iterations: state slow to rebuild, small to carry); a rollback to the snapshot taken then must show the same sum.
Prints p50 / p95 in milliseconds of: a cell (``x + 1``) beside a ``cat`` call; a snapshot of that sandbox (its
interpreter copied: ``mark``; its state exported) beside a snapshot without the interpreter family; a rollback that
resumes the copy beside a rollback to another sandbox's snapshot (a new interpreter) plus re-running the three
cells; ``fork(4)`` of it (the state carried by value in the snapshot's tar) and each copy's first cell (which takes
the state) beside ``fork(4)`` of a sandbox of the family that never ran a cell plus the three cells re-run in every
copy; and on the local backend the memory its control group is charged before and after the snapshots (up to 8
copies kept). Nothing is asserted but
the state each rollback and each copy brings back.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_server.backends import make_backend  # noqa: E402
from sandbox_server.service import SandboxService, ServiceConfig  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def row(name: str, xs: list[float], base: list[float] | None = None) -> None:
    ratio = f"  x{pct(xs, 0.5) / pct(base, 0.5):.2f} of the baseline" if base else ""
    print(f"  {name:<58} p50 {pct(xs, 0.5):8.2f} ms  p95 {pct(xs, 0.95):8.2f} ms{ratio}")


def charged(svc: SandboxService, sid: str) -> int | None:
    """Bytes the sandbox's memory control group is charged (local backend with groups), else None."""
    group = getattr(svc.backend, "_groups", {}).get(svc._session(sid).sid)
    for d in group.dirs if group else []:
        for name in ("memory.usage_in_bytes", "memory.current"):
            if (d / name).exists():
                return int((d / name).read_text())
    return None


def bench(kind: str, reps: int, ints: int, work: int, a_fork: int = 4) -> None:
    print(f"\n== backend: {kind} ==")
    svc = SandboxService(make_backend(kind, server_name="bench-interp"),
                         ServiceConfig(min_idle=4, max_total=12, max_concurrent_starts=2)).start()
    cells = [f"data = list(range({ints}))", "index = {v: i for i, v in enumerate(data[:100000])}",
             f"total = sum(data) + sum(i * i % 7 for i in range({work}))"]
    try:
        sb = svc.create(cwd="/scratch", families=["interpreter", "workspace"]).id
        plain = svc.create(cwd="/scratch", families=["workspace"]).id
        other = svc.create(cwd="/scratch", families=["interpreter"]).id
        blank = svc.create(cwd="/scratch", families=["interpreter", "workspace"]).id  # no cell ever: nothing carried
        run = lambda code, sid=sb: svc.exec(sid, "run_cell", {"code": code}, timeout_s=30)  # noqa: E731
        for c in cells:
            assert run(c).exit_code == 0
        expected = run("total").stdout
        call = [timed(lambda: svc.exec(sb, "cat", {"path": "/data/manifest.json"})) for _ in range(reps * 3)]
        cell = [timed(lambda: run("x = 1\nx + 1")) for _ in range(reps * 3)]
        row("tool call (cat), the baseline", call)
        row("cell (x + 1)", cell, call)
        snap_plain = [timed(lambda: svc.snapshot(plain)) for _ in range(reps)]
        before = charged(svc, sb)
        snaps, snap_ids = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            snap_ids.append(svc.snapshot(sb).id)
            snaps.append(time.perf_counter() - t0)
        after = charged(svc, sb)
        row("snapshot, no interpreter (baseline)", snap_plain)
        row(f"snapshot with the interpreter copied ({ints} ints held)", snaps, snap_plain)
        resume, rebuild = [], []
        for _ in range(reps):
            run("total = -1; data = None")
            resume.append(timed(lambda: svc.rollback(sb, snap_ids[-1])))
            got = run("total")
            assert got.stdout == expected, f"the resumed interpreter lost its state: {got}"

            def replay() -> None:
                svc.rollback(other, snap_ids[-1])  # another sandbox's snapshot: a new interpreter
                for c in cells:
                    run(c, other)

            rebuild.append(timed(replay))
            assert run("total", other).stdout == expected
        row("rollback + cells re-run in a new interpreter (baseline)", rebuild)
        row("rollback resuming the interpreter's copy", resume, rebuild)
        forks, firsts, replays = [], [], []
        for _ in range(reps):  # fork(n) into other sandboxes: the state by value, taken by each copy's first cell
            t0 = time.perf_counter()
            kids = [k.id for k in svc.fork(sb, a_fork)]
            forks.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for k in kids:
                assert run("total", k).stdout == expected, "a copy lost the state"
            firsts.append(time.perf_counter() - t0)
            for k in kids:
                svc.delete(k)
            t0 = time.perf_counter()
            kids = [k.id for k in svc.fork(blank, a_fork)]
            for k in kids:
                for c in cells:
                    run(c, k)
            replays.append(time.perf_counter() - t0)
            assert run("total", kids[0]).stdout == expected
            for k in kids:
                svc.delete(k)
        both = [f + c for f, c in zip(forks, firsts, strict=True)]
        row(f"fork({a_fork}) + the cells re-run in every copy (baseline)", replays)
        row(f"fork({a_fork}) carrying the state", forks)
        row(f"fork({a_fork}) + each copy's first cell (taking the state)", both, replays)
        if before is not None and after is not None:
            print(f"  memory charged to the sandbox: {before / 2**20:.1f} MiB with the live interpreter, "
                  f"{after / 2**20:.1f} MiB with {min(reps, 8)} waiting copies kept as well")
        for sid in (sb, plain, other, blank):
            svc.delete(sid)
    finally:
        svc.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--backend", choices=["local", "docker", "both"], default="both")
    ap.add_argument("--ints", type=int, default=500000)
    ap.add_argument("--work", type=int, default=0, help="iterations of a pure-Python loop in the third cell "
                    "(state that is slow to rebuild and small to carry)")
    a = ap.parse_args()
    for kind in (["local", "docker"] if a.backend == "both" else [a.backend]):
        bench(kind, a.reps, a.ints, a.work)


if __name__ == "__main__":
    main()
