"""Finalizers that never block an event loop.

A ``__del__`` runs on whichever thread the garbage collector happens to run: a server's event loop thread, or an
async trainer's. A remote env's finalizer deletes its server session with a blocking request, and a sandboxed
env's gives its sandbox back; run on an event loop, that stalls every connection the loop serves, and when the
request goes to a server on that same loop, the loop waits on itself until the request times out (seen with an
in-process uvicorn server: its loop collected a dropped client and stopped answering). :func:`run_finalizer`
runs the work at once on a plain thread, and hands it to one background thread when the calling thread runs an
event loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_executor: tuple[int, ThreadPoolExecutor] | None = None


def _background() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None or _executor[0] != os.getpid():  # a forked child starts its own thread
            _executor = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="forkyard-finalizer"))
        return _executor[1]


def _quietly(work: Callable[[], object]) -> None:
    try:
        work()
    except Exception:  # noqa: BLE001 - best effort: the server's TTL or lease reaps what was not freed
        pass


def run_finalizer(work: Callable[[], object]) -> None:
    """Run ``work`` (a best-effort release: a session delete, a sandbox given back) now, unless this thread runs
    an asyncio event loop: then on one background thread, so that the loop goes on serving. Never raises; an
    exception of ``work`` is dropped (the server's TTL or lease reaps what a failed release left). Work handed
    to the background thread still runs at interpreter exit (its pool is joined then)."""
    if asyncio._get_running_loop() is None:
        _quietly(work)
        return
    try:
        _background().submit(_quietly, work)
    except RuntimeError:  # the interpreter is shutting down: no new threads; run it here rather than lose it
        _quietly(work)
