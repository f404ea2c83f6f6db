"""One session host: the env-session operations every transport of the server shares.

``create``, ``reset``, ``step``, ``fork``, ``snapshot``, ``restore`` and ``delete`` of env sessions, over the
store of :mod:`sandbox_server.env_sessions` (TTL, session cap, per-session locks, which env classes and
kwargs are served). Every transport is a thin shim over it: it decodes a request, calls the host, and maps
the domain errors raised here to its own wire only at its edge.

* REST, one session (:mod:`sandbox_server.routes.envs`) and OpenEnv (:mod:`sandbox_server.routes.openenv`):
  :class:`SessionHost`'s async methods;
* REST, batched (``/v1/envs/batch/*``): :mod:`sandbox_server.session_batch` (per-item outcomes over this host);
* the Ray node host (:class:`ray_cluster.nodes.NodeHost`): :class:`SessionHost`'s ``*_now`` methods.

Two layers, one code path:

* the synchronous core, which does the env work of one operation with no await, so that it runs inline on the
  event loop (non-blocking envs: no await between the lock check and the work), in a worker thread (blocking
  envs) or in a Ray actor's thread: :func:`make_env`, :func:`reset_env`, :func:`step_env`, :func:`fork_env`,
  :func:`snapshot_env` (one env each; an env's own exception becomes a domain error through
  :func:`env_failure`), and the session-level ``*_now`` methods of :class:`SessionHost` (look up, reserve room,
  register, close); :func:`run_env` runs a piece of it inline or in a worker thread;
* the async methods (one session each: per-session lock, blocking envs in worker threads, ``still_wanted``)
  and the batched ones of :mod:`sandbox_server.session_batch`, which call the core.

Ownership (field case S58): every method on an existing session takes ``by``, the caller's connection (None: a
REST request or batch item, whose proof is the session id), and refuses a session another connection holds
with :class:`~sandbox_server.errors.SessionHeld` through :meth:`SessionHost.access`, the one check of the one
rule (:mod:`sandbox_server.session_owners`; ``holders`` keeps who holds what).

Why one file: the async methods and the synchronous core they call are one code path (an operation reads the
same whichever layer runs it), and the ownership check sits in each method that reaches a session.

Errors (every method), domain errors only (:mod:`envs.errors`; each transport maps them to its wire at its edge):
:class:`~envs.errors.UnknownEnv` an env id not served, :class:`~envs.errors.SessionNotFound` an unknown session,
:class:`~envs.core.EpisodeFinishedError` a step on an ended episode, :class:`~envs.errors.SessionHeld` a session
another connection holds, :class:`~envs.errors.ActionTooLong` an action longer than the env accepts,
:class:`~envs.errors.InvalidValue` a value the env refuses (kwargs, seed, options, a snapshot token that this
server did not seal); :class:`~sandbox_server.errors.ServiceUnavailable` the session cap is reached, the server
is shutting down, or the client left before its sessions were registered; :class:`~envs.core.EnvInfraError` the
env's infrastructure or code failed. A failed create, fork or
restore keeps no session; a failed reset, step or fork leaves the session as it was.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Callable, TypeVar

import anyio
import gymnasium as gym

import envs
from envs.core import EnvInfraError, EpisodeFinishedError, Snapshot, TextEnv
import envs.errors
from envs.errors import ActionTooLong, InvalidValue
from sandbox_server.env_sessions import SERVER_DECIDED_KWARGS, EnvRecipe, EnvSession, EnvSessions, close_quietly
from sandbox_server.errors import SandboxError, ServiceUnavailable, ToolRefused
from sandbox_server.session_owners import Holders
from sandbox_server.snapshot_tokens import SnapshotSealer

#: ``still_wanted``: an async callable telling whether the client is still there to learn of new sessions
#: (HTTP: the connection is open); False discards them (ServiceUnavailable) instead of leaving them to the TTL.
StillWanted = Callable[[], Awaitable[bool]] | None
#: How a new env starts: ``start(env) -> (observation, info)`` (a reset, or a restore); None: not started.
Start = Callable[[TextEnv], tuple[str, dict[str, Any]]] | None
T = TypeVar("T")
#: Most envs one request closes in worker threads at once (blocking envs, :meth:`SessionHost.delete`).
CLOSE_THREADS = 32


@dataclasses.dataclass
class Opened:
    """A session just made (by create or restore): its id, its env, and the first observation and info
    (None for a session made by :meth:`SessionHost.open_now` without ``start``)."""

    session_id: str
    env: TextEnv
    observation: Any
    info: Any


class SessionHost:
    """The env-session operations of one server (or of one Ray node host).

    Args:
        sessions: the store (TTL, cap, locks, served classes and kwargs).
        sealer: seals the snapshots handed to clients (default: a key drawn for this process).
    """

    def __init__(self, sessions: EnvSessions, sealer: SnapshotSealer | None = None):
        self.sessions = sessions
        self.sealer = sealer or SnapshotSealer()
        self.holders = Holders()  # which connection holds which session (field case S58)

    def access(self, sid: str, by: object | None = None) -> EnvSession:
        """Session ``sid`` for a caller ``by`` (a connection; None: a REST request or batch item), under the one
        ownership rule (:mod:`sandbox_server.session_owners`, field case S58).

        Raises:
            SessionNotFound: no such session (or it expired).
            SessionHeld: another connection holds it.
        """
        s = self.sessions.get(sid)
        self.holders.check(sid, by)
        return s

    # ------------------------------------------------------------------------------- new sessions
    async def create(self, env_id: str, kwargs: dict[str, Any], seed: int | None = None,
                     options: dict[str, Any] | None = None, still_wanted: StillWanted = None) -> Opened:
        """A new session of ``env_id`` made with ``kwargs`` and reset with ``seed`` / ``options``."""
        recipe = self.sessions.recipe(env_id, kwargs)
        return await self._open(recipe, resetter(seed, options), still_wanted)

    async def restore(self, token: str, still_wanted: StillWanted = None, env_id: str | None = None) -> Opened:
        """A new session at the state sealed in ``token`` (what :meth:`snapshot` returned, on this server or
        one with the same key and the same corpus): the env id and kwargs come from the token, never from the
        client. ``env_id``: refuse (InvalidValue, before any env is built) a token of another env id."""
        try:
            snap = await anyio.to_thread.run_sync(self.sealer.open, token)
        except ValueError as exc:  # SnapshotTokenError, or a token whose content is not a snapshot
            raise InvalidValue(f"cannot restore: {exc}") from None
        if snap.env_id is None:
            raise InvalidValue("cannot restore: the snapshot names no env id")
        if env_id is not None and snap.env_id != env_id:
            raise InvalidValue(f"cannot restore: the snapshot is of {snap.env_id}, not of {env_id}")
        kwargs = {k: v for k, v in snap.kwargs.items() if k not in SERVER_DECIDED_KWARGS}
        return await self._open(self.sessions.recipe(snap.env_id, kwargs), restorer(snap), still_wanted)

    async def _open(self, recipe: EnvRecipe, start: Start, still_wanted: StillWanted) -> Opened:
        with self.sessions.reserve(1) as slots:
            env, obs, info = await run_env(recipe.blocking, lambda: make_env(recipe, start),
                                           self.sessions.pool_threads())
            try:
                if still_wanted is not None and not await still_wanted():
                    raise ServiceUnavailable("the client closed the connection before its session was made")
                sid = slots.commit(recipe.env_id, [env], recipe.blocking)[0]
            except BaseException:
                with anyio.CancelScope(shield=True):  # closed even when the request is being cancelled
                    await run_env(recipe.blocking, lambda: close_quietly(env))
                raise
        return Opened(sid, env, obs, info)

    # ------------------------------------------------------------------------------- one session
    async def reset(self, sid: str, seed: int | None = None, options: dict[str, Any] | None = None,
                    still_wanted: StillWanted = None,
                    by: object | None = None) -> tuple[EnvSession, str, dict[str, Any]]:
        """Reset session ``sid``: (the session, observation, info). ``still_wanted``, ``by``: see :meth:`step`."""
        s = self.access(sid, by)
        waited = s.lock.locked()
        async with s.lock:
            if waited:
                self.holders.check(sid, by)  # attached by a connection while this call waited
            await _still_wanted(waited, still_wanted, "reset")
            obs, info = await run_env(s.blocking, lambda: reset_env(s.env, seed, options),
                                      self.sessions.pool_threads())
        return s, obs, info

    async def step(self, sid: str, action: Any, still_wanted: StillWanted = None,
                   by: object | None = None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One action in session ``sid``: (observation, reward, terminated, truncated, info). A step that had to
        wait for the session's previous request and whose client left meanwhile (``still_wanted`` says False)
        does not run: ServiceUnavailable (field case S38). ``by``: the caller's connection (None: REST), checked by
        :meth:`access` (SessionHeld, field case S58), again after a wait for the session's lock."""
        s = self.access(sid, by)
        check_action(s.env, action)  # ActionTooLong never waits for the lock
        waited = s.lock.locked()
        async with s.lock:
            if waited:
                self.holders.check(sid, by)  # attached by a connection while this call waited
            await _still_wanted(waited, still_wanted, "step")
            return await run_env(s.blocking, lambda: step_env(s.env, action))

    async def fork(self, sid: str, n: int, still_wanted: StillWanted = None, by: object | None = None) -> list[str]:
        """``n`` new sessions at session ``sid``'s state (all or none): their ids. ``by``: see :meth:`step` (the
        forks are not held by anyone: a connection that forks holds them itself)."""
        s = self.access(sid, by)
        async with s.lock:
            self.holders.check(sid, by)
            with self.sessions.reserve(n) as slots:  # room for all n first: all or none
                children = await run_env(s.blocking, lambda: fork_env(s.env, n), self.sessions.pool_threads())
                try:
                    if still_wanted is not None and not await still_wanted():
                        raise ServiceUnavailable("the client closed the connection before its forks were made")
                    return slots.commit(s.env_id, children, s.blocking)
                except BaseException:
                    with anyio.CancelScope(shield=True):  # closed even when the request is being cancelled
                        await run_env(s.blocking, lambda: [close_quietly(c) for c in children])
                    raise

    async def snapshot(self, sid: str, by: object | None = None) -> str:
        """Session ``sid``'s state as a sealed token (:mod:`sandbox_server.snapshot_tokens`). ``by``: see
        :meth:`step`."""
        s = self.access(sid, by)
        async with s.lock:
            self.holders.check(sid, by)
            snap = await run_env(s.blocking, lambda: snapshot_env(s.env, s.env_id))
        return await anyio.to_thread.run_sync(self.sealer.seal, snap)

    async def delete(self, sids: list[str], by: object | None = None) -> list[bool]:
        """Close the sessions ``sids`` (the envs of blocking ones in worker threads, at most
        :data:`CLOSE_THREADS` at once); ``[i]``: whether ``sids[i]`` was held (existed).

        Raises:
            SessionHeld: one of them is held by a connection other than ``by`` (None: a REST request); then
                none is closed (field case S58).
        """
        for sid in sids:
            self.holders.check(sid, by)
        gone = [self.sessions.pop(sid) for sid in sids]
        for sid in sids:
            self.holders.drop(sid)
        threaded = [s.env for s in gone if s is not None and s.blocking]
        for s in gone:
            if s is not None and not s.blocking:
                close_quietly(s.env)
        if threaded:
            with anyio.CancelScope(shield=True):  # popped above: closed now or never
                async with anyio.create_task_group() as tg:
                    for part in range(min(CLOSE_THREADS, len(threaded))):
                        tg.start_soon(anyio.to_thread.run_sync,
                                      lambda part=part: [close_quietly(e) for e in threaded[part::CLOSE_THREADS]])
        return [s is not None for s in gone]

    # ------------------------------------------------------------------------------- synchronous
    # No await, no per-session lock: for callers that serialise a session's calls themselves (a Ray actor).
    def open_now(self, recipe: EnvRecipe, start: Start = None, force: bool = False) -> Opened:
        """A new session of ``recipe`` started with ``start`` (None: built, not reset). ``force``: counted even
        past the session cap."""
        with self.sessions.reserve(1, force=force) as slots:
            env, obs, info = make_env(recipe, start)
            try:
                sid = slots.commit(recipe.env_id, [env], recipe.blocking)[0]
            except BaseException:
                close_quietly(env)
                raise
        return Opened(sid, env, obs, info)

    def adopt_now(self, recipe: EnvRecipe, snap: Snapshot | bytes, n: int, force: bool = False) -> list[str]:
        """``n`` new sessions at the state of ``snap`` (all or none): an env of ``recipe`` restored to it (then
        closed) forked ``n`` times, so the copies take the fork keys the snapshot's env would have given."""
        with self.sessions.reserve(n, force=force) as slots:  # room for all n first
            template, _, _ = make_env(recipe, restorer(snap))
            try:
                children = fork_env(template, n)
            finally:
                close_quietly(template)
            return _commit_or_close(slots, recipe.env_id, children, recipe.blocking)

    def reset_now(self, sid: str, seed: int | None = None,
                  options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Reset session ``sid``: (observation, info)."""
        return reset_env(self.sessions.get(sid).env, seed, options)

    def step_now(self, sid: str, action: Any,
                 check_length: bool = True) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One action in session ``sid``: (observation, reward, terminated, truncated, info). ``check_length``
        False: an action longer than the env accepts is the env's to answer (its invalid-action observation, as
        in-process), not ActionTooLong."""
        return step_env(self.sessions.get(sid).env, action, check_length)

    def fork_now(self, sid: str, n: int, force: bool = False) -> list[str]:
        """``n`` new sessions at session ``sid``'s state (all or none; ``force``: even past the cap)."""
        s = self.sessions.get(sid)
        with self.sessions.reserve(n, force=force) as slots:
            return _commit_or_close(slots, s.env_id, fork_env(s.env, n), s.blocking)

    def snapshot_now(self, sid: str) -> Snapshot:
        """Session ``sid``'s state (plain, unsealed: for hosts that never hand it to a client)."""
        s = self.sessions.get(sid)
        return snapshot_env(s.env, s.env_id)

    def close_now(self, sids: list[str]) -> list[bool]:
        """Close the sessions ``sids`` here and now; ``[i]``: whether ``sids[i]`` was held."""
        gone = [self.sessions.pop(sid) for sid in sids]
        for s in gone:
            if s is not None:
                close_quietly(s.env)
        return [s is not None for s in gone]


def _commit_or_close(slots: Any, env_id: str, children: list[TextEnv], blocking: bool) -> list[str]:
    try:
        return slots.commit(env_id, children, blocking)
    except BaseException:
        for c in children:
            close_quietly(c)
        raise


async def _still_wanted(waited: bool, still_wanted: StillWanted, what: str) -> None:
    """Raise ServiceUnavailable when a request that waited for its session's lock lost its client meanwhile
    (it then does not run); a request that did not wait is not checked (the hot path stays as it was)."""
    if waited and still_wanted is not None and not await still_wanted():
        raise ServiceUnavailable(f"the client closed the connection while its {what} waited for the session; "
                                 "it did not run")


# ------------------------------------------------------------------------------- the synchronous core
def build(recipe: EnvRecipe) -> TextEnv:
    """A new env of ``recipe``, its ``spec`` set as ``gymnasium.make`` sets it (the kwargs it was made with)."""
    env = recipe.cls(**recipe.kwargs, **recipe.extra)
    spec = gym.envs.registry.get(recipe.env_id)
    if spec is not None:
        env.spec = dataclasses.replace(spec, kwargs=dict(recipe.kwargs))
    return env


def make_env(recipe: EnvRecipe, start: Start = None) -> tuple[TextEnv, Any, Any]:
    """A new env of ``recipe`` started with ``start``: ``(env, observation, info)`` (None, None when ``start``
    is None). Errors as create's (InvalidValue for a value the env refuses, EnvInfraError otherwise); an env whose
    start failed is closed."""
    try:
        env = build(recipe)
    except Exception as exc:
        raise env_failure(exc, f"cannot make {recipe.env_id} with kwargs {recipe.kwargs}", True)  # noqa: B904
    if start is None:
        return env, None, None
    try:
        obs, info = start(env)
    except BaseException as exc:
        close_quietly(env)
        if isinstance(exc, Exception):
            raise env_failure(exc, "reset", True)  # noqa: B904 - see env_failure
        raise
    return env, obs, info


def resetter(seed: int | None, options: dict[str, Any] | None) -> Callable[[TextEnv], tuple[str, dict[str, Any]]]:
    """The ``start`` of a new session reset with ``seed`` and ``options``."""
    return lambda env: env.reset(seed=seed, options=options)


def restorer(snap: Snapshot | bytes) -> Callable[[TextEnv], tuple[str, dict[str, Any]]]:
    """The ``start`` of a new session restored to ``snap``: (its latest observation, its info)."""
    def load(env: TextEnv) -> tuple[str, dict[str, Any]]:
        env.restore(snap)
        return env.last_observation, env.current_info()
    return load


def reset_env(env: TextEnv, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """``env.reset``: (observation, info). InvalidValue for a seed or options the env refuses, EnvInfraError
    otherwise."""
    try:
        return env.reset(seed=seed, options=options)
    except Exception as exc:
        raise env_failure(exc, "reset", True)  # noqa: B904 - see env_failure


def step_env(env: TextEnv, action: Any, check_length: bool = True) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """``env.step``: (observation, reward as float, terminated, truncated, info). ActionTooLong an action too
    long (unless not ``check_length``), EpisodeFinishedError an ended episode, EnvInfraError the env failed."""
    if check_length:
        check_action(env, action)
    if env.done:
        raise ended()
    try:
        obs, reward, term, trunc, info = env.step(action)
    except Exception as exc:
        raise env_failure(exc, "step", False)  # noqa: B904 - see env_failure
    return obs, float(reward), bool(term), bool(trunc), info


def fork_env(env: TextEnv, n: int) -> list[TextEnv]:
    """``env.fork(n)`` as a list (its copies are not sessions yet). EnvInfraError when the fork failed."""
    try:
        return list(env.fork(n))
    except Exception as exc:
        raise env_failure(exc, "fork", False)  # noqa: B904 - see env_failure


def snapshot_env(env: TextEnv, env_id: str) -> Snapshot:
    """``env.snapshot()`` naming ``env_id`` when the env does not. EnvInfraError when it failed."""
    try:
        snap: Snapshot = env.snapshot()
    except Exception as exc:
        raise env_failure(exc, "snapshot", False)  # noqa: B904 - see env_failure
    return snap if snap.env_id is not None else snap.model_copy(update={"env_id": env_id})


async def run_env(blocking: bool, fn: Callable[[], T], limiter: anyio.CapacityLimiter | None = None) -> T:
    """Call ``fn()``: in a worker thread for blocking envs (of ``limiter``; None: anyio's default), inline
    otherwise."""
    if blocking:
        return await anyio.to_thread.run_sync(fn, limiter=limiter)
    return fn()

_PASS_ON = (*envs.errors.WIRE, gym.error.ResetNeeded, SandboxError, ToolRefused)


def env_failure(exc: Exception, what: str, client_values: bool) -> Exception:
    """What to raise for an exception of env code: domain errors as they are (the one mapping,
    :data:`sandbox_server.http_contract.DOMAIN_ERRORS`, answers them); with ``client_values`` (kwargs,
    seed, options came from the client) TypeError / ValueError / Gymnasium errors are
    :class:`~envs.errors.InvalidValue`; anything else is the env's failure: :class:`EnvInfraError`, never an
    unexpected error. Callers raise it without ``from`` (it may
    be ``exc`` itself, which must not become its own ``__cause__``); ``exc`` stays its ``__context__``."""
    if isinstance(exc, _PASS_ON):
        return exc
    if client_values and isinstance(exc, (TypeError, ValueError, gym.error.Error)):
        return InvalidValue(f"{what}: {exc}")
    return EnvInfraError(f"{what} failed: {type(exc).__name__}: {exc}")


def check_action(env: TextEnv, action: Any) -> None:
    """Raise :class:`~envs.errors.ActionTooLong` when the text ``action`` is longer than a door takes for ``env``
    (:func:`envs.action_input.reply_limit`: a model's whole reply, reasoning included; field case S62)."""
    limit = envs.reply_limit(env.action_space.max_length)
    if isinstance(action, str) and len(action) > limit:
        raise ActionTooLong(f"the action has {len(action)} characters; this server takes replies of at most "
                            f"{limit} characters (a model's reply holding one tool call); send the call alone")


def ended() -> EpisodeFinishedError:
    """The error of a step on an ended episode."""
    return EpisodeFinishedError("the episode has ended; reset the session (or fork before the end)")


__all__ = ["CLOSE_THREADS", "Opened", "SessionHost", "Start", "StillWanted", "build", "check_action", "ended",
           "env_failure", "fork_env", "make_env", "reset_env", "resetter", "restorer", "run_env", "snapshot_env",
           "step_env"]
