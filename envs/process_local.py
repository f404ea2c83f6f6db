"""Forkyard's clients on both sides of ``os.fork`` (field case S59): connections belong to the process that
opened them.

A client made before ``os.fork`` (a multiprocessing ``fork`` pool, a DataLoader worker, a plain ``os.fork``)
is copied into the child with its keep-alive connections: the very same sockets in both processes, so each
could read the other's answers, and a close in one (a TLS ``close_notify``, a WebSocket close frame) would
end the other's connection. Every forkyard client (``RemoteEnv`` over HTTP and WebSocket,
``RemoteVectorEnv``, ``SandboxClient``, ``AsyncSandboxClient``, ``ForkyardEnvClient``) therefore notes the
pid that opened its connections and, used in another process:

* opens connections of its own there (:class:`PerProcess`: the HTTP clients' pools are made anew on first use
  in the child);
* never writes on, reads from or closes the parent's connections: they are kept untouched
  (:func:`keep_inherited`) until the child exits;
* leaves the parent's sessions to the parent. A session opened before the fork is the parent's (a WebSocket
  session lives on the parent's connection; an HTTP session is the parent's episode): an operation on it in
  the child raises :class:`InheritedConnectionError`, saying to reset (which opens a session of the child's
  own) or to make the client in the child; closing the client in the child neither deletes the parent's
  sessions nor closes its connections.

Standard library only.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

#: Connections inherited from a parent process, kept here untouched (never closed: closing could end the
#: parent's connection) for the child's lifetime.
INHERITED: list[object] = []
_lock = threading.Lock()


def _new_lock() -> None:
    global _lock
    _lock = threading.Lock()  # a lock held by a parent's thread at the fork would never be released here


os.register_at_fork(after_in_child=_new_lock)


class InheritedConnectionError(RuntimeError):
    """A connection, or a session that lives on one, opened by another process (this one is a fork of it)
    was used here: see the module docstring."""


def inherited_error(what: str, pid: int, remedy: str) -> InheritedConnectionError:
    """The error for using ``what`` (opened by process ``pid``) in this process, ending with ``remedy``."""
    return InheritedConnectionError(
        f"{what} was opened by process {pid}, and this is process {os.getpid()}, forked from it afterwards: it "
        f"belongs to that process, whose connection it lives on (field case S59). {remedy}")


def keep_inherited(*objects: object) -> None:
    """Keep connections inherited from the parent process, untouched, until this process exits."""
    INHERITED.extend(o for o in objects if o is not None)


class PerProcess(Generic[T]):
    """A connection pool (an ``httpx.Client``, ...) that each process opens for itself.

    Args:
        make: opens a new one (called now unless ``obj`` is given, and again on first use in a fork child);
            None when the caller supplied ``obj`` and no other can be made.
        obj: one already open in this process (the caller's own), or None.
        what: the pool's owner in messages (``"this SandboxClient's httpx client"``).
    """

    def __init__(self, make: Callable[[], T] | None, obj: T | None = None, what: str = "this client"):
        if obj is None and make is None:
            raise ValueError("PerProcess needs make or obj")
        self._make, self.what = make, what
        self.obj: T = obj if obj is not None else make()  # type: ignore[misc]
        self.pid = os.getpid()

    @property
    def inherited(self) -> bool:
        """Whether :attr:`obj` was opened by another process (this one is a fork of it)."""
        return self.pid != os.getpid()

    def get(self) -> T:
        """The pool of this process (opened now in a fork child, the parent's kept untouched).

        Raises:
            InheritedConnectionError: in a fork child, when no ``make`` was given (a caller-supplied pool).
        """
        if self.pid != os.getpid():
            with _lock:
                if self.pid != os.getpid():
                    if self._make is None:
                        raise inherited_error(self.what, self.pid, "Make the client (and the pool you pass it) in "
                                              "this process, after the fork.")
                    keep_inherited(self.obj)
                    self.obj, self.pid = self._make(), os.getpid()
        return self.obj

    def owned(self) -> T | None:
        """The pool if this process opened it (for closing), else None (the parent's, kept untouched)."""
        if self.pid != os.getpid():
            keep_inherited(self.obj)
            return None
        return self.obj


__all__ = ["INHERITED", "InheritedConnectionError", "PerProcess", "inherited_error", "keep_inherited"]
