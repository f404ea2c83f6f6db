"""One session host: the env-session operations every transport of the server shares.

``create``, ``reset``, ``step``, ``fork``, ``snapshot``, ``restore`` and ``delete`` of env sessions, over the
store of :mod:`sandbox_server.env_sessions` (TTL, session cap, per-session locks, which env classes and
kwargs are served). The REST routes (:mod:`sandbox_server.routes.envs`) and the OpenEnv transport
(:mod:`sandbox_server.routes.openenv`) are thin shims over it: they decode a request, call one method, and
map the domain errors raised here to their own wire only at their edge (HTTP statuses through
:data:`sandbox_server.http_contract.DOMAIN_ERRORS`; OpenEnv error messages through
:func:`sandbox_server.routes.openenv.error_message`).

Errors (every method): ``HTTPException`` 404 unknown env id or session, 409 a step on an ended episode, 413
an action longer than the env accepts, 422 a value the env refuses (kwargs, seed, options, a snapshot token
that this server did not seal); :class:`~sandbox_server.errors.ServiceUnavailable` (503) the session cap is
reached, the server is shutting down, or the client left before its sessions were registered;
:class:`~envs.core.EnvInfraError` (503) the env's infrastructure or code failed. A failed create, fork or
restore keeps no session; a failed reset, step or fork leaves the session as it was.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Awaitable, Callable

import anyio
import gymnasium as gym
from fastapi import HTTPException

from envs.core import Snapshot, TextEnv
from sandbox_server.env_sessions import (
    SERVER_DECIDED_KWARGS, EnvRecipe, EnvSession, EnvSessions, close_quietly, env_failure, run_env,
)
from sandbox_server.errors import ServiceUnavailable
from sandbox_server.snapshot_tokens import SnapshotSealer

#: ``still_wanted``: an async callable telling whether the client is still there to learn of new sessions
#: (HTTP: the connection is open); False discards them (503) instead of leaving them to the TTL.
StillWanted = Callable[[], Awaitable[bool]] | None


@dataclasses.dataclass
class Opened:
    """A session just made (by create or restore): its id, its env, and the first observation and info."""

    session_id: str
    env: TextEnv
    observation: str
    info: dict[str, Any]


class SessionHost:
    """The env-session operations of one server.

    Args:
        sessions: the store (TTL, cap, locks, served classes and kwargs).
        sealer: seals the snapshots handed to clients (default: a key drawn for this process).
    """

    def __init__(self, sessions: EnvSessions, sealer: SnapshotSealer | None = None):
        self.sessions = sessions
        self.sealer = sealer or SnapshotSealer()

    # ------------------------------------------------------------------------------- new sessions
    async def create(self, env_id: str, kwargs: dict[str, Any], seed: int | None = None,
                     options: dict[str, Any] | None = None, still_wanted: StillWanted = None) -> Opened:
        """A new session of ``env_id`` made with ``kwargs`` and reset with ``seed`` / ``options``."""
        recipe = self.sessions.recipe(env_id, kwargs)
        return await self._open(recipe, lambda env: env.reset(seed=seed, options=options), still_wanted)

    async def restore(self, token: str, still_wanted: StillWanted = None, env_id: str | None = None) -> Opened:
        """A new session at the state sealed in ``token`` (what :meth:`snapshot` returned, on this server or
        one with the same key and the same corpus): the env id and kwargs come from the token, never from the
        client. ``env_id``: refuse (422, before any env is built) a token of another env id."""
        try:
            snap = await anyio.to_thread.run_sync(self.sealer.open, token)
        except ValueError as exc:  # SnapshotTokenError, or a token whose content is not a snapshot
            raise HTTPException(422, f"cannot restore: {exc}") from None
        if snap.env_id is None:
            raise HTTPException(422, "cannot restore: the snapshot names no env id")
        if env_id is not None and snap.env_id != env_id:
            raise HTTPException(422, f"cannot restore: the snapshot is of {snap.env_id}, not of {env_id}")
        kwargs = {k: v for k, v in snap.kwargs.items() if k not in SERVER_DECIDED_KWARGS}
        recipe = self.sessions.recipe(snap.env_id, kwargs)

        def load(env: TextEnv) -> tuple[str, dict[str, Any]]:
            env.restore(snap)
            return env.last_observation, env.current_info()

        return await self._open(recipe, load, still_wanted)

    async def _open(self, recipe: EnvRecipe, start: Callable[[TextEnv], tuple[str, dict[str, Any]]],
                    still_wanted: StillWanted) -> Opened:
        with self.sessions.reserve(1) as slots:
            try:
                env = await run_env(recipe.blocking, lambda: build(recipe), self.sessions.pool_threads())
            except Exception as exc:
                raise env_failure(exc, f"cannot make {recipe.env_id} with kwargs {recipe.kwargs}", True)
            try:
                try:
                    obs, info = await run_env(recipe.blocking, lambda: start(env), self.sessions.pool_threads())
                except Exception as exc:
                    raise env_failure(exc, "reset", True)
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
                    still_wanted: StillWanted = None) -> tuple[EnvSession, str, dict[str, Any]]:
        """Reset session ``sid``: (the session, observation, info). ``still_wanted``: see :meth:`step`."""
        s = self.sessions.get(sid)
        waited = s.lock.locked()
        async with s.lock:
            await _still_wanted(waited, still_wanted, "reset")
            try:
                obs, info = await run_env(s.blocking, lambda: s.env.reset(seed=seed, options=options),
                                          self.sessions.pool_threads())
            except Exception as exc:
                raise env_failure(exc, "reset", True)
        return s, obs, info

    async def step(self, sid: str, action: str,
                   still_wanted: StillWanted = None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One action in session ``sid``: (observation, reward, terminated, truncated, info). A step that had to
        wait for the session's previous request and whose client left meanwhile (``still_wanted`` says False)
        does not run: 503 (field case S38)."""
        s = self.sessions.get(sid)
        check_action(s.env, action)
        waited = s.lock.locked()
        async with s.lock:
            await _still_wanted(waited, still_wanted, "step")
            if s.env.done:
                raise ended()
            try:
                obs, reward, term, trunc, info = await run_env(s.blocking, lambda: s.env.step(action))
            except Exception as exc:
                raise env_failure(exc, "step", False)
        return obs, float(reward), bool(term), bool(trunc), info

    async def fork(self, sid: str, n: int, still_wanted: StillWanted = None) -> list[str]:
        """``n`` new sessions at session ``sid``'s state (all or none): their ids."""
        s = self.sessions.get(sid)
        async with s.lock:
            with self.sessions.reserve(n) as slots:  # room for all n first: all or none
                try:
                    children = await run_env(s.blocking, lambda: s.env.fork(n), self.sessions.pool_threads())
                except Exception as exc:
                    raise env_failure(exc, "fork", False)
                try:
                    if still_wanted is not None and not await still_wanted():
                        raise ServiceUnavailable("the client closed the connection before its forks were made")
                    return slots.commit(s.env_id, list(children), s.blocking)
                except BaseException:
                    with anyio.CancelScope(shield=True):  # closed even when the request is being cancelled
                        await run_env(s.blocking, lambda: [close_quietly(c) for c in children])
                    raise

    async def snapshot(self, sid: str) -> str:
        """Session ``sid``'s state as a sealed token (:mod:`sandbox_server.snapshot_tokens`)."""
        s = self.sessions.get(sid)
        async with s.lock:
            try:
                snap: Snapshot = await run_env(s.blocking, s.env.snapshot)
            except Exception as exc:
                raise env_failure(exc, "snapshot", False)
        if snap.env_id is None:
            snap = snap.model_copy(update={"env_id": s.env_id})
        return await anyio.to_thread.run_sync(self.sealer.seal, snap)

    async def delete(self, sids: list[str]) -> list[bool]:
        """Close the sessions ``sids`` (their envs in worker threads when closing blocks); ``[i]``: whether
        ``sids[i]`` was held."""
        gone = [self.sessions.pop(sid) for sid in sids]
        inline = [s.env for s in gone if s is not None and not s.blocking]
        threaded = [s.env for s in gone if s is not None and s.blocking]
        for env in inline:
            close_quietly(env)
        if threaded:
            with anyio.CancelScope(shield=True):  # popped above: closed now or never
                await anyio.to_thread.run_sync(lambda: [close_quietly(e) for e in threaded])
        return [s is not None for s in gone]


