"""A warm pool of pre-started sandboxes over one backend.

* ``min_idle`` sandboxes are kept started and idle, so :meth:`SandboxPool.acquire` does not wait for a
  start when one is idle; ``max_total`` bounds idle + busy + starting.
* Starts are rate-limited: at most ``max_concurrent_starts`` run at once; a burst queues behind them.
* Released sandboxes are destroyed (in the background) and replaced, never handed out again.
* An idle sandbox is pinged before it is handed out; a dead one is destroyed and replaced.
* When the engine fails or the pool is exhausted, ``acquire`` raises :class:`EngineUnavailable` or
  :class:`PoolExhausted` (HTTP 503 with ``Retry-After``) within ``acquire_timeout_s``; it never hangs.

Every method blocks (engine calls included); run them off the event loop.
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
        max_total: most sandboxes alive at once (idle + busy + starting).
        max_concurrent_starts: most starts in flight at once.
        acquire_timeout_s: longest :meth:`acquire` waits before raising.

    Raises:
        ValueError: sizes out of range (``0 <= min_idle <= max_total``, ``max_total >= 1``,
            ``max_concurrent_starts >= 1``).
    """

    def __init__(self, backend: Backend, *, min_idle: int, max_total: int, max_concurrent_starts: int,
                 acquire_timeout_s: float, metrics: Metrics | None = None):
        if min_idle < 0 or max_total < 1 or max_concurrent_starts < 1 or min_idle > max_total:
            raise ValueError("need 0 <= min_idle <= max_total, max_total >= 1, max_concurrent_starts >= 1")
        self.backend = backend
        self.min_idle, self.max_total, self.max_concurrent_starts = min_idle, max_total, max_concurrent_starts
        self.acquire_timeout_s = acquire_timeout_s
        self.metrics = metrics or Metrics()
        self._cond = threading.Condition()
        self._idle: list[str] = []
        self._busy: set[str] = set()
        self._starting = 0
        self._start_slots = threading.BoundedSemaphore(max_concurrent_starts)
        self._closed = False
        self.last_error: str | None = None
        self._error_until = 0.0
        self._bg = ThreadPoolExecutor(max_workers=max(4, max_concurrent_starts + 2), thread_name_prefix="forkyard-pool")
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
        """Stop refilling and destroy every sandbox of the pool (idle and busy)."""
        with self._cond:
            self._closed = True
            victims = self._idle + list(self._busy)
            self._idle, self._busy = [], set()
            self._cond.notify_all()
        for sid in victims:
            self._destroy(sid)
        self._bg.shutdown(wait=True)
        self._update_gauges()

    # -- internals ------------------------------------------------------------------------------------
    def _error_active(self) -> bool:
        return time.monotonic() < self._error_until

    def _update_gauges(self) -> None:
        self.metrics.pool_idle.set(len(self._idle))
        self.metrics.pool_busy.set(len(self._busy))
        self.metrics.pool_starting.set(self._starting)

    def _total(self) -> int:
        return len(self._idle) + len(self._busy) + self._starting

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
                while not self._closed and (
                    len(self._idle) + self._starting >= self.min_idle or self._total() >= self.max_total
                    or self._starting >= self.max_concurrent_starts or self._error_active()
                ):
                    self._cond.wait(0.5)
                if self._closed:
                    return
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
                self._idle.append(sid)
            self._update_gauges()
            self._cond.notify_all()
        if sid is not None and not keep:
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
                    sid = self._idle.pop(0)
                    self._busy.add(sid)
                    self._last_take = time.monotonic()
                    self._update_gauges()
                    self._cond.notify_all()
                    return sid
                if self._total() < self.max_total:
                    if self._error_active():
                        raise EngineUnavailable(f"the engine is failing: {self.last_error}", retry_after_s=2.0)
                    self._starting += 1
                    self._update_gauges()
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolExhausted(f"all {self.max_total} sandboxes are in use; try again later", retry_after_s=2.0)
                self._cond.wait(min(left, 0.5))

    def acquire_many(self, n: int, timeout_s: float | None = None) -> list[str]:
        """Take ``n`` sandboxes (all or none). Raises like :meth:`acquire`."""
        got: list[str] = []
        try:
            for _ in range(n):
                got.append(self.acquire(timeout_s))
        except Exception:
            for sid in got:
                self.release(sid)
            raise
        return got

    def release(self, sid: str) -> None:
        """Give a sandbox back: it is destroyed in the background and the pool refills."""
        with self._cond:
            self._busy.discard(sid)
            self._last_take = time.monotonic()
            self._update_gauges()
            self._cond.notify_all()
            closed = self._closed
        if not closed:
            try:
                self._bg.submit(self._destroy_later, sid)
                return
            except RuntimeError:  # interpreter shutdown stopped the worker threads first: destroy inline
                pass
        self._destroy(sid)

    def status(self) -> dict:
        """Counts and limits: idle, busy, starting, min_idle, max_total, max_concurrent_starts, last_error."""
        with self._cond:
            return dict(idle=len(self._idle), busy=len(self._busy), starting=self._starting, min_idle=self.min_idle,
                        max_total=self.max_total, max_concurrent_starts=self.max_concurrent_starts,
                        last_error=self.last_error)
