"""Who may act on an env session, and by which proof: the one ownership rule of every door (field case S58).

The rule, the same whatever route reaches a session (``/v1/envs/{id}/...``, ``/v1/envs/batch/*``, the OpenEnv
WebSocket's messages):

* A session no connection holds (made over ``/v1/envs``, or restored there) may be acted on by whoever holds
  its id: a session id is a 128-bit capability (32 random hex digits, never guessable), so the id is the proof.
* A session an OpenEnv connection holds (its own session, the forks it made, the sessions it attached) may be
  acted on only through that connection, until it closes: reset, step, fork, snapshot, tools, state, delete
  and attach from any other door (another connection, a REST route, a batch item) are refused with
  :class:`~sandbox_server.errors.SessionHeld` (HTTP 409 ``held``; over the WebSocket an ``EXECUTION_ERROR``
  answer with ``http_status`` 409), and nothing runs. The connection is the proof: knowing the id is not enough.
* ``attach`` transfers: a connection may attach a session no connection holds (it then holds it), or a fork
  another connection holds but does not drive (the hand-off of a fork's children); a session another
  connection drives (its current session) is refused. When a connection closes, the sessions it holds are
  deleted with it.

:class:`Holders` keeps the map from session id to its holder; :class:`~sandbox_server.session_host.SessionHost`
calls :meth:`Holders.check` in every operation (``by``: the caller's connection, None for REST and batch
items), so no door checks ownership on its own.
"""

from __future__ import annotations

from sandbox_server.errors import SessionHeld


class Holders:
    """The sessions held by connections: session id -> (holder, whether the holder drives it).

    A holder is any object standing for one connection (compared by identity); ``None`` stands for a caller that
    holds nothing (a REST request, a batch item).
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[object, bool]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def holder(self, sid: str) -> object | None:
        """The holder of session ``sid``, or None when no connection holds it."""
        entry = self._held.get(sid)
        return entry[0] if entry is not None else None

    def check(self, sid: str, by: object | None) -> None:
        """Raise :class:`SessionHeld` unless ``by`` may act on session ``sid`` (the module's rule): the session is
        held by no connection, or by ``by`` itself."""
        entry = self._held.get(sid)
        if entry is not None and entry[0] is not by:
            raise SessionHeld(f"session {sid!r} is held by an OpenEnv connection: only that connection may act on "
                              "it until it closes (field case S58)")

    def hold(self, sid: str, by: object, drives: bool) -> None:
        """Record that ``by`` holds session ``sid`` (``drives``: it is the connection's current session, not a
        fork waiting to be handed off)."""
        self._held[sid] = (by, drives)

    def take(self, sid: str, by: object) -> object | None:
        """``by`` attaches session ``sid`` and now drives it: returns the previous holder (None: none).

        Raises:
            SessionHeld: another connection drives the session.
        """
        entry = self._held.get(sid)
        if entry is not None and entry[0] is not by and entry[1]:
            raise SessionHeld(f"session {sid!r} is driven by another connection: only that connection may act "
                              "on it until it closes (field case S58)")
        self._held[sid] = (by, True)
        return entry[0] if entry is not None else None

    def drop(self, sid: str) -> object | None:
        """Forget session ``sid`` (deleted, or released): its holder, or None."""
        entry = self._held.pop(sid, None)
        return entry[0] if entry is not None else None


__all__ = ["Holders", "SessionHeld"]
