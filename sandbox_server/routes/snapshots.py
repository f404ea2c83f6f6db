"""Snapshots, clone and fork: ``/v1/sandboxes/{id}/snapshot``, ``/v1/sandboxes/{id}/fork``, ``/v1/snapshots``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sandbox_server.deps import Service
from sandbox_server.http_contract import error_responses as R
from sandbox_server.models import (CloneRequest, CloneResponse, ForkRequest, RollbackRequest, SandboxInfo, SnapshotInfo,
                                   SnapshotRequest)
from sandbox_server.routes import V1
from sandbox_server.work import fan_out_deadline_s, on_pool, on_sandbox, release_sandboxes, run_blocking

router = APIRouter(prefix=V1, tags=["snapshots"])


@router.post("/sandboxes/{sandbox_id}/snapshot", response_model=SnapshotInfo, status_code=201,
             responses=R(404, 413, 422, 503))
async def snapshot(
    request: Request, sandbox_id: str, svc: Service, body: SnapshotRequest | None = None
) -> SnapshotInfo:
    """Capture /scratch, /tmp and the session state as a stored snapshot (with a TTL)."""
    return await run_blocking(svc.snapshot, sandbox_id, (body or SnapshotRequest()).ttl_s, request=request,
                              undo=lambda info: svc.delete_snapshot(info.id), queue=on_sandbox(svc, sandbox_id))


@router.get("/snapshots/{snapshot_id}", response_model=SnapshotInfo, responses=R(404, 503))
async def get_snapshot(snapshot_id: str, svc: Service) -> SnapshotInfo:
    """A stored snapshot's info."""
    return svc.get_snapshot(snapshot_id)


@router.delete("/snapshots/{snapshot_id}", status_code=204, responses=R(404, 503))
async def delete_snapshot(snapshot_id: str, svc: Service) -> Response:
    """Forget a snapshot."""
    svc.delete_snapshot(snapshot_id)
    return Response(status_code=204)


@router.post("/snapshots/{snapshot_id}/clone", response_model=CloneResponse, status_code=201,
             responses=R(404, 413, 422, 503))
async def clone(request: Request, snapshot_id: str, svc: Service, body: CloneRequest | None = None) -> CloneResponse:
    """n new independent sandboxes restored to the snapshot (all or none)."""
    t0 = time.perf_counter()
    out = await run_blocking(svc.clone, snapshot_id, (body or CloneRequest()).n, request=request,
                             undo=release_sandboxes(svc), deadline_s=fan_out_deadline_s(svc.config), queue=on_pool(svc))
    return CloneResponse(snapshot_id=snapshot_id, sandboxes=out, duration_s=time.perf_counter() - t0)


@router.post("/sandboxes/{sandbox_id}/rollback", response_model=SandboxInfo, responses=R(404, 422, 503))
async def rollback(request: Request, sandbox_id: str, body: RollbackRequest, svc: Service) -> SandboxInfo:
    """Put the sandbox back, in place, to a stored snapshot (its files and its state)."""
    return await run_blocking(svc.rollback, sandbox_id, body.snapshot_id, request=request,
                              queue=on_sandbox(svc, sandbox_id))


@router.post("/sandboxes/{sandbox_id}/fork", response_model=CloneResponse, status_code=201,
             responses=R(404, 413, 422, 503))
async def fork(request: Request, sandbox_id: str, svc: Service, body: ForkRequest | None = None) -> CloneResponse:
    """Snapshot + clone in one call: n independent copies of the sandbox (all or none)."""
    t0 = time.perf_counter()
    out = await run_blocking(svc.fork, sandbox_id, (body or ForkRequest()).n, request=request,
                             undo=release_sandboxes(svc), deadline_s=fan_out_deadline_s(svc.config),
                             queue=on_sandbox(svc, sandbox_id))
    return CloneResponse(sandboxes=out, duration_s=time.perf_counter() - t0)
