"""Blocking work of the HTTP routes, run off the event loop under a server-side deadline.

Every engine call and agent round trip blocks, so routes run them in worker threads with
:func:`run_blocking`, which gives up after a deadline (503 with ``Retry-After``) or when the client hangs
up, and then releases whatever the abandoned work took. The deadlines are computed here only, from the
service's own limits (:class:`~sandbox_server.settings.ServiceConfig`), in seconds:

* :func:`acquire_deadline_s` (create): one acquire from the pool, plus :data:`SERVER_GRACE_S`.
* :func:`fan_out_deadline_s` (clone, fork): ``acquire_many`` (up to one acquire timeout) and restoring the
  copies (bounded by another), plus the grace.
* :func:`exec_deadline_s` (a tool call): the call's own timeout (clamped; the maximum when it names none), plus
  one acquire (a hung sandbox is replaced from the pool), plus the grace.
* :data:`ENGINE_CALL_DEADLINE_S`: any other engine call (delete, file write).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any, Callable

import anyio
from fastapi import Request

from sandbox_server.errors import ServiceUnavailable, ToolRefused
from sandbox_server.service import CancelToken, SandboxService
from sandbox_server.settings import ServiceConfig
from sandbox_server.tools import clamp_timeout

#: Seconds added to a call's own deadline before the server gives up on a worker thread.
SERVER_GRACE_S = 10.0
#: Seconds an engine call with no deadline of its own (delete, file write) may take before a 503.
ENGINE_CALL_DEADLINE_S = 60.0
#: ``Retry-After`` seconds of a 503 for an engine that did not answer within the deadline.
ENGINE_RETRY_S = 5.0


def acquire_deadline_s(config: ServiceConfig) -> float:
    """Seconds a create may take: one acquire (``acquire_timeout_s``) plus :data:`SERVER_GRACE_S`."""
    return config.acquire_timeout_s + SERVER_GRACE_S


def fan_out_deadline_s(config: ServiceConfig) -> float:
    """Seconds a clone or fork may take: acquiring the copies and restoring them (one ``acquire_timeout_s``
    each) plus :data:`SERVER_GRACE_S`."""
    return config.acquire_timeout_s * 2 + SERVER_GRACE_S


def exec_deadline_s(config: ServiceConfig, timeout_s: float | None) -> float:
    """Seconds a tool call may take: the timeout it asks for, clamped to ``max_timeout_s`` (``max_timeout_s``
    itself when it names none, which leaves room for a wait on the sandbox's lock, or one the service will
    refuse anyway), plus one acquire (a hung sandbox is replaced from the pool) and :data:`SERVER_GRACE_S`."""
    try:
        limit = clamp_timeout(timeout_s, config.max_timeout_s, config.max_timeout_s)
    except ToolRefused:
        limit = config.max_timeout_s
    return limit + config.acquire_timeout_s + SERVER_GRACE_S


async def _disconnected(request: Request) -> None:
    """Return once the client has closed its connection (the request body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _consume(task: asyncio.Future) -> None:
    """Retrieve an abandoned task's outcome, so nothing is reported as never retrieved."""
    if not task.cancelled():
        task.exception()


async def run_blocking(fn: Callable[..., Any], *args: Any, deadline_s: float = ENGINE_CALL_DEADLINE_S,
                       request: Request | None = None, undo: Callable[[Any], None] | None = None, **kw: Any) -> Any:
    """Run ``fn(*args, **kw)`` in a worker thread; give up after ``deadline_s`` seconds with a 503.

    Work that takes resources (create, clone, fork, snapshot) passes ``undo`` (how to release its result):
    ``fn`` then also gets ``cancel=CancelToken()``. Giving up sets the token, so the service releases what it
    took instead of handing it out; if the service had already claimed its result, the result is ready: it
    is returned, or released with ``undo`` when the client is gone. With ``request`` the server also gives
    up when the client hangs up. Work without a token is left to finish in its thread.

    Raises:
        ServiceUnavailable: the deadline passed, or the client closed the connection first.
        Whatever ``fn`` raises.
    """
    token = CancelToken() if undo is not None else None
    if token is not None:
        kw["cancel"] = token
    work = asyncio.ensure_future(anyio.to_thread.run_sync(functools.partial(fn, *args, **kw)))
    watch = asyncio.ensure_future(_disconnected(request)) if request is not None else None
    try:
        done, _ = await asyncio.wait([work] if watch is None else [work, watch], timeout=deadline_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server cancelled this request: give up the same way
        if token is None or token.set():
            work.add_done_callback(_consume)
        else:  # claimed: release the result when it arrives (in a thread: undo blocks)
            work.add_done_callback(lambda t: t.cancelled() or t.exception() or threading.Thread(
                target=undo, args=(t.result(),), daemon=True).start())
        raise
    finally:
        if watch is not None:
            watch.cancel()
    if work in done:
        return work.result()
    client_gone = watch is not None and watch in done
    if token is not None and not token.set():  # the work was claimed: its result is ready
        result = await work
        if not client_gone:
            return result
        await anyio.to_thread.run_sync(undo, result)
    else:
        work.add_done_callback(_consume)
    if client_gone:
        raise ServiceUnavailable("the client closed the connection before the work finished; nothing was kept")
    raise ServiceUnavailable(f"the sandbox engine did not answer within {deadline_s:g} s", retry_after_s=ENGINE_RETRY_S)


def release_sandboxes(svc: SandboxService) -> Callable[[Any], None]:
    """The ``undo`` of a create / clone / fork whose client is gone: delete the sandboxes it made (a
    ``SandboxInfo`` or a list of them)."""
    def undo(result: Any) -> None:
        for info in result if isinstance(result, list) else [result]:
            try:
                svc.delete(info.id)
            except Exception:  # noqa: BLE001 - already gone
                pass
    return undo


__all__ = ["ENGINE_CALL_DEADLINE_S", "ENGINE_RETRY_S", "SERVER_GRACE_S", "acquire_deadline_s", "exec_deadline_s",
           "fan_out_deadline_s", "release_sandboxes", "run_blocking"]
