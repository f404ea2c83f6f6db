"""Batched session operations over one :class:`~sandbox_server.session_host.SessionHost`: many items per call,
each answered on its own.

:func:`batch_create`, :func:`batch_reset`, :func:`batch_step`, :func:`batch_fork` and :func:`batch_delete` take
decoded items (plain values, no wire models) and return ``outcomes[i]`` for ``items[i]``: what the host's
single-session method returns, or the domain exception it would raise (never raised here: one failing item
never fails the others). They call the same synchronous core as the single-session methods
(:func:`~sandbox_server.session_host.make_env`, :func:`~sandbox_server.session_host.reset_env`,
:func:`~sandbox_server.session_host.step_env`, :func:`~sandbox_server.session_host.fork_env`), so an item
answers exactly what one request would. The batched routes (:mod:`sandbox_server.routes.envs`) only decode,
map outcomes to the wire (``item_error``) and encode.

Ownership (field case S58): a batch item is a REST request; its proof is the session id, so an item on a session
an OpenEnv connection holds is answered :class:`~envs.errors.SessionHeld` and nothing runs for
it (:meth:`SessionHost.access <sandbox_server.session_host.SessionHost.access>`, checked again under the
session's lock for items that waited for it).

Speed: items are grouped by session and each session is looked up once. A session's items run in their order
under its lock. Sessions of non-blocking envs (ClueProbe) whose lock is free run inline on the event loop,
one after the other, with no await between the lock check and the work; the others (blocking envs, or a lock
held by another request) run concurrently, blocking ones in worker threads, at most :data:`BATCH_THREADS`
at once. Creates and forks register their sessions only once every item is done and the client is still
there (``still_wanted``); otherwise the whole call raises :class:`~sandbox_server.errors.ServiceUnavailable`
and keeps no session.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Awaitable, Callable

import anyio

from envs.core import TextEnv
from envs.errors import SessionNotFound
from sandbox_server.env_sessions import EnvSession, close_quietly
from sandbox_server.errors import ServiceUnavailable, SessionHeld
from sandbox_server.session_host import (
    Opened, SessionHost, StillWanted, fork_env, make_env, reset_env, resetter, run_env, step_env,
)

#: Most items of one batched call whose env code runs in worker threads at once (blocking envs); the
#: threads come from anyio's pool, whose limiter (40 by default) bounds all requests together.
BATCH_THREADS = 32

#: An item's outcome: the single-session method's value, or the exception it would raise.
Outcome = Any


async def bounded(jobs: list[Callable[[], Awaitable[None]]]) -> None:
    """Run ``jobs`` concurrently, at most :data:`BATCH_THREADS` at a time (each job catches its own errors)."""
    if len(jobs) == 1:
        await jobs[0]()
        return
    queue = iter(jobs)

    async def worker() -> None:
        for job in queue:  # one iterator shared by the workers: each job runs once
            await job()

    async with anyio.create_task_group() as tg:
        for _ in range(min(BATCH_THREADS, len(jobs))):
            tg.start_soon(worker)


def _call(op: Callable[[EnvSession, int], Any], s: EnvSession, i: int) -> Outcome:
    try:
        return op(s, i)
    except Exception as exc:  # the item's answer, never the call's
        return exc


async def per_session(host: SessionHost, sids: list[str], op: Callable[[EnvSession, int], Any],
                      limiter: anyio.CapacityLimiter | None = None) -> list[Outcome]:
    """``outcomes[i] = op(session of sids[i], i)`` (or what it raised; SessionNotFound for an unknown session,
    SessionHeld for one an OpenEnv connection holds), as the module docstring says: inline for free non-blocking
    sessions, else under the session's lock, blocking ones in worker threads of ``limiter``
    (:meth:`~sandbox_server.env_sessions.EnvSessions.pool_threads` for work that may wait for the sandbox pool;
    None: anyio's default)."""
    out: list[Outcome] = [None] * len(sids)
    groups: dict[str, list[int]] = {}
    for i, sid in enumerate(sids):
        groups.setdefault(sid, []).append(i)
    later: list[Callable[[], Awaitable[None]]] = []
    for sid, idx in groups.items():
        try:
            s = host.access(sid)
        except (SessionNotFound, SessionHeld) as exc:
            for i in idx:
                out[i] = exc
            continue
        if not s.blocking and not s.lock.locked():
            for i in idx:
                try:
                    out[i] = op(s, i)
                except Exception as exc:  # the item's answer, never the call's
                    out[i] = exc
            continue

        async def job(s: EnvSession = s, idx: list[int] = idx, sid: str = sid) -> None:
            async with s.lock:
                try:
                    host.holders.check(sid, None)  # attached by a connection while this job waited
                except SessionHeld as exc:
                    for i in idx:
                        out[i] = exc
                    return
                for i in idx:
                    out[i] = (await anyio.to_thread.run_sync(_call, op, s, i, limiter=limiter) if s.blocking
                              else _call(op, s, i))

        later.append(job)
    if later:
        await bounded(later)
    return out


async def batch_step(host: SessionHost, sids: list[str], actions: list[Any]) -> list[Outcome]:
    """Action ``actions[i]`` in session ``sids[i]``; ``outcomes[i]``: (observation, reward, terminated, truncated,
    info) as :meth:`SessionHost.step`, or its error (SessionNotFound, EpisodeFinishedError, ActionTooLong,
    EnvInfraError)."""
    return await per_session(host, sids, lambda s, i: step_env(s.env, actions[i]))


async def batch_reset(host: SessionHost, items: list[tuple[str, int | None, dict[str, Any] | None]]) -> list[Outcome]:
    """``items[i] = (session id, seed, options)``; ``outcomes[i]``: (session, observation, info) as
    :meth:`SessionHost.reset`, or its error."""
    def op(s: EnvSession, i: int) -> tuple[EnvSession, str, dict[str, Any]]:
        obs, info = reset_env(s.env, items[i][1], items[i][2])
        return s, obs, info

    return await per_session(host, [it[0] for it in items], op, host.sessions.pool_threads())


async def _close(made: list[tuple[bool, list[TextEnv]]]) -> None:
    """Close envs that no session holds (blocking ones in one worker thread)."""
    for blocking, group in made:
        await run_env(blocking, lambda group=group: [close_quietly(e) for e in group])


async def batch_create(host: SessionHost, items: list[tuple[str, dict[str, Any], int | None, dict[str, Any] | None]],
                       still_wanted: StillWanted = None) -> list[Outcome]:
    """``items[i] = (env id, kwargs, seed, options)``; ``outcomes[i]``: the :class:`Opened` session as
    :meth:`SessionHost.create`, or its error. Raises ServiceUnavailable (keeping no session) when
    ``still_wanted`` says the client left."""
    sessions = host.sessions
    out: list[Outcome] = [None] * len(items)
    made: list[tuple[int, Any, Any, TextEnv, str, dict]] = []  # (index, slots, recipe, env, obs, info)
    later: list[Callable[[], Awaitable[None]]] = []
    with ExitStack() as held:
        try:
            for i, (env_id, kwargs, seed, options) in enumerate(items):
                try:
                    recipe = sessions.recipe(env_id, kwargs)
                    slots = held.enter_context(sessions.reserve(1))
                except Exception as exc:
                    out[i] = exc
                    continue
                if not recipe.blocking:
                    try:
                        made.append((i, slots, recipe, *make_env(recipe, resetter(seed, options))))
                    except Exception as exc:
                        out[i] = exc
                        slots.release()
                    continue

                async def job(i: int = i, slots: Any = slots, recipe: Any = recipe, seed: Any = seed,
                              options: Any = options) -> None:
                    try:
                        made.append((i, slots, recipe, *await anyio.to_thread.run_sync(
                            make_env, recipe, resetter(seed, options), limiter=sessions.pool_threads())))
                    except Exception as exc:
                        out[i] = exc
                        slots.release()

                later.append(job)
            if later:
                await bounded(later)
            if made and still_wanted is not None and not await still_wanted():  # nobody would learn of them
                raise ServiceUnavailable("the client closed the connection before its sessions were made")
            while made:
                i, slots, recipe, env, obs, info = made[-1]
                try:
                    out[i] = Opened(slots.commit(recipe.env_id, [env], recipe.blocking)[0], env, obs, info)
                except Exception as exc:
                    out[i] = exc
                    await _close([(recipe.blocking, [env])])
                made.pop()
        except BaseException:
            await _close([(m[2].blocking, [m[3]]) for m in made])
            raise
    return out


async def batch_fork(host: SessionHost, items: list[tuple[str, int]],
                     still_wanted: StillWanted = None) -> list[Outcome]:
    """``items[i] = (session id, n)``; ``outcomes[i]``: the ``n`` new session ids (all or none) as
    :meth:`SessionHost.fork`, or its error. Raises ServiceUnavailable (keeping no fork) when ``still_wanted``
    says the client left."""
    sessions = host.sessions
    made: list[tuple[int, Any, EnvSession, list[TextEnv]]] = []  # (index, slots, parent, children)
    with ExitStack() as held:

        def op(s: EnvSession, i: int) -> None:
            n = items[i][1]
            slots = held.enter_context(sessions.reserve(n))  # room for all n first: all or none
            try:
                children = fork_env(s.env, n)
            except BaseException:
                slots.release()
                raise
            made.append((i, slots, s, children))  # registered below, once every item is done

        try:
            out = await per_session(host, [sid for sid, _ in items], op, sessions.pool_threads())
            if made and still_wanted is not None and not await still_wanted():  # nobody would learn of them
                raise ServiceUnavailable("the client closed the connection before its forks were made")
            while made:
                i, slots, s, children = made[-1]
                try:
                    out[i] = slots.commit(s.env_id, children, s.blocking)
                except Exception as exc:
                    out[i] = exc
                    await _close([(s.blocking, children)])
                made.pop()
        except BaseException:
            await _close([(m[2].blocking, m[3]) for m in made])
            raise
    return out


async def batch_delete(host: SessionHost, sids: list[str]) -> list[bool | SessionHeld]:
    """Close the sessions ``sids`` as :meth:`SessionHost.delete` (blocking envs closed in worker threads,
    concurrently); ``[i]``: whether ``sids[i]`` existed (a repeated id: the first one), or :class:`SessionHeld`
    for a session an OpenEnv connection holds (not closed; the others are)."""
    out: list[bool | SessionHeld] = [False] * len(sids)
    free: list[int] = []
    for i, sid in enumerate(sids):
        try:
            host.holders.check(sid, None)
            free.append(i)
        except SessionHeld as exc:
            out[i] = exc
    for i, held in zip(free, await host.delete([sids[i] for i in free]), strict=True):
        out[i] = held
    return out


__all__ = ["BATCH_THREADS", "Outcome", "batch_create", "batch_delete", "batch_fork", "batch_reset", "batch_step",
           "bounded", "per_session"]
