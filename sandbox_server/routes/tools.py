"""Tool calls (``POST /v1/sandboxes/{id}/exec``), the whitelist (``/v1/tools``) and the pool (``/v1/pool``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from sandbox_server.deps import Service
from sandbox_server.http_contract import error_responses as R
from sandbox_server.models import ExecRequest, PoolStatus, ToolList
from sandbox_server.routes import V1
from sandbox_server.tools import ToolResult
from sandbox_server.work import exec_deadline_s, on_sandbox, run_blocking

router = APIRouter(prefix=V1)


@router.post("/sandboxes/{sandbox_id}/exec", response_model=ToolResult, tags=["tools"], responses=R(404, 413, 422, 503))
async def exec_tool(request: Request, sandbox_id: str, body: ExecRequest, svc: Service) -> ToolResult:
    """Run one whitelisted tool call. Refused calls answer 422 and run nothing. Calls on one sandbox run one at
    a time, in arrival order; a call that waited too long (503) or whose client left never runs (S38)."""
    return await run_blocking(svc.exec, sandbox_id, body.tool, body.args, body.timeout_s,
                              deadline_s=exec_deadline_s(svc.config, body.timeout_s), request=request,
                              queue=on_sandbox(svc, sandbox_id))


@router.get("/tools", response_model=ToolList, tags=["tools"], responses=R(503))
async def list_tools(svc: Service) -> ToolList:
    """The tool whitelist with each tool's ordered parameters and JSON schema."""
    c = svc.config
    return ToolList(tools=svc.tools(), default_timeout_s=c.default_timeout_s, max_timeout_s=c.max_timeout_s,
                    output_cap_bytes=c.output_cap_bytes)


@router.get("/pool", response_model=PoolStatus, tags=["pool"], responses=R(503))
async def pool_status(svc: Service) -> PoolStatus:
    """Warm pool sizes and limits."""
    return svc.pool_status()