async def _still_wanted(waited: bool, still_wanted: StillWanted, what: str) -> None:
    """Raise ServiceUnavailable when a request that waited for its session's lock lost its client meanwhile
    (it then does not run); a request that did not wait is not checked (the hot path stays as it was)."""
    if waited and still_wanted is not None and not await still_wanted():
        raise ServiceUnavailable(f"the client closed the connection while its {what} waited for the session; "
                                 "it did not run")


def build(recipe: EnvRecipe) -> TextEnv:
    """A new env of ``recipe``, its ``spec`` set as ``gymnasium.make`` sets it (the kwargs it was made with)."""
    env = recipe.cls(**recipe.kwargs, **recipe.extra)
    spec = gym.envs.registry.get(recipe.env_id)
    if spec is not None:
        env.spec = dataclasses.replace(spec, kwargs=dict(recipe.kwargs))
    return env


def check_action(env: TextEnv, action: str) -> None:
    """Raise HTTPException 413 when ``action`` is longer than ``env`` accepts."""
    limit = env.action_space.max_length
    if len(action) > limit:
        raise HTTPException(413, f"the action has {len(action)} characters; this env accepts at most {limit}")


def ended() -> HTTPException:
    """The 409 of a step on an ended episode."""
    return HTTPException(409, "the episode has ended; reset the session (or fork before the end)")


__all__ = ["Opened", "SessionHost", "StillWanted", "build", "check_action", "ended"]
