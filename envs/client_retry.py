"""When a forkyard client sends a request again: the one policy of forkyard's clients (``RemoteEnv`` over HTTP
and WebSocket, ``RemoteVectorEnv``, ``SandboxClient``, ``AsyncSandboxClient``; ``ForkyardEnvClient`` keeps
OpenEnv's client behaviour and retries nothing).

Two cases, and only these, are retried:

* **A busy server.** An answer ``503`` whose error status is ``"unavailable"`` (the env-session cap or the
  sandbox pool is full, the server is starting or draining) means that nothing ran, so any request may be
  sent again. Clients wait what ``Retry-After`` says (at least :data:`MIN_WAIT_S`) and try again until
  ``busy_timeout_s`` seconds (default :data:`BUSY_TIMEOUT_S`, a constructor argument of every client; 0
  never retries) have passed since the first answer, on a monotonic clock; then the 503 is raised as
  before. Other 503s (``"infra_error"``, ``"sandbox_error"``: something failed while running;
  ``"abandoned"``: the server gave up on work that may have run, past its deadline or cut by a stop) are
  not retried here: trainers drop such episodes.
* **A connection the server closed while it was idle.** A server closes keep-alive connections idle past
  its timeout (uvicorn: 5 s); a request sent as that happens fails with no answer. Clients keep idle
  connections for :data:`KEEPALIVE_EXPIRY_S` (under the server's timeout, so the race is rare), and send a
  request once more on a new connection only when repeating it is safe (:func:`safe_to_repeat`): reads,
  deletes, resets and read-only tool calls, never a step, create or fork, which may have run on the server.

Connections are never shared across ``os.fork`` either (field case S59): each process opens its own
(:class:`envs.process_local.PerProcess`, re-exported here as part of the clients' one policy).

Standard library only.
"""

from __future__ import annotations

import asyncio
import math
import time

from envs.process_local import InheritedConnectionError, PerProcess

#: Seconds a client keeps retrying requests answered ``503 unavailable`` (default of ``busy_timeout_s``).
BUSY_TIMEOUT_S = 30.0
#: Shortest wait between two tries, in seconds (a ``Retry-After`` of 0 or a missing one is read as this).
MIN_WAIT_S = 0.05
#: Seconds a client keeps an idle keep-alive connection: under uvicorn's 5 s keep-alive timeout.
KEEPALIVE_EXPIRY_S = 2.0
#: The error status of a 503 after which nothing ran (``sandbox_server.http_contract.DOMAIN_ERRORS``).
BUSY_STATUS = "unavailable"


def is_busy(status_code: int, error_status: str | None) -> bool:
    """Whether an answer (HTTP status, ``ErrorBody.status``) says the server was busy and nothing ran."""
    return status_code == 503 and error_status == BUSY_STATUS


def retry_after_s(value: str | float | int | None) -> float:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds) or a ``retry_after_s`` field;
    :data:`MIN_WAIT_S` when missing, unreadable or not finite (HTTP dates are not sent by forkyard servers;
    the budget of :class:`BusyWait` bounds a large one)."""
    try:
        seconds = float(value) if value is not None else MIN_WAIT_S
    except (TypeError, ValueError):
        return MIN_WAIT_S
    return max(seconds, MIN_WAIT_S) if math.isfinite(seconds) else MIN_WAIT_S


def safe_to_repeat(method: str, path: str) -> bool:
    """Whether a request may be sent again after its connection closed with no answer (it may have run):
    GET, PUT and DELETE, an env reset (``.../reset``: it replaces the session's state whatever ran before) and a
    sandbox tool call (``.../exec``: tools are read-only). Steps, creates, forks, clones and snapshots are
    not: repeating them could apply an action twice or leave sessions nobody knows of."""
    method = method.upper()
    return method in ("GET", "HEAD", "PUT", "DELETE") or (
        method == "POST" and path.rstrip("/").endswith(("/reset", "/exec")))


class BusyWait:
    """The retry budget of one request: ``wait(seconds)`` sleeps (at most what is left of
    ``timeout_s``, counted from construction on a monotonic clock) and says whether to try again."""

    def __init__(self, timeout_s: float = BUSY_TIMEOUT_S):
        if timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {timeout_s}")
        self.deadline = time.monotonic() + timeout_s

    def _pause(self, seconds: float) -> float | None:
        left = self.deadline - time.monotonic()
        return None if left <= 0 else min(max(seconds, MIN_WAIT_S), left)

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` (clipped to the budget); False, without sleeping, when the budget is spent."""
        pause = self._pause(seconds)
        if pause is None:
            return False
        time.sleep(pause)
        return True

    async def wait_async(self, seconds: float) -> bool:
        """:meth:`wait` for event loops (``asyncio.sleep``)."""
        pause = self._pause(seconds)
        if pause is None:
            return False
        await asyncio.sleep(pause)
        return True


__all__ = ["BUSY_STATUS", "BUSY_TIMEOUT_S", "BusyWait", "InheritedConnectionError", "KEEPALIVE_EXPIRY_S",
           "MIN_WAIT_S", "PerProcess", "is_busy", "retry_after_s", "safe_to_repeat"]
