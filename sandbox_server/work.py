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

Where work waits (field case S38: 60 one-second calls on one sandbox held every shared worker thread while
they waited for that sandbox's lock, so a quick call on another sandbox waited 18 s): no worker thread is
taken before the work can run. A call on one sandbox (tool call, file write, state update, snapshot, fork)
first waits for its turn in that sandbox's own :class:`Lane`, on the event loop, at most ``queue_wait_s``
(the call's deadline unless told otherwise); at most :data:`MAX_QUEUED_PER_SANDBOX` calls wait per sandbox,
and one more is answered 503 with ``Retry-After`` at once. Only then does it take a worker thread, from a
limiter with one thread per sandbox the pool can hold and a few more (:data:`EXTRA_CALL_THREADS`), so a
sandbox's call never waits for a thread that another sandbox's calls hold. Work that waits for the warm
pool (create, clone) has a limiter of its own (:data:`POOL_THREADS`); env sessions keep anyio's default
one. The deadline then counts again from the moment the work starts. Work given up before its worker
thread started it (its deadline passed, or its client hung up, while it waited) never runs; work given up
while it runs finishes in its thread (a tool call within its own timeout) and its sandbox's next call
waits until then.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import anyio
from fastapi import Request

from sandbox_server.errors import ServiceUnavailable, ToolRefused, WorkAbandoned
from sandbox_server.service import CancelToken, SandboxService
from sandbox_server.settings import ServiceConfig
from sandbox_server.tools import clamp_timeout

#: Seconds added to a call's own deadline before the server gives up on a worker thread.
SERVER_GRACE_S = 10.0
#: Seconds an engine call with no deadline of its own (delete, file write) may take before a 503.
ENGINE_CALL_DEADLINE_S = 60.0
#: ``Retry-After`` seconds of a 503 for an engine that did not answer within the deadline.
ENGINE_RETRY_S = 5.0
#: Most calls that may wait for one sandbox at once (besides the one it runs); one more answers 503.
MAX_QUEUED_PER_SANDBOX = 64
#: Worker threads of sandbox calls beyond one per sandbox the pool can hold (``max_total``): deletes, and
#: calls still finishing for a session that was deleted meanwhile.
EXTRA_CALL_THREADS = 8
#: Worker threads of work that waits for the warm pool (create, clone); more such work waits on the loop.
POOL_THREADS = 32


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


class Lane:
    """The calls of one sandbox, run one at a time in arrival order; they wait here, on the event loop,
    without a worker thread. Made and forgotten by :class:`WorkQueues` (a lane nobody uses is dropped).

    Attributes:
        key: the sandbox id.
        busy: whether one of its calls holds the turn (waits for or runs in a worker thread).
        avg_s: a moving average of its calls' run times in seconds (for ``Retry-After``).
    """

    def __init__(self, queues: "WorkQueues", key: str):
        self._queues, self.key = queues, key
        self.busy = False
        self.avg_s = 0.0
        self._waiting: deque[asyncio.Future] = deque()

    @property
    def queued(self) -> int:
        """Calls waiting for their turn (not counting the one holding it)."""
        return len(self._waiting)

    def retry_after_s(self) -> float:
        """Seconds a new call would wait at least: the queued calls at their average run time (at least 1)."""
        return max(1.0, (len(self._waiting) + 1) * self.avg_s)

    def join(self) -> asyncio.Future:
        """A place in the lane: a future done when it is the caller's turn (done at once when the lane is
        free). The caller then either runs its work and calls :meth:`leave`, or gives up with :meth:`drop`.
        Must run on the event loop. Raises ServiceUnavailable (nothing queued) when
        ``max_queued`` calls wait already."""
        turn = asyncio.get_running_loop().create_future()
        if not self.busy:
            self.busy = True
            turn.set_result(None)
            return turn
        if len(self._waiting) >= self._queues.max_queued:
            raise ServiceUnavailable(
                f"{len(self._waiting)} calls already wait for sandbox {self.key!r} (at most "
                f"{self._queues.max_queued}); this one did not run", retry_after_s=self.retry_after_s())
        self._waiting.append(turn)
        return turn

    def drop(self, turn: asyncio.Future) -> None:
        """Give up a place taken with :meth:`join`; if its turn came meanwhile, it passes to the next call."""
        if turn.done() and not turn.cancelled():
            self.leave()
            return
        try:
            self._waiting.remove(turn)
        except ValueError:
            pass
        turn.cancel()

    def leave(self, ran_s: float | None = None) -> None:
        """End the turn (``ran_s``: how long the work took, in seconds): the next waiting call gets it."""
        if ran_s is not None:
            self.avg_s = ran_s if self.avg_s == 0.0 else 0.8 * self.avg_s + 0.2 * ran_s
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.busy = False
        self._queues._forget(self)


@dataclass(frozen=True)
class Queue:
    """Where one piece of blocking work waits: ``key`` the sandbox whose lane it takes its turn in (None:
    no lane) and ``threads`` the limiter of the worker thread it then runs in (``"calls"`` or ``"pool"``)."""

    queues: "WorkQueues"
    key: str | None
    threads: str


class WorkQueues:
    """The lanes (one per sandbox id with calls waiting or running) and worker-thread limiters of one service.

    Args:
        max_total: the most sandboxes the pool holds: the ``"calls"`` limiter has that many threads plus
            :data:`EXTRA_CALL_THREADS`, enough for one call of every sandbox at once.
        max_queued: most calls waiting per sandbox (default :data:`MAX_QUEUED_PER_SANDBOX`).
        pool_threads: threads of work that waits for the pool (default :data:`POOL_THREADS`).

    Raises:
        ValueError: a size below 1.
    """

    def __init__(self, max_total: int, max_queued: int = MAX_QUEUED_PER_SANDBOX, pool_threads: int = POOL_THREADS):
        if max_total < 1 or max_queued < 1 or pool_threads < 1:
            raise ValueError("need max_total, max_queued and pool_threads >= 1")
        self.max_queued = max_queued
        self._sizes = {"calls": max_total + EXTRA_CALL_THREADS, "pool": pool_threads}
        self._lanes: dict[str, Lane] = {}
        self._limiters: dict[str, anyio.CapacityLimiter] = {}

    def on(self, key: str | None, threads: str = "calls") -> Queue:
        """The :class:`Queue` of work on sandbox ``key`` (None: work on no one sandbox) that runs in a thread of
        limiter ``threads`` (``"calls"``, ``"pool"``). Raises ValueError for another limiter name."""
        if threads not in self._sizes:
            raise ValueError(f"no thread limiter {threads!r}; there are {sorted(self._sizes)}")
        return Queue(self, key, threads)

    def lane(self, key: str) -> Lane:
        """The lane of sandbox ``key`` (made on first use; forgotten again once nobody uses it)."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(self, key)
        return lane

    def lanes(self) -> int:
        """How many sandboxes have calls waiting or running."""
        return len(self._lanes)

    def queued(self, key: str) -> int:
        """Calls waiting for sandbox ``key``'s turn (0 when none; safe to read from any thread)."""
        lane = self._lanes.get(key)
        return lane.queued if lane is not None else 0

    def threads_in_use(self, threads: str) -> int:
        """Worker threads of limiter ``threads`` held now (0 before its first use; any thread may read it)."""
        lim = self._limiters.get(threads)
        return lim.borrowed_tokens if lim is not None else 0

    def limiter(self, threads: str) -> anyio.CapacityLimiter:
        """The worker-thread limiter named ``threads`` (made on first use; call it on the event loop)."""
        lim = self._limiters.get(threads)
        if lim is None:
            lim = self._limiters[threads] = anyio.CapacityLimiter(self._sizes[threads])
        return lim

    def _forget(self, lane: Lane) -> None:
        if self._lanes.get(lane.key) is lane and not lane.busy and not lane.queued:
            del self._lanes[lane.key]


_QUEUES: "weakref.WeakKeyDictionary[SandboxService, WorkQueues]" = weakref.WeakKeyDictionary()


def work_queues(svc: SandboxService) -> WorkQueues:
    """The :class:`WorkQueues` of a service (made on first use, sized from its ``max_total``)."""
    q = _QUEUES.get(svc)
    if q is None:
        q = _QUEUES[svc] = WorkQueues(svc.config.max_total)
    return q


def on_sandbox(svc: SandboxService, sandbox_id: str) -> Queue:
    """Work on one sandbox (tool call, file write, state update, snapshot, fork): its lane, then a call thread."""
    return work_queues(svc).on(sandbox_id, "calls")


def on_pool(svc: SandboxService) -> Queue:
    """Work that waits for the warm pool (create, clone): a thread of the pool limiter."""
    return work_queues(svc).on(None, "pool")


def on_service(svc: SandboxService) -> Queue:
    """Short work on no one sandbox's turn (delete): a call thread."""
    return work_queues(svc).on(None, "calls")


async def _disconnected(request: Request) -> None:
    """Return once the client has closed its connection (the request body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _consume(task: asyncio.Future) -> None:
    """Retrieve an abandoned task's outcome, so nothing is reported as never retrieved."""
    if not task.cancelled():
        task.exception()


class _NotRun(Exception):
    """Raised in the worker thread instead of running work that was given up before it started."""


async def _wait_turn(lane: Lane, wait_s: float, watch: asyncio.Future | None) -> None:
    """Wait for ``lane``'s turn at most ``wait_s`` seconds, or until ``watch`` (the client hung up) is done.

    Raises ServiceUnavailable, with the place given up (the work never runs): the lane is full, the wait
    ran out, or the client left."""
    turn = lane.join()
    if turn.done():
        return
    try:
        await asyncio.wait([turn] if watch is None else [turn, watch], timeout=wait_s,
                           return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server cancelled this request: give the place up
        lane.drop(turn)
        raise
    if watch is not None and watch.done():
        lane.drop(turn)
        raise ServiceUnavailable("the client closed the connection while its call waited for its sandbox; "
                                 "it did not run")
    if turn.done():
        return
    lane.drop(turn)
    raise ServiceUnavailable(f"sandbox {lane.key!r} was busy with earlier calls for {wait_s:g} s; this call did not "
                             "run", retry_after_s=lane.retry_after_s())


def _in_thread(fn: Callable[[], Any], limiter: anyio.CapacityLimiter | None, lane: Lane | None) -> asyncio.Task:
    """A task running ``fn()`` in a worker thread of ``limiter`` (None: anyio's default); once it is done
    (cancelled too, even before it began), ``lane``'s turn passes on."""
    task = asyncio.ensure_future(anyio.to_thread.run_sync(fn, limiter=limiter))
    if lane is not None:
        t0 = time.monotonic()
        task.add_done_callback(lambda _: lane.leave(time.monotonic() - t0))
    return task


async def run_blocking(fn: Callable[..., Any], *args: Any, deadline_s: float = ENGINE_CALL_DEADLINE_S,
                       request: Request | None = None, undo: Callable[[Any], None] | None = None,
                       queue: Queue | None = None, queue_wait_s: float | None = None, **kw: Any) -> Any:
    """Run ``fn(*args, **kw)`` in a worker thread; give up after ``deadline_s`` seconds with a 503.

    With ``queue`` (:func:`on_sandbox`, :func:`on_pool`, :func:`on_service`) the work first waits for its
    turn in its sandbox's lane, on the event loop, at most ``queue_wait_s`` seconds (default ``deadline_s``),
    then runs in a thread of the queue's limiter (without one: anyio's default limiter); ``deadline_s``
    counts from the moment it stops waiting for its turn. Work given up before its worker thread started it
    never runs.

    Work that takes resources (create, clone, fork, snapshot) passes ``undo`` (how to release its result):
    ``fn`` then also gets ``cancel=CancelToken()``. Giving up sets the token, so the service releases what it
    took instead of handing it out; if the service had already claimed its result, the result is ready: it
    is returned, or released with ``undo`` when the client is gone. With ``request`` the server also gives
    up when the client hangs up. Work without a token that has started is left to finish in its thread
    (its sandbox's next call waits for it).

    Raises:
        ServiceUnavailable: the sandbox's lane is full, the wait for the turn or the deadline passed, or the
            client closed the connection first.
        Whatever ``fn`` raises.
    """
    token = CancelToken() if undo is not None else None
    if token is not None:
        kw["cancel"] = token
    begun = CancelToken()  # claimed by the worker thread as it starts; set by a handler that gives up first
    call = functools.partial(fn, *args, **kw)

    def guarded() -> Any:
        if not begun.claim():
            raise _NotRun()
        return call()

    lane = queue.queues.lane(queue.key) if queue is not None and queue.key is not None else None
    limiter = queue.queues.limiter(queue.threads) if queue is not None else None
    watch = asyncio.ensure_future(_disconnected(request)) if request is not None else None
    try:
        if lane is not None:
            await _wait_turn(lane, deadline_s if queue_wait_s is None else queue_wait_s, watch)
        work = _in_thread(guarded, limiter, lane)
        try:
            done, _ = await asyncio.wait([work] if watch is None else [work, watch], timeout=deadline_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server cancelled this request: give up the same way
            if begun.set():  # not started: it never will
                work.cancel()
                work.add_done_callback(_consume)
            elif token is None or token.set():
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
    if begun.set():  # it was still waiting for a worker thread: it never runs
        work.cancel()
        work.add_done_callback(_consume)
        if client_gone:
            raise ServiceUnavailable("the client closed the connection before the work started; it did not run")
        raise ServiceUnavailable(f"no worker thread was free within {deadline_s:g} s; the work did not run",
                                 retry_after_s=ENGINE_RETRY_S)
    if token is not None and not token.set():  # the work was claimed: its result is ready
        result = await work
        if not client_gone:
            return result
        assert undo is not None  # a token exists only with undo
        await anyio.to_thread.run_sync(undo, result)
    else:
        work.add_done_callback(_consume)
    if client_gone:
        raise WorkAbandoned("the client closed the connection before the work finished; nothing was kept")
    raise WorkAbandoned(f"the sandbox engine did not answer within {deadline_s:g} s; the work may have run",
                        retry_after_s=ENGINE_RETRY_S)


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


__all__ = ["ENGINE_CALL_DEADLINE_S", "ENGINE_RETRY_S", "EXTRA_CALL_THREADS", "MAX_QUEUED_PER_SANDBOX", "POOL_THREADS",
           "SERVER_GRACE_S", "Lane", "Queue", "WorkQueues", "acquire_deadline_s", "exec_deadline_s",
           "fan_out_deadline_s", "on_pool", "on_sandbox", "on_service", "release_sandboxes", "run_blocking",
           "work_queues"]
