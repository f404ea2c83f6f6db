"""Fork of a sandbox whose workspace holds files: fork(8) with a 1 MiB workspace of 200 files, against fork(8) of
the same sandbox with an empty workspace (the baseline, measured in the same run), on each backend.

Run: ``.venv/bin/python benchmarks/bench_workspace_fork.py [--forks 10] [--backend local|docker|both]
[--files 200] [--kib 1024]`` (docker needs the sandbox image: ``scripts/build-images.sh``). The workspace is
``/scratch``: ``--files`` files of random bytes, ``--kib`` KiB in all, in 10 folders. Every fork is checked: each
child's workspace (``export``: a tar of its writable areas) holds the parent's bytes. Prints p50 / p95 of the fork
call in milliseconds, the ratio against the empty workspace, the snapshot's size in bytes, the bytes each copy's own
areas hold right after the fork (their tmpfs, ``statvfs``: what a copy costs in memory beyond the processes), and p50
/ p95 of a rollback (``SandboxService.rollback``: the sandbox put back in place to its stored snapshot after a write).
As root with overlayfs, the populated fork freezes the areas in place into a copy-on-write layer
(``LayeredAreas.freeze``) on either backend; the same fork is also measured without layers: on local by the host copy
(``cp -a`` per child: ``LocalBackend.copy_areas``), on both by the agents' tar. The targets this measures against
(forks of changing state without KVM): fork(8) of this workspace at p50 <= 10 ms on the local backend and <= 50 ms on
docker, a rollback <= 5 ms. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_server.backends import make_backend  # noqa: E402
from sandbox_server.service import SandboxService, ServiceConfig  # noqa: E402

FORK_N = 8


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000


def workspace(files: int, kib: int) -> dict[str, bytes]:
    size = kib * 1024 // files
    return {f"d{i % 10}/f{i:04d}.bin": os.urandom(size) for i in range(files)}


def scratch_files(tar_bytes: bytes) -> dict[str, bytes]:
    """``{path under scratch: bytes}`` of the regular files in an export tar."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for m in tar.getmembers():
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name.split("scratch/", 1)[-1]] = f.read()
    return out


def settle(svc: SandboxService) -> None:
    """Wait (60 s at most) until the pool is full and starts nothing, then 0.3 s more for the recycling of the last
    copies: a fork measured while the pool refills shares the 2 cores with sandbox starts."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        st = svc.pool_status()
        if st.idle >= st.min_idle and st.starting == 0:
            break
        time.sleep(0.01)
    time.sleep(0.3)


def own_bytes(svc: SandboxService, kids: list) -> int | str:
    """Bytes in use in the tmpfs of the first copy's areas (its upper tmpfs under a layer), seen from the host through
    its agent's root (root, local backend); "n/a" elsewhere."""
    backend = svc.backend
    pid = backend._ns_pid(svc._session(kids[0].id).sid) if hasattr(backend, "_ns_pid") else None
    if pid is None:
        return "n/a"
    total = 0
    for area in ("scratch", "tmp"):
        st = os.statvfs(f"/proc/{pid}/root/{area}")
        total += (st.f_blocks - st.f_bfree) * st.f_frsize
    return total


def forked(svc: SandboxService, sid: str, forks: int, content: dict[str, bytes]) -> tuple[list[float], int | str]:
    """``forks`` timed fork(FORK_N) of ``sid`` (seconds each; the pool settled before each), every last child checked
    to hold ``content``; and the bytes of the last fork's first child's own areas (:func:`own_bytes`)."""
    times: list[float] = []
    own: int | str = "n/a"
    for _ in range(forks):
        settle(svc)
        t0 = time.perf_counter()
        kids = svc.fork(sid, FORK_N)
        times.append(time.perf_counter() - t0)
        got = scratch_files(svc.export(kids[-1].id))
        assert all(got.get(p) == b for p, b in content.items()), "a child lacks the parent's workspace"
        own = own_bytes(svc, kids)
        for k in kids:
            svc.delete(k.id)
    return times, own


def bench(kind: str, forks: int, files: dict[str, bytes]) -> None:
    print(f"\n== backend: {kind} ==")
    svc = SandboxService(make_backend(kind, server_name="bench-ws"),
                         ServiceConfig(min_idle=FORK_N + 2, max_total=3 * FORK_N + 4, max_concurrent_starts=2)).start()
    try:
        rows = {}
        for label, content in (("empty workspace (baseline)", {}), (f"{len(files)} files", files)):
            sb = svc.create(files=content or None)
            times, own = forked(svc, sb.id, forks, content)
            snap = svc.snapshot(sb.id)
            size = len(svc.snapshot_bytes(snap.id))
            back = []
            for _ in range(forks):  # rollback: a write after the snapshot, then the sandbox put back in place
                svc.write_files(sb.id, {"after.txt": b"x" * 4096})
                t0 = time.perf_counter()
                svc.rollback(sb.id, snap.id)
                back.append(time.perf_counter() - t0)
            assert "after.txt" not in scratch_files(svc.export(sb.id)), "the rollback left a later file"
            svc.delete_snapshot(snap.id)
            svc.delete(sb.id)
            rows[label] = (pct(times, 0.5), pct(times, 0.95), size)
            print(f"  fork({FORK_N}), {label:<28} p50 {rows[label][0]:8.2f} ms   p95 {rows[label][1]:8.2f} ms   "
                  f"snapshot {size:9d} bytes   a copy's own areas {own} bytes   (n={forks})", flush=True)
            print(f"  rollback, {label:<31} p50 {pct(back, 0.5):8.2f} ms   p95 {pct(back, 0.95):8.2f} ms", flush=True)
        (b50, _, _), (w50, _, _) = list(rows.values())[:2]
        print(f"  ratio: workspace p50 / empty p50 = {w50 / b50:.2f}x")
        # the same fork without layers: on local by the host copy, then (both backends) by the agents' tar
        layered = getattr(svc.backend, "layers_unavailable", "none") is None
        if layered:
            svc.backend.freeze = lambda sid, min_bytes=0: None  # type: ignore[method-assign]
            for how in (("host copy", "agents' tar") if kind == "local" else ("agents' tar",)):
                if how == "agents' tar":
                    svc.backend.copy_areas = lambda src, dst: False  # type: ignore[method-assign]
                sb = svc.create(files=files)
                times, own = forked(svc, sb.id, forks, files)
                svc.delete(sb.id)
                print(f"  fork({FORK_N}), {len(files)} files by the {how:<12} p50 {pct(times, 0.5):8.2f} ms   "
                      f"p95 {pct(times, 0.95):8.2f} ms   a copy's own areas {own} bytes   "
                      f"(layers {w50:.2f} ms: x{pct(times, 0.5) / w50:.2f})")
    finally:
        svc.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forks", type=int, default=10)
    ap.add_argument("--backend", default="both", choices=["local", "docker", "both"])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--kib", type=int, default=1024)
    args = ap.parse_args()
    files = workspace(args.files, args.kib)
    print(f"workspace: {len(files)} files, {sum(map(len, files.values()))} bytes")
    for kind in (["local", "docker"] if args.backend == "both" else [args.backend]):
        bench(kind, args.forks, files)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
