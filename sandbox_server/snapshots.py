"""Stored snapshots of a :class:`~sandbox_server.service.SandboxService`: plain data (the tar of a sandbox's
writable areas and its session state) kept for a TTL, with a bound on the bytes all of them hold together.

The TTL is measured on the monotonic clock (``time.monotonic()``): a step of the wall clock (NTP, a VM
resume) neither expires a snapshot early nor keeps it late (field case S32). The wall times ``created_at``
and ``expires_at`` are for people (:class:`~sandbox_server.models.SnapshotInfo`) and decide nothing."""

from __future__ import annotations

import io
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sandbox_server.agent import SESSION_MEMBER

from sandbox_server.errors import LimitExceeded, SandboxNotFound
from sandbox_server.models import SessionState, SnapshotInfo


def without_interpreter_state(data: bytes) -> bytes:
    """``data`` (a snapshot's tar) without its interpreter state (the member ``SESSION_MEMBER``, which the agent's
    ``pack`` writes last), for a rollback that resumes the sandbox's own waiting copy and needs only the areas; the
    tar unchanged when it has none or cannot be read. The member's bytes never cross the agent's pipe then."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = tar.getmembers()  # headers only: the data is skipped over
    except tarfile.TarError:
        return data
    last = members[-1] if members else None
    if last is None or last.name != SESSION_MEMBER:
        return data
    return data[:last.offset] + bytes(2 * tarfile.BLOCKSIZE)  # the end-of-archive marker


@dataclass
class StoredSnapshot:
    """One stored snapshot. ``created_at`` and ``expires_at`` are wall times (seconds since the epoch, shown
    to people); ``deadline`` is the ``time.monotonic()`` value at which it expires (what decides)."""

    id: str
    source: str
    data: bytes
    state: SessionState
    created_at: float
    expires_at: float
    deadline: float
    #: The name under which the source sandbox keeps a waiting copy of its live interpreter taken with this
    #: snapshot (a rollback of that sandbox resumes it), or None.
    mark: str | None = None
    #: The same areas frozen in place into a copy-on-write layer (:class:`~sandbox_server.backends.layers.LayerRef`,
    #: a root server): a rollback or a clone stands the sandbox on it instead of unpacking ``data``. None elsewhere.
    layer: Any = None

    def info(self) -> SnapshotInfo:
        """Its :class:`SnapshotInfo` (the state copied)."""
        return SnapshotInfo(id=self.id, source_sandbox=self.source, size_bytes=len(self.data),
                            state=self.state.model_copy(deep=True), created_at=self.created_at,
                            expires_at=self.expires_at)


class SnapshotStore:
    """Snapshots by id, each kept until its expiry, all together at most ``max_bytes`` of tars. Thread-safe.

    Args:
        max_bytes: the most bytes the live snapshots' tars may hold together.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._snapshots: dict[str, StoredSnapshot] = {}
        self._mu = threading.Lock()

    def __len__(self) -> int:
        return len(self._snapshots)

    def put(self, source: str, data: bytes, state: SessionState, ttl_s: float,
            mark: str | None = None, layer: Any = None) -> StoredSnapshot:
        """Store a snapshot of sandbox ``source`` for ``ttl_s`` seconds (``layer``: :attr:`StoredSnapshot.layer`).

        Raises:
            LimitExceeded: it would take the live snapshots past ``max_bytes`` (nothing is stored).
        """
        wall, now = time.time(), time.monotonic()
        snap = StoredSnapshot(id="snap-" + uuid.uuid4().hex[:16], source=source, data=data, state=state,
                              created_at=wall, expires_at=wall + ttl_s, deadline=now + ttl_s, mark=mark,
                              layer=layer)
        with self._mu:
            held = sum(len(v.data) for v in self._snapshots.values() if v.deadline > now)
            if held + len(data) > self.max_bytes:
                raise LimitExceeded(
                    f"stored snapshots hold {held} bytes and this one has {len(data)}: the bound is "
                    f"{self.max_bytes} bytes (FORKYARD_MAX_SNAPSHOT_BYTES); delete snapshots "
                    f"(DELETE /v1/snapshots/{{id}}) or wait for their TTL")
            self._snapshots[snap.id] = snap
        return snap

    def get(self, snapshot_id: str) -> StoredSnapshot:
        """The live snapshot ``snapshot_id``. Raises SandboxNotFound (unknown, deleted or expired)."""
        snap = self._snapshots.get(snapshot_id)
        if snap is None or snap.deadline <= time.monotonic():
            raise SandboxNotFound(f"no snapshot {snapshot_id!r} (deleted, expired, or never taken)")
        return snap

    def delete(self, snapshot_id: str) -> None:
        """Forget a snapshot. Raises SandboxNotFound."""
        with self._mu:
            if self._snapshots.pop(snapshot_id, None) is None:
                raise SandboxNotFound(f"no snapshot {snapshot_id!r}")

    def expire(self, now: float | None = None) -> int:
        """Forget the snapshots expired at ``now`` (a ``time.monotonic()`` value; default: now); returns how many."""
        now = time.monotonic() if now is None else now
        with self._mu:
            old = [k for k, v in self._snapshots.items() if v.deadline <= now]
            for k in old:
                del self._snapshots[k]
        return len(old)

    def clear(self) -> None:
        """Forget every snapshot."""
        with self._mu:
            self._snapshots.clear()


__all__ = ["SnapshotStore", "StoredSnapshot"]
