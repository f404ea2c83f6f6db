"""``/v1/sandboxes``: sessions over the warm pool (create, list, get, delete), their files and state."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sandbox_server.deps import Service
from sandbox_server.http_contract import error_responses as R
from sandbox_server.models import CreateRequest, SandboxInfo, SandboxList, StateUpdate, WriteFilesRequest
from sandbox_server.routes import V1
from sandbox_server.work import acquire_deadline_s, on_pool, on_sandbox, on_service, release_sandboxes, run_blocking

router = APIRouter(prefix=V1, tags=["sandboxes"])


@router.post("/sandboxes", response_model=SandboxInfo, status_code=201, responses=R(413, 422, 503))
async def create_sandbox(request: Request, svc: Service, body: CreateRequest | None = None) -> SandboxInfo:
    """Take a warm sandbox for a new session (optionally with per-episode files under /scratch)."""
    body = body or CreateRequest()
    files = WriteFilesRequest(files=body.files, encoding=body.encoding).decoded() if body.files else None
    return await run_blocking(svc.create, cwd=body.cwd, env=body.env, metadata=body.metadata, files=files,
                              families=body.families,
                              deadline_s=acquire_deadline_s(svc.config), request=request, undo=release_sandboxes(svc),
                              queue=on_pool(svc))


@router.get("/sandboxes", response_model=SandboxList, responses=R(503))
async def list_sandboxes(svc: Service) -> SandboxList:
    """Every live session."""
    return SandboxList(sandboxes=svc.list())


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo, responses=R(404, 503))
async def get_sandbox(sandbox_id: str, svc: Service) -> SandboxInfo:
    """One session's state."""
    return svc.get(sandbox_id)


@router.delete("/sandboxes/{sandbox_id}", status_code=204, responses=R(404, 503))
async def delete_sandbox(sandbox_id: str, svc: Service) -> Response:
    """End a session; its sandbox is destroyed and replaced in the pool. Never waits for the session's calls:
    a call still running ends with an error, those still waiting answer 404."""
    await run_blocking(svc.delete, sandbox_id, queue=on_service(svc))
    return Response(status_code=204)


@router.put("/sandboxes/{sandbox_id}/files", status_code=204, responses=R(404, 413, 422, 503))
async def write_files(request: Request, sandbox_id: str, body: WriteFilesRequest, svc: Service) -> Response:
    """Write per-episode files under /scratch (server-side; not a tool); in the sandbox's turn, as a tool call."""
    await run_blocking(svc.write_files, sandbox_id, body.decoded(), request=request, queue=on_sandbox(svc, sandbox_id))
    return Response(status_code=204)


@router.patch("/sandboxes/{sandbox_id}/state", response_model=SandboxInfo, responses=R(404, 413, 422, 503))
async def update_state(request: Request, sandbox_id: str, body: StateUpdate, svc: Service) -> SandboxInfo:
    """Set the working directory, environment variables or metadata of a session: in the sandbox's turn (it
    waits for the sandbox's running call there, never on the event loop; field case S38)."""
    return await run_blocking(svc.update_state, sandbox_id, cwd=body.cwd, env=body.env, metadata=body.metadata,
                              request=request, queue=on_sandbox(svc, sandbox_id))


def carries_files(path: str) -> bool:
    """Whether a sandbox-service route's body carries files (creation, file writes): those take the server's
    ``max_body_bytes``; every other sandbox route's body is small."""
    return path == f"{V1}/sandboxes" or path.endswith("/files")
