"""The resource bounds of every sandbox, on every backend, declared once: processes and memory (Docker's
``pids_limit`` / ``mem_limit``, the local backend's control groups) and the check of a file write against the size of
a writable area, made before any sandbox is touched."""

from __future__ import annotations

import re

from sandbox_server.agent import AREA_BYTES, MAX_WRITE_FILES, PAGE_BYTES
from sandbox_server.errors import LimitExceeded

#: Most processes (threads included) one sandbox may hold at once, on every backend (Docker's ``pids_limit``, the
#: local backend's pids control group): a fork bomb stops there.
SANDBOX_PIDS = 128
#: Memory one sandbox may use, on every backend (Docker's ``mem_limit`` format; the local backend's memory control
#: group): user pages and the pages of its tmpfs areas.
SANDBOX_MEMORY = "256m"


def parse_size(text: str | int) -> int:
    """Bytes of a size such as ``"16m"`` (k, m, g: powers of 1024, as the kernel reads tmpfs sizes and Docker its
    ``mem_limit``). Raises ValueError for anything else."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([kmgKMG]?)[bB]?\s*", str(text))
    if not m:
        raise ValueError(f"cannot read the size {text!r}; use bytes or a number with k, m or g")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def check_write_limits(files: dict[str, bytes], area_bytes: int = AREA_BYTES) -> None:
    """Refuse, before any sandbox is touched, a write that cannot fit whatever the area already holds.

    Checks :data:`~sandbox_server.agent.MAX_WRITE_FILES` files per write and the bytes the files take in
    whole :data:`~sandbox_server.agent.PAGE_BYTES` pages against ``area_bytes`` (default 16 MiB). The agent
    checks again against what /scratch holds at the time of the write.

    Raises:
        LimitExceeded: naming the limit (HTTP 413).
    """
    if len(files) > MAX_WRITE_FILES:
        raise LimitExceeded(f"{len(files)} files in one write; the limit is {MAX_WRITE_FILES} files per write; "
                            "nothing was written")
    need = sum(-(-len(v) // PAGE_BYTES) * PAGE_BYTES for v in files.values())
    if need > area_bytes:
        raise LimitExceeded(f"the files need {need} bytes in /scratch ({need / (1 << 20):g} MiB in {PAGE_BYTES}-byte "
                            f"pages); /scratch holds at most {area_bytes} bytes ({area_bytes / (1 << 20):g} MiB); "
                            "nothing was written")


__all__ = ["SANDBOX_MEMORY", "SANDBOX_PIDS", "check_write_limits", "parse_size"]
