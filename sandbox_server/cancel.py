"""Abandoning work safely: a request handler that gave up (it answered the client with an error) and the
worker thread still doing its work agree, through a :class:`CancelToken`, on who releases what the work took.

:func:`sandbox_server.work.run_blocking` uses a second token the same way for the start of the work (field
case S38): the worker thread claims it before it runs anything, and a handler that gives up first sets it,
so work given up while it waited for its sandbox's turn or for a worker thread never runs."""

from __future__ import annotations

import threading
from typing import Any


class CancelToken:
    """Shared by a request handler and the worker thread doing its work, so that work the handler
    gave up on (it answered the client with an error) never keeps what it took.

    The worker calls :meth:`claim` just before it hands out new sessions; the handler calls
    :meth:`set` when it gives up. Exactly one of them wins: ``claim`` returns False once the token
    is set (the worker then releases what it took), and ``set`` returns False once the work was
    claimed (the handler should then wait for the result, which is ready, instead of failing).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: str | None = None  # None, "set" or "claimed"

    def set(self) -> bool:
        """Abandon the work. Returns False if the worker already claimed its result."""
        with self._lock:
            if self._state == "claimed":
                return False
            self._state = "set"
            return True

    def is_set(self) -> bool:
        """Whether the work was abandoned."""
        return self._state == "set"

    def claim(self) -> bool:
        """Called by the worker before handing out its result. Returns False if it was abandoned."""
        with self._lock:
            if self._state == "set":
                return False
            self._state = "claimed"
            return True


def claim(cancel: Any) -> bool:
    """True when the work may be handed out: no token, a token not set, or a :class:`CancelToken` claimed
    (any object with ``is_set()`` works as a token that cannot be claimed)."""
    if cancel is None:
        return True
    claim_fn = getattr(cancel, "claim", None)
    return claim_fn() if claim_fn is not None else not cancel.is_set()


__all__ = ["CancelToken", "claim"]
