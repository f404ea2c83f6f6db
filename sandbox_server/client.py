"""Typed HTTP clients of the sandbox service: :class:`SandboxClient` (sync) and :class:`AsyncSandboxClient`.

Both have the same method names and models as :class:`sandbox_server.service.SandboxService`, and raise
the same errors: :class:`ToolRefused` (422), :class:`SandboxNotFound` (404), :class:`ServiceUnavailable`
(503, ``retry_after_s`` from ``Retry-After``), :class:`LimitExceeded` (413: a body over the server's
limit, or a bounded resource that would overflow), :class:`SandboxError` (anything else unexpected).
Error bodies are the server's ``ErrorBody`` ``{"detail": str, "status": str}``.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx

from sandbox_server.errors import LimitExceeded, SandboxError, SandboxNotFound, ServiceUnavailable, ToolRefused
from sandbox_server.models import (
    CloneResponse, Health, PoolStatus, SandboxInfo, SandboxList, SnapshotInfo, ToolList,
)
from sandbox_server.tools import ToolResult, ToolSpec


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        detail = body.get("detail") if isinstance(body, dict) else body
    except ValueError:
        detail = resp.text
    if not isinstance(detail, str):
        detail = str(detail)
    if resp.status_code == 413:
        raise LimitExceeded(detail)
    if resp.status_code == 422:
        raise ToolRefused(detail)
    if resp.status_code == 404:
        raise SandboxNotFound(detail)
    if resp.status_code == 503:
        try:
            retry = float(resp.headers.get("Retry-After", "1"))
        except ValueError:
            retry = 1.0
        raise ServiceUnavailable(detail, retry_after_s=retry)
    raise SandboxError(f"HTTP {resp.status_code}: {detail}")


def _files_body(files: dict[str, bytes]) -> dict[str, Any]:
    return {"files": {k: base64.b64encode(v).decode("ascii") for k, v in files.items()}, "encoding": "base64"}


def _create_body(cwd, env, metadata, files) -> dict[str, Any]:
    body: dict[str, Any] = {"cwd": cwd, "env": env, "metadata": metadata}
    if files:
        body.update(_files_body(files))
    return body


class SandboxClient:
    """Synchronous client. ``base_url`` like ``http://127.0.0.1:8000``; ``timeout_s``: HTTP timeout in seconds
    for calls without their own deadline (tool calls wait their ``timeout_s`` plus 30 s)."""

    def __init__(self, base_url: str, timeout_s: float = 60.0, http: httpx.Client | None = None):
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout_s)
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _req(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            resp = self.http.request(method, url, **kw)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"the sandbox server did not answer: {exc}", retry_after_s=1.0) from None
        _raise_for(resp)
        return resp

    def health(self) -> Health:
        return Health.model_validate(self._req("GET", "/healthz").json())

    def tools(self) -> list[ToolSpec]:
        return ToolList.model_validate(self._req("GET", "/v1/tools").json()).tools

    def pool_status(self) -> PoolStatus:
        return PoolStatus.model_validate(self._req("GET", "/v1/pool").json())

    def create(self, cwd: str | None = None, env: dict[str, str] | None = None, metadata: dict[str, Any] | None = None,
               files: dict[str, bytes] | None = None) -> SandboxInfo:
        return SandboxInfo.model_validate(self._req("POST", "/v1/sandboxes", json=_create_body(cwd, env, metadata, files)).json())

    def get(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.model_validate(self._req("GET", f"/v1/sandboxes/{sandbox_id}").json())

    def list(self) -> list[SandboxInfo]:
        return SandboxList.model_validate(self._req("GET", "/v1/sandboxes").json()).sandboxes

    def delete(self, sandbox_id: str) -> None:
        self._req("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def exec(self, sandbox_id: str, tool: str, args: dict[str, Any] | None = None,
             timeout_s: float | None = None) -> ToolResult:
        wait = (timeout_s if isinstance(timeout_s, (int, float)) and 0 < timeout_s < 1e6 else 60.0) + 30.0
        resp = self._req("POST", f"/v1/sandboxes/{sandbox_id}/exec",
                         json={"tool": tool, "args": args or {}, "timeout_s": timeout_s}, timeout=wait)
        return ToolResult.model_validate(resp.json())

    def write_files(self, sandbox_id: str, files: dict[str, bytes]) -> None:
        self._req("PUT", f"/v1/sandboxes/{sandbox_id}/files", json=_files_body(files))

    def update_state(self, sandbox_id: str, cwd: str | None = None, env: dict[str, str] | None = None,
                     metadata: dict[str, Any] | None = None) -> SandboxInfo:
        resp = self._req("PATCH", f"/v1/sandboxes/{sandbox_id}/state", json={"cwd": cwd, "env": env, "metadata": metadata})
        return SandboxInfo.model_validate(resp.json())

    def snapshot(self, sandbox_id: str, ttl_s: float | None = None) -> SnapshotInfo:
        return SnapshotInfo.model_validate(self._req("POST", f"/v1/sandboxes/{sandbox_id}/snapshot", json={"ttl_s": ttl_s}).json())

    def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        return SnapshotInfo.model_validate(self._req("GET", f"/v1/snapshots/{snapshot_id}").json())

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._req("DELETE", f"/v1/snapshots/{snapshot_id}")

    def clone(self, snapshot_id: str, n: int = 1) -> list[SandboxInfo]:
        return CloneResponse.model_validate(self._req("POST", f"/v1/snapshots/{snapshot_id}/clone", json={"n": n}).json()).sandboxes

    def fork(self, sandbox_id: str, n: int = 1) -> list[SandboxInfo]:
        return CloneResponse.model_validate(self._req("POST", f"/v1/sandboxes/{sandbox_id}/fork", json={"n": n}).json()).sandboxes


class AsyncSandboxClient:
    """Asynchronous client with the same methods as :class:`SandboxClient` (each a coroutine)."""

    def __init__(self, base_url: str, timeout_s: float = 60.0, http: httpx.AsyncClient | None = None):
        self.http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout_s)
        self.timeout_s = timeout_s

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> "AsyncSandboxClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _req(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            resp = await self.http.request(method, url, **kw)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"the sandbox server did not answer: {exc}", retry_after_s=1.0) from None
        _raise_for(resp)
        return resp

    async def health(self) -> Health:
        return Health.model_validate((await self._req("GET", "/healthz")).json())

    async def tools(self) -> list[ToolSpec]:
        return ToolList.model_validate((await self._req("GET", "/v1/tools")).json()).tools

    async def pool_status(self) -> PoolStatus:
        return PoolStatus.model_validate((await self._req("GET", "/v1/pool")).json())

    async def create(self, cwd: str | None = None, env: dict[str, str] | None = None,
                     metadata: dict[str, Any] | None = None, files: dict[str, bytes] | None = None) -> SandboxInfo:
        resp = await self._req("POST", "/v1/sandboxes", json=_create_body(cwd, env, metadata, files))
        return SandboxInfo.model_validate(resp.json())

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo.model_validate((await self._req("GET", f"/v1/sandboxes/{sandbox_id}")).json())

    async def list(self) -> list[SandboxInfo]:
        return SandboxList.model_validate((await self._req("GET", "/v1/sandboxes")).json()).sandboxes

    async def delete(self, sandbox_id: str) -> None:
        await self._req("DELETE", f"/v1/sandboxes/{sandbox_id}")

    async def exec(self, sandbox_id: str, tool: str, args: dict[str, Any] | None = None,
                   timeout_s: float | None = None) -> ToolResult:
        wait = (timeout_s if isinstance(timeout_s, (int, float)) and 0 < timeout_s < 1e6 else 60.0) + 30.0
        resp = await self._req("POST", f"/v1/sandboxes/{sandbox_id}/exec",
                               json={"tool": tool, "args": args or {}, "timeout_s": timeout_s}, timeout=wait)
        return ToolResult.model_validate(resp.json())

    async def write_files(self, sandbox_id: str, files: dict[str, bytes]) -> None:
        await self._req("PUT", f"/v1/sandboxes/{sandbox_id}/files", json=_files_body(files))

    async def update_state(self, sandbox_id: str, cwd: str | None = None, env: dict[str, str] | None = None,
                           metadata: dict[str, Any] | None = None) -> SandboxInfo:
        resp = await self._req("PATCH", f"/v1/sandboxes/{sandbox_id}/state", json={"cwd": cwd, "env": env, "metadata": metadata})
        return SandboxInfo.model_validate(resp.json())

    async def snapshot(self, sandbox_id: str, ttl_s: float | None = None) -> SnapshotInfo:
        resp = await self._req("POST", f"/v1/sandboxes/{sandbox_id}/snapshot", json={"ttl_s": ttl_s})
        return SnapshotInfo.model_validate(resp.json())

    async def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        return SnapshotInfo.model_validate((await self._req("GET", f"/v1/snapshots/{snapshot_id}")).json())

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._req("DELETE", f"/v1/snapshots/{snapshot_id}")

    async def clone(self, snapshot_id: str, n: int = 1) -> list[SandboxInfo]:
        resp = await self._req("POST", f"/v1/snapshots/{snapshot_id}/clone", json={"n": n})
        return CloneResponse.model_validate(resp.json()).sandboxes

    async def fork(self, sandbox_id: str, n: int = 1) -> list[SandboxInfo]:
        resp = await self._req("POST", f"/v1/sandboxes/{sandbox_id}/fork", json={"n": n})
        return CloneResponse.model_validate(resp.json()).sandboxes
