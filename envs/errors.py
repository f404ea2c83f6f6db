"""The domain errors of env sessions, raised by the server's session core and raised again by the clients.

A server's session core (:mod:`sandbox_server.session_host`, :mod:`sandbox_server.env_sessions`) raises these and
nothing of HTTP; each transport translates them once at its edge (REST and OpenEnv:
:data:`sandbox_server.http_contract.DOMAIN_ERRORS`; the Ray node hosts pass them on as they are), and a client
raises the same class again from the answer's status word (:func:`for_word`, used by
:func:`envs.session_client.error_for`). Each is also the builtin (or Gymnasium error) an in-process env raises
for the same mistake, so ``except KeyError`` / ``except ValueError`` code reads the same in-process, over Ray and
over HTTP:

* :class:`SessionNotFound`: also ``KeyError`` and :class:`~envs.core.EnvInfraError`; 404 ``not_found``;
* :class:`UnknownEnv`: also ``gymnasium.error.UnregisteredEnv`` and ``ValueError``; 404 ``unknown_env``;
* :class:`ActionTooLong`: also ``ValueError``; 413 ``too_large``;
* :class:`InvalidValue`: also ``ValueError``; 422 ``invalid``;
* :class:`SessionHeld`: also ``PermissionError``; 409 ``held``;
* :class:`~envs.core.EpisodeFinishedError` (a ``RuntimeError``): 409 ``conflict``;
* :class:`~envs.core.EnvInfraError` (a ``RuntimeError``): 503 ``infra_error``.

The HTTP statuses and words are declared once, in :data:`WIRE`.
"""

from __future__ import annotations

import gymnasium as gym

from envs.core import EnvInfraError, EpisodeFinishedError


class SessionNotFound(EnvInfraError, KeyError):
    """No env session with that id: it was closed, expired after its idle TTL, or lost when its server restarted.
    A client sees it as an :class:`~envs.core.EnvInfraError` (its episode is lost; a reset starts another,
    field case S61); a Ray node host's caller as a ``KeyError``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "no such env session"


class UnknownEnv(gym.error.UnregisteredEnv, ValueError):
    """The env id is not served: not registered, or a ``module:Id`` whose module the server's operator did not
    name. Nothing was made. Also Gymnasium's ``UnregisteredEnv``, as ``gymnasium.make`` raises for the same id."""


class InvalidValue(ValueError):
    """A value the server or the env refuses: a kwarg the env does not take or that the server decides, a seed
    or options the env refuses, a snapshot token this server cannot open, a malformed message. Nothing ran."""


class ActionTooLong(InvalidValue):
    """An action (a model's reply) longer than a door takes for the env (:func:`envs.action_input.reply_limit`).
    Nothing ran; send the tool call alone."""


class SessionHeld(PermissionError):
    """An env session an OpenEnv connection holds was asked for through another door (a REST route, a batch item,
    another connection): only its holder may act on it until it closes (the rule:
    :mod:`sandbox_server.session_owners`, field case S58). Nothing ran."""


#: Each domain error's answer on the wire, ``class -> (HTTP status, status word)``: the server's edges answer
#: with it (:data:`sandbox_server.http_contract.DOMAIN_ERRORS` takes it whole) and clients raise the class again
#: for the word (:func:`for_word`). The most specific class of an exception wins.
WIRE: dict[type[Exception], tuple[int, str]] = {
    SessionNotFound: (404, "not_found"),
    UnknownEnv: (404, "unknown_env"),
    ActionTooLong: (413, "too_large"),
    InvalidValue: (422, "invalid"),
    SessionHeld: (409, "held"),
    EpisodeFinishedError: (409, "conflict"),
    EnvInfraError: (503, "infra_error"),
}

_BY_WORD = {(status, word): cls for cls, (status, word) in WIRE.items()}


def for_word(status: int, word: str | None) -> type[Exception] | None:
    """The domain error class of an error answer (HTTP ``status`` and its status ``word``), or None when the pair
    names none of :data:`WIRE` (the caller then decides by the status alone)."""
    return _BY_WORD.get((status, word or ""))


__all__ = ["WIRE", "ActionTooLong", "EnvInfraError", "EpisodeFinishedError", "InvalidValue", "SessionHeld",
           "SessionNotFound", "UnknownEnv", "for_word"]
