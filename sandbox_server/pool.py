"""A warm pool of pre-started sandboxes over one backend.

* ``min_idle`` sandboxes are kept started and idle, so :meth:`SandboxPool.acquire` does not wait for a
  start when one is idle; ``max_total`` bounds idle + busy + starting + being recycled.
* Starts are rate-limited: at most ``max_concurrent_starts`` run at once; a burst queues behind them.
* Released sandboxes are recycled (``recycle``, the default): in the background the backend resets and
  verifies them (:meth:`~sandbox_server.backends.base.Backend.recycle`: every process but the agent
  killed, ``/scratch`` and ``/tmp`` emptied and checked, a ping answered), and a clean one goes back to the
  idle list; one whose reset cannot be verified, or that served ``max_sandbox_uses`` sessions, is
  destroyed and replaced. ``release(sid, reusable=False)`` (a sandbox that hung or failed) and
  ``recycle=False`` destroy every released sandbox, as before recycling existed. Idle sandboxes above
  ``min_idle`` (what a burst gave back) are kept ``surplus_idle_ttl_s`` for the next burst, then destroyed.
* An acquire with no idle sandbox waits for one being recycled (milliseconds) rather than start one.
* An idle sandbox is pinged before it is handed out; a dead one is destroyed and replaced.
* When the engine fails or the pool is exhausted, ``acquire`` raises :class:`EngineUnavailable` or
  :class:`PoolExhausted` (HTTP 503 with ``Retry-After``) within ``acquire_timeout_s``; it never hangs.

Every method blocks (engine calls included); run them off the event loop.

Why one file: idle, busy, starting and recycling sandboxes are one state under one condition variable, which every
hand-out, release, start, recycle and refill reads and changes together.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sandbox_server.backends import Backend
from sandbox_server.errors import EngineUnavailable, PoolExhausted, ServiceUnavailable
from sandbox_server.metrics import Metrics

#: Seconds the pool waits after a sandbox was taken or given back before it starts or destroys
#: containers in the background (while idle ones remain): docker fork(4) restores measured 19 ms p50
#: with a refill racing them on 2 cores.
REFILL_DELAY_S = 0.05


class SandboxPool:
    """Warm pool. Times in seconds. The sizes have no defaults here: they are fields of
    :class:`~sandbox_server.settings.ServiceConfig` (declared there once), which the service passes on.

    Args:
        backend: where sandboxes run.
        min_idle: idle sandboxes kept warm.
        max_total: most sandboxes alive at once (idle + busy + starting + being recycled).
        max_concurrent_starts: most starts in flight at once.
        acquire_timeout_s: longest :meth:`acquire` waits before raising.
        recycle: reset and reuse released sandboxes (False: destroy each and start a new one).
        max_sandbox_uses: sessions a sandbox serves (hand-outs) before it is destroyed instead of recycled.
        surplus_idle_ttl_s: seconds an idle sandbox above ``min_idle`` is kept before it is destroyed.

    Raises:
        ValueError: sizes out of range (``0 <= min_idle <= max_total``, ``max_total >= 1``,
            ``max_concurrent_starts >= 1``, ``max_sandbox_uses >= 1``, ``surplus_idle_ttl_s >= 0``).
    """

    def __init__(self, backend: Backend, *, min_idle: int, max_total: int, max_concurrent_starts: int,
                 acquire_timeout_s: float, recycle: bool, max_sandbox_uses: int, surplus_idle_ttl_s: float,
                 metrics: Metrics | None = None):
        if min_idle < 0 or max_total < 1 or max_concurrent_starts < 1 or min_idle > max_total:
            raise ValueError("need 0 <= min_idle <= max_total, max_total >= 1, max_concurrent_starts >= 1")
        if max_sandbox_uses < 1 or surplus_idle_ttl_s < 0:
            raise ValueError("need max_sandbox_uses >= 1 and surplus_idle_ttl_s >= 0")
        self.backend = backend
        self.min_idle, self.max_total, self.max_concurrent_starts = min_idle, max_total, max_concurrent_starts
        self.acquire_timeout_s = acquire_timeout_s
        self.recycle = bool(recycle) and callable(getattr(backend, "recycle", None))
        self.max_sandbox_uses, self.surplus_idle_ttl_s = max_sandbox_uses, surplus_idle_ttl_s
        self.metrics = metrics or Metrics()
        self._cond = threading.Condition()
        self._idle: list[str] = []  # oldest first; hand-outs take the newest (the hot ones are reused)
        self._idle_since: dict[str, float] = {}
        self._busy: set[str] = set()
        self._starting = 0
        self._recycling = 0  # released sandboxes being reset
        self._recycle_waiters = 0  # acquires waiting for one of them
        self._uses: dict[str, int] = {}  # hand-outs per live sandbox
        self._recycler = ThreadPoolExecutor(max_workers=4, thread_name_prefix="forkyard-recycle")
        self._start_slots = threading.BoundedSemaphore(max_concurrent_starts)
        self._closed = False
        self.last_error: str | None = None
        self._error_until = 0.0
        self._bg = ThreadPoolExecutor(max_workers=max(4, max_concurrent_starts + 2), thread_name_prefix="forkyard-pool")
        #: The hand-outs of one acquire_many run at once: each pings its sandbox (S31), and 8 pings one after the
        #: other were a fifth of a copy-on-write fork(8).
        self._takers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="forkyard-take")
        self._filler: threading.Thread | None = None
        self._last_take = 0.0  # time.monotonic() of the last acquire or release

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self, wait: bool = True, timeout_s: float = 60.0) -> int:
        """Remove what an earlier run left (by label), start the refill thread, and (``wait``) fill ``min_idle``.

        Returns the number of orphans removed. Does not raise if the engine is down (the pool reports it).
        """
        try:
            removed = self.backend.cleanup_orphans()
        except Exception as exc:
            removed = 0
            self.last_error = f"orphan clean-up failed: {exc}"
        self._filler = threading.Thread(target=self._fill_loop, name="forkyard-pool-fill", daemon=True)
        self._filler.start()
        if wait:
            deadline = time.monotonic() + timeout_s
            with self._cond:
                while len(self._idle) < self.min_idle and time.monotonic() < deadline and not self._error_active():
                    self._cond.wait(0.1)
        return removed

    def close(self) -> None:
        """Stop refilling and destroy every sandbox of the pool (idle, busy, and those being recycled)."""
        with self._cond:
            self._closed = True
            victims = self._idle + list(self._busy)
            self._idle, self._busy = [], set()
            self._idle_since.clear()
            self._cond.notify_all()
        for sid in victims:
            self._destroy(sid)
        self._recycler.shutdown(wait=True)  # a recycle that finishes now sees the pool closed: it destroys
        self._bg.shutdown(wait=True)
        self._takers.shutdown(wait=True)
        self._update_gauges()

    # -- internals ------------------------------------------------------------------------------------
    def _error_active(self) -> bool:
        return time.monotonic() < self._error_until

    def _update_gauges(self) -> None:
        self.metrics.pool_idle.set(len(self._idle))
        self.metrics.pool_busy.set(len(self._busy))
        self.metrics.pool_starting.set(self._starting)
        self.metrics.pool_recycling.set(self._recycling)

    def _total(self) -> int:
        return len(self._idle) + len(self._busy) + self._starting + self._recycling

    def _start_one(self, deadline: float | None = None) -> str:
        """Start a sandbox under the rate limit (the caller has counted it in ``_starting``)."""
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._start_slots.acquire(timeout=wait):
            raise PoolExhausted("too many sandbox starts are queued; try again", retry_after_s=1.0)
        try:
            t0 = time.perf_counter()
            sid = self.backend.create()
            self.metrics.start_s.observe(time.perf_counter() - t0)
            self.last_error = None
            self._error_until = 0.0
            return sid
        except Exception as exc:
            self.last_error = str(exc)
            self._error_until = time.monotonic() + 2.0
            if isinstance(exc, ServiceUnavailable):
                raise
            raise EngineUnavailable(f"could not start a sandbox: {exc}") from None
        finally:
            self._start_slots.release()

    def _fill_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    self._trim_surplus()
                    if not (len(self._idle) + self._starting + self._recycling >= self.min_idle
                            or self._total() >= self.max_total or self._starting >= self.max_concurrent_starts
                            or self._error_active()):
                        break
                    self._cond.wait(0.5)
                # While sandboxes are still idle, let a burst that just took some (a fork's restores)
                # finish before container starts compete with it for the CPU and the engine.
                quiet = REFILL_DELAY_S - (time.monotonic() - self._last_take)
                if self._idle and quiet > 0:
                    self._cond.wait(quiet)
                    continue
                self._starting += 1
                self._update_gauges()
            try:
                self._bg.submit(self._fill_one)
            except RuntimeError:  # the interpreter is exiting and shut the executor down: stop refilling
                with self._cond:
                    self._starting -= 1
                    self._update_gauges()
                return

    def _fill_one(self) -> None:
        sid = None
        try:
            sid = self._start_one()
        except Exception:
            pass
        with self._cond:
            self._starting -= 1
            keep = sid is not None and not self._closed
            if keep:
                self._add_idle(sid)
            self._update_gauges()
            self._cond.notify_all()
        if sid is not None and not keep:
            self._destroy(sid)

    def _add_idle(self, sid: str) -> None:
        """Put ``sid`` at the end of the idle list (the caller holds ``_cond``)."""
        self._idle.append(sid)
        self._idle_since[sid] = time.monotonic()

    def _trim_surplus(self) -> None:
        """Destroy (in the background) idle sandboxes above ``min_idle`` that stayed idle longer than
        ``surplus_idle_ttl_s``, oldest first (the caller holds ``_cond``)."""
        now = time.monotonic()
        while (len(self._idle) > self.min_idle
               and now - self._idle_since.get(self._idle[0], now) >= self.surplus_idle_ttl_s):
            sid = self._idle.pop(0)
            self._forget(sid)
            self._update_gauges()
            try:
                self._bg.submit(self._destroy, sid)
            except RuntimeError:  # interpreter shutdown: the backend's close removes it
                pass

    def _forget(self, sid: str) -> None:
        """Drop the bookkeeping of a sandbox that leaves the pool (the caller holds ``_cond``)."""
        self._idle_since.pop(sid, None)
        self._uses.pop(sid, None)

    def _recycle_one(self, sid: str) -> None:
        """Reset and verify a released sandbox; back to idle when clean, else destroyed (and replaced)."""
        t0 = time.perf_counter()
        try:
            ok = bool(self.backend.recycle(sid))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a backend's recycle should not raise; if it does, do not reuse
            ok = False
        self.metrics.recycle_s.observe(time.perf_counter() - t0)
        with self._cond:
            self._recycling -= 1
            keep = ok and not self._closed
            if keep:
                self._add_idle(sid)
            else:
                self._forget(sid)
            self._update_gauges()
            self._cond.notify_all()
        if ok:
            self.metrics.recycled.inc()
        else:
            self.metrics.recycle_failed.inc()
        if not keep:
            self._destroy(sid)

    def _destroy_later(self, sid: str) -> None:
        time.sleep(REFILL_DELAY_S)  # same reason as the refill delay: let the caller's burst finish first
        self._destroy(sid)

    def _destroy(self, sid: str) -> None:
        try:
            self.backend.destroy(sid)
        except Exception:
            pass

    # -- API ------------------------------------------------------------------------------------------
    def acquire(self, timeout_s: float | None = None) -> str:
        """Take a sandbox: an idle one at once, else start one if ``max_total`` allows, else wait.

        Raises:
            PoolExhausted: ``max_total`` sandboxes are busy and none came free within ``timeout_s``.
            EngineUnavailable: the engine failed to start one.
        """
        t0 = time.perf_counter()
        deadline = time.monotonic() + (self.acquire_timeout_s if timeout_s is None else timeout_s)
        while True:
            sid = self._take_idle(deadline)
            if sid is None:
                break
            # An idle sandbox may have died while it waited (its container killed, its agent gone):
            # check it before it is handed out, and replace a dead one (field case S31).
            if self._healthy(sid):
                self.metrics.acquire_s.observe(time.perf_counter() - t0)
                return sid
            self.metrics.replaced.inc()
            with self._cond:
                self._busy.discard(sid)
                self._forget(sid)
                self._update_gauges()
                self._cond.notify_all()
            self._bg.submit(self._destroy, sid)
        sid = None
        try:
            sid = self._start_one(deadline)
        finally:
            with self._cond:
                self._starting -= 1
                if sid is not None:
                    self._busy.add(sid)
                    self._uses[sid] = 1
                self._update_gauges()
                self._cond.notify_all()
        self.metrics.acquire_s.observe(time.perf_counter() - t0)
        return sid

    def _healthy(self, sid: str) -> bool:
        """Whether an idle sandbox's agent still answers a ping (backends without ``alive`` are trusted)."""
        alive = getattr(self.backend, "alive", None)
        return True if alive is None else bool(alive(sid))

    def _take_idle(self, deadline: float) -> str | None:
        """Move an idle sandbox to busy and return it; or count a start (``_starting``) and return None.

        Waits while ``max_total`` sandboxes exist and none is idle. Raises PoolExhausted / EngineUnavailable.
        """
        with self._cond:
            while True:
                if self._closed:
                    raise PoolExhausted("the pool is shut down", retry_after_s=5.0)
                if self._idle:
                    sid = self._idle.pop()
                    self._idle_since.pop(sid, None)
                    self._busy.add(sid)
                    self._uses[sid] = self._uses.get(sid, 0) + 1
                    self._last_take = time.monotonic()
                    self._update_gauges()
                    self._cond.notify_all()
                    return sid
                if self._recycling > self._recycle_waiters and deadline > time.monotonic():
                    # A released sandbox is being reset (milliseconds): wait for it rather than start one
                    # (hundreds of milliseconds). Each waiter counts one recycle as its own.
                    self._recycle_waiters += 1
                    try:
                        self._cond.wait(min(deadline - time.monotonic(), 0.5))
                    finally:
                        self._recycle_waiters -= 1
                    continue
                if self._total() < self.max_total:
                    if self._error_active():
                        raise EngineUnavailable(f"the engine is failing: {self.last_error}", retry_after_s=2.0)
                    self._starting += 1
                    self._update_gauges()
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolExhausted(f"all {self.max_total} sandboxes are in use; try again later",
                                        retry_after_s=2.0)
                self._cond.wait(min(left, 0.5))

    def acquire_many(self, n: int, timeout_s: float | None = None) -> list[str]:
        """Take ``n`` sandboxes (all or none), their :meth:`acquire` calls at once. Raises like :meth:`acquire`."""
        if n <= 1:
            return [self.acquire(timeout_s)] if n == 1 else []
        try:
            futures = [self._takers.submit(self.acquire, timeout_s) for _ in range(n)]
        except RuntimeError:  # shut down meanwhile
            raise PoolExhausted("the pool is shut down", retry_after_s=5.0) from None
        got: list[str] = []
        error: BaseException | None = None
        for f in futures:
            try:
                got.append(f.result())
            except Exception as exc:  # noqa: BLE001 - the first is raised once every hand-out is settled
                error = error or exc
        if error is not None:
            for sid in got:
                self.release(sid)
            raise error
        return got

    def release(self, sid: str, reusable: bool = True) -> None:
        """Give a sandbox back. With recycling on and ``reusable``, it is reset and verified in the background
        and returns to the idle list when clean (see the module docstring); otherwise (``reusable=False``: its
        agent hung or failed; it served ``max_sandbox_uses`` sessions; its reset failed; recycling off) it is
        destroyed in the background and the pool refills. Never raises."""
        with self._cond:
            was_busy = sid in self._busy
            self._busy.discard(sid)
            self._last_take = time.monotonic()
            closed = self._closed
            worn = self._uses.get(sid, 0) >= self.max_sandbox_uses
            recycle = self.recycle and reusable and was_busy and not closed and not worn
            if recycle:
                self._recycling += 1
            else:
                self._forget(sid)
            self._update_gauges()
            self._cond.notify_all()
        if recycle:
            try:
                self._recycler.submit(self._recycle_one, sid)
                return
            except RuntimeError:  # interpreter shutdown stopped the worker threads: destroy instead
                with self._cond:
                    self._recycling -= 1
                    self._forget(sid)
                    self._update_gauges()
                    self._cond.notify_all()
        elif worn and was_busy and self.recycle and reusable:
            self.metrics.retired.inc()
        if not closed:
            try:
                self._bg.submit(self._destroy_later, sid)
                return
            except RuntimeError:  # interpreter shutdown stopped the worker threads first: destroy inline
                pass
        self._destroy(sid)

    def status(self) -> dict:
        """Counts and limits: idle, busy, starting, recycling (released sandboxes being reset), min_idle,
        max_total, max_concurrent_starts, last_error."""
        with self._cond:
            return dict(idle=len(self._idle), busy=len(self._busy), starting=self._starting,
                        recycling=self._recycling, min_idle=self.min_idle, max_total=self.max_total,
                        max_concurrent_starts=self.max_concurrent_starts, last_error=self.last_error)
