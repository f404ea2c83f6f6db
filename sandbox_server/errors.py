"""Errors of the sandbox service, shared by the backends, the service, the HTTP app and the clients. The errors of
env sessions are :mod:`envs.errors` (:class:`SessionHeld` among them, re-exported here)."""

from __future__ import annotations

from envs.errors import SessionHeld
from envs.sandbox import SandboxFailure
from sandbox_server.tools import ToolRefused


class SandboxError(SandboxFailure):
    """Base class of sandbox failures (not of refused tool calls, see :class:`ToolRefused`). Envs see it as
    the :class:`envs.sandbox.SandboxFailure` of their provider protocol."""


class SandboxNotFound(SandboxError, KeyError):
    """No sandbox (or snapshot) with that id: it was deleted, expired, or never existed (HTTP 404)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"


class AgentTimeout(SandboxError):
    """The in-sandbox agent did not answer before the server's own deadline (it is then replaced)."""


class AgentFailed(SandboxError):
    """The in-sandbox agent exited, closed its stream, or answered with an error."""


class ServiceUnavailable(SandboxError):
    """The engine is down or the pool is exhausted (HTTP 503); ``retry_after_s`` says when to retry."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class WorkAbandoned(ServiceUnavailable):
    """Work that may have started was given up (HTTP 503 ``abandoned``): its deadline passed, its client left or
    the server stopped while it ran. Unlike a plain :class:`ServiceUnavailable` (nothing ran), it may have had
    its effect: clients never send it again by themselves (``envs.client_retry``)."""


class CapacityReached(ServiceUnavailable):
    """The env-session cap has no room for the sessions asked for (HTTP 503 with ``Retry-After``)."""


class EngineUnavailable(ServiceUnavailable):
    """The container engine did not answer or refused to start a sandbox."""


class IsolationUnavailable(EngineUnavailable):
    """The local backend cannot isolate sandboxes (bubblewrap missing or not working) and was not told it may
    run without isolation; the message says how to install bubblewrap. Also raised when a sandbox's agent
    could not confine itself (noexec writable areas, dropped capabilities)."""


class PoolExhausted(ServiceUnavailable):
    """``max_total`` sandboxes are in use and none became free in time."""


class SnapshotUnsupported(SandboxError):
    """A snapshot (or fork) cannot carry what the writable areas hold: a FIFO, socket or device file. The
    message names the sandbox path; nothing is dropped silently. A client-visible refusal, not a failure
    of the sandbox (it stays usable)."""


class LimitExceeded(ToolRefused):
    """A documented limit would be passed (files per write, bytes or entries of a writable area); the
    message names the limit. Nothing of the request was kept. HTTP 413, never a retry hint."""


__all__ = ["SandboxError", "SandboxNotFound", "AgentTimeout", "AgentFailed", "ServiceUnavailable", "CapacityReached",
           "EngineUnavailable", "IsolationUnavailable", "PoolExhausted", "SnapshotUnsupported", "LimitExceeded",
           "SessionHeld", "ToolRefused"]
