"""Pydantic models of every request and response of the sandbox service (HTTP and in-process)."""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, Field

from sandbox_server.tools import ToolResult, ToolSpec

MAX_CLONES = 64


class SessionState(BaseModel):
    """The non-filesystem state of a sandbox: working directory, environment variables, free metadata."""

    cwd: str = "/data"
    env: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class CreateRequest(BaseModel):
    """``POST /v1/sandboxes``: optional initial state and per-episode files (see :class:`WriteFilesRequest`)."""

    cwd: str | None = None
    env: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None
    files: dict[str, str] | None = Field(default=None, description="relative path under /scratch -> content")
    encoding: Literal["utf-8", "base64"] = "utf-8"


class SandboxInfo(BaseModel):
    """A live sandbox: its id, backend, state and times (seconds since the epoch)."""

    id: str
    backend: str
    state: SessionState
    created_at: float
    last_used_at: float
    idle_ttl_s: float


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]


class ExecRequest(BaseModel):
    """``POST /v1/sandboxes/{id}/exec``: ``{"tool": "cat", "args": {"path": "x"}, "timeout_s": 5}``."""

    tool: str = Field(max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=None, description="per-call deadline in seconds (clamped to the maximum)")


class WriteFilesRequest(BaseModel):
    """``PUT /v1/sandboxes/{id}/files``: ``files`` maps a path relative to /scratch to its content."""

    files: dict[str, str]
    encoding: Literal["utf-8", "base64"] = "utf-8"

    def decoded(self) -> dict[str, bytes]:
        """The files as bytes. Raises ValueError on bad base64."""
        if self.encoding == "base64":
            return {k: base64.b64decode(v, validate=True) for k, v in self.files.items()}
        return {k: v.encode("utf-8") for k, v in self.files.items()}


class StateUpdate(BaseModel):
    """``PATCH /v1/sandboxes/{id}/state``: fields given replace the current ones."""

    cwd: str | None = None
    env: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None


class SnapshotRequest(BaseModel):
    ttl_s: float | None = Field(default=None, gt=0, description="seconds the snapshot is kept (default: server's)")


class SnapshotInfo(BaseModel):
    """A stored snapshot: the tar of /scratch and /tmp (``size_bytes``) plus the session state."""

    id: str
    source_sandbox: str
    size_bytes: int
    state: SessionState
    created_at: float
    expires_at: float


class CloneRequest(BaseModel):
    n: int = Field(default=1, ge=1, le=MAX_CLONES)


class ForkRequest(BaseModel):
    n: int = Field(default=1, ge=1, le=MAX_CLONES)


class CloneResponse(BaseModel):
    snapshot_id: str | None = None
    sandboxes: list[SandboxInfo]
    duration_s: float


class PoolStatus(BaseModel):
    """Pool sizes and limits. ``starting`` counts containers being started now."""

    backend: str
    idle: int
    busy: int
    starting: int
    min_idle: int
    max_total: int
    max_concurrent_starts: int
    sessions: int
    snapshots: int
    last_error: str | None = None


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    backend: str
    detail: str = ""


class ToolList(BaseModel):
    tools: list[ToolSpec]
    default_timeout_s: float
    max_timeout_s: float
    output_cap_bytes: int


class ErrorBody(BaseModel):
    """Every 4xx / 5xx answer of the API."""

    detail: str
    status: str | None = None


__all__ = ["SessionState", "CreateRequest", "SandboxInfo", "SandboxList", "ExecRequest", "WriteFilesRequest",
           "StateUpdate", "SnapshotRequest", "SnapshotInfo", "CloneRequest", "ForkRequest", "CloneResponse",
           "PoolStatus", "Health", "ToolList", "ErrorBody", "ToolResult", "ToolSpec"]
