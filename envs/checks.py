"""Checks of the fork / snapshot / seeding contract of a :class:`~envs.core.TextEnv`, for env authors.

In the manner of :mod:`gymnasium.utils.env_checker`: small ``check_*`` functions, each raising
``AssertionError`` with a message that names the broken promise. :func:`check_fork_contract` runs them all::

    from envs.checks import check_fork_contract
    check_fork_contract(MyEnv(**kwargs), seed=0)

Actions: when the env offers ``info["legal_actions"]`` the checks pick from it deterministically (the
legal action at index ``turn % len(legal)``), so episodes reach varied states and, for finite menus, the
end. An env with an open action set needs ``actions``: a list of action texts, the one at index
``turn % len(actions)`` is played on each turn.

A "fresh env" is built by ``make_env()`` (default ``type(env)(**kwargs)`` with the kwargs a snapshot records, the
constructor arguments a snapshot records). Every env a check creates (forks, fresh envs, restored envs) is closed
before it returns; the env passed in is reset and stepped but never closed.

Limits: the checks compare runs on the same machine and seeds they choose; they can miss a fault that shows
only in other states, and a seed-ignoring env is caught only when ignoring the seed changes an episode
(see :func:`check_seeded_reset_determinism`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envs.core import TextEnv, _digest

__all__ = [
    "check_anchor_keys",
    "check_fork_contract",
    "check_fork_independence",
    "check_observations_in_space",
    "check_seeded_reset_determinism",
    "check_snapshot_round_trip",
]


# --------------------------------------------------------------------------- helpers
def _fresh_factory(env: TextEnv, make_env: Callable[[], TextEnv] | None) -> Callable[[], TextEnv]:
    if make_env is not None:
        return make_env
    kwargs = dict(env._kwargs)  # what a snapshot records as the env's constructor kwargs
    return lambda: type(env)(**kwargs)


def _pick(env: TextEnv, info: dict[str, Any], actions: Sequence[str] | None, offset: int = 0) -> str:
    """The action for ``env``'s current turn (deterministic); ``offset`` shifts the choice."""
    if actions:
        return actions[(env.turn + offset) % len(actions)]
    legal = info.get("legal_actions")
    if legal:
        return legal[(env.turn + offset) % len(legal)]
    raise AssertionError(
        f"{type(env).__name__} offers no info['legal_actions'] here (turn {env.turn}); "
        "pass actions=[...] to check_fork_contract")


def _assert_in_space(env: TextEnv, obs: Any, where: str) -> None:
    assert env.observation_space.contains(obs), (
        f"{where}: observation {str(obs)[:80]!r}... (type {type(obs).__name__}, length "
        f"{len(obs) if isinstance(obs, str) else '?'}) is not contained in the observation space "
        f"{env.observation_space}")


def _state(env: TextEnv) -> tuple:
    """The visible state the contract talks about: history, turn, info (anchor_key included), done."""
    return (env.history, env.turn, env.current_info(), env.done)


def _step(env: TextEnv, action: str, where: str) -> tuple:
    out = env.step(action)
    _assert_in_space(env, out[0], where)
    return out


def _run(
    env: TextEnv, info: dict[str, Any], actions: Sequence[str] | None, where: str, limit: int | None = None
) -> list[tuple]:
    """Step ``env`` with the picked actions until the episode ends (or ``limit`` steps); the step results."""
    results: list[tuple] = []
    while not env.done and (limit is None or len(results) < limit):
        action = _pick(env, info, actions)
        out = _step(env, action, f"{where}, turn {env.turn} ({action})")
        results.append((action,) + tuple(out))
        info = out[4]
    return results


def _close(*envs: TextEnv) -> None:
    for e in envs:
        try:
            e.close()
        except Exception:  # noqa: BLE001 - a failed close must not hide the check's own failure
            pass


def _warm_up(env: TextEnv, seed: int, actions: Sequence[str] | None) -> dict[str, Any]:
    """Reset ``env`` with ``seed`` and take one turn when the budget leaves at least two more; the info."""
    obs, info = env.reset(seed=seed)
    _assert_in_space(env, obs, f"reset(seed={seed})")
    if getattr(env, "max_turns", 1) > 2:
        info = _step(env, _pick(env, info, actions), "warm-up step")[4]
    return info


# --------------------------------------------------------------------------- the checks
def check_fork_independence(env: TextEnv, seed: int = 0, actions: Sequence[str] | None = None, n: int = 3) -> None:
    """Fork independence.

    Asserts that ``env.fork(n)`` (taken after ``reset(seed=seed)`` and one step) gives ``n`` children whose
    first observation, history, turn and ``current_info()`` (``anchor_key`` and ``legal_actions`` included)
    equal the parent's; that stepping one child to the end of its episode leaves the parent and the other
    children unchanged; that closing a child leaves them unchanged too; and that a sibling and the parent,
    stepped with the same actions afterwards, give the same step results as the first child did (each
    kept its own state and RNG).
    """
    assert n >= 2, "check_fork_independence needs n >= 2"
    info = _warm_up(env, seed, actions)
    parent = _state(env)
    first = env._first_observation
    children = env.fork(n)
    try:
        assert len(children) == n, f"fork({n}) returned {len(children)} envs"
        for i, child in enumerate(children):
            assert child is not env, f"fork child {i} is the parent object itself"
            assert child._first_observation == first, f"fork child {i} starts from another first observation"
            assert _state(child) == parent, (
                f"fork child {i} starts from another state than its parent:\n child  {_state(child)}\n parent {parent}")
        ran = _run(children[0], info, actions, "fork child 0")
        for i, other in enumerate(children[1:], 1):
            assert _state(other) == parent, (
                f"stepping fork child 0 changed fork child {i}: history/turn/info now {_state(other)}, was {parent}")
        assert _state(env) == parent, (
            f"stepping fork child 0 changed the parent: history/turn/info now {_state(env)}, was {parent}")
        if n >= 3:
            children[0].close()
            for i, other in enumerate(children[1:], 1):
                assert _state(other) == parent, f"closing fork child 0 changed fork child {i}"
            assert _state(env) == parent, "closing fork child 0 changed the parent"
        for who, target in [(f"fork child {n - 1}", children[-1]), ("the parent", env)]:
            again = _run(target, info, actions, who)
            assert again == ran, (
                f"{who}, stepped with the same actions as fork child 0 from the same state, gave other results:\n"
                f" {who}: {again}\n fork child 0: {ran}")
    finally:
        _close(*children)


def check_snapshot_round_trip(env: TextEnv, seed: int = 0, actions: Sequence[str] | None = None,
                              make_env: Callable[[], TextEnv] | None = None) -> None:
    """Snapshot round trip.

    Asserts that after ``reset(seed=seed)`` and one step, ``snapshot() -> to_bytes() -> restore()`` into a
    fresh env (``make_env()``, default: same class and constructor kwargs) gives the same history, turn and
    ``current_info()``, and that the restored env and a fork of the original, stepped with the same actions
    to the episode's end, give identical step results (observation, reward, terminated, truncated, info).
    """
    factory = _fresh_factory(env, make_env)
    info = _warm_up(env, seed, actions)
    data = env.snapshot().to_bytes()
    assert isinstance(data, bytes), f"Snapshot.to_bytes() returned {type(data).__name__}, not bytes"
    original = env.fork(1)[0]
    restored = factory()
    try:
        restored.restore(data)
        assert _state(restored) == _state(original), (
            f"restored env differs from the snapshotted one:\n restored {_state(restored)}\n"
            f" original {_state(original)}")
        want = _run(original, info, actions, "fork of the snapshotted env")
        got = _run(restored, info, actions, "restored env")
        assert got == want, f"restored env stepped differently from the original:\n restored {got}\n original {want}"
    finally:
        _close(original, restored)


def check_seeded_reset_determinism(env: TextEnv, seed: int = 0, actions: Sequence[str] | None = None,
                                   make_env: Callable[[], TextEnv] | None = None, n_seeds: int = 3) -> None:
    """Seeded-reset determinism after fork and after restore.

    For each of the seeds ``seed, seed + 1, ..., seed + n_seeds - 1`` asserts that ``reset(seed=s)`` on a
    fork child (of ``env`` after an episode's first step) and on an env restored from a snapshot of ``env``
    return the same observation and info as a fresh env's ``reset(seed=s)``, and the same step results when
    all three then play the same actions to the episode's end. An env that ignores the seed passes only if
    ignoring it changes no episode; several seeds and whole episodes make that unlikely.
    """
    factory = _fresh_factory(env, make_env)
    _warm_up(env, seed, actions)
    data = env.snapshot().to_bytes()
    for s in range(seed, seed + n_seeds):
        fresh = factory()
        child = env.fork(1)[0]
        restored = factory()
        try:
            restored.restore(data)
            runs = {}
            for who, e in [("fresh env", fresh), ("fork child", child), ("restored env", restored)]:
                obs, info = e.reset(seed=s)
                _assert_in_space(e, obs, f"{who}.reset(seed={s})")
                runs[who] = [(obs, info)] + _run(e, info, actions, f"{who} after reset(seed={s})")
            for who in ("fork child", "restored env"):
                assert runs[who] == runs["fresh env"], (
                    f"reset(seed={s}) on a {who} does not give a fresh env's episode for seed {s}:\n"
                    f" {who}: {runs[who]}\n fresh env: {runs['fresh env']}")
        finally:
            _close(fresh, child, restored)


def check_anchor_keys(env: TextEnv, seed: int = 0, actions: Sequence[str] | None = None,
                      make_env: Callable[[], TextEnv] | None = None, n_seeds: int = 3) -> None:
    """Anchor keys depend on the visible history only.

    Asserts that (a) on every state of an episode ``info["anchor_key"]`` equals the key recomputed from the
    visible history alone (first observation, then each ``(action, observation)`` pair, with TextEnv's
    documented BLAKE2b chain), for fresh envs reset with ``n_seeds`` seeds; (b) envs of those different seeds
    (different hidden state) whose visible histories are equal have equal anchor keys, and envs with
    different visible histories have different ones; (c) two forks taking the same action get the same
    anchor key, and two forks taking different actions get different ones.
    """
    factory = _fresh_factory(env, make_env)
    seen: dict[tuple, str] = {}
    for s in range(seed, seed + n_seeds):
        e = factory()
        try:
            obs, info = e.reset(seed=s)
            first = obs
            while True:
                expect = _digest("reset\x1f" + first)
                for action, o in e.history:
                    expect = _digest(f"{expect}\x1f{action}\x1e{o}")
                visible = (first, tuple(e.history))
                assert info["anchor_key"] == expect, (
                    f"seed {s}, turn {e.turn}: anchor_key {info['anchor_key']} is not the hash of the visible "
                    f"history ({expect}); does it include hidden state?")
                for other, key in seen.items():
                    if other == visible:
                        assert key == info["anchor_key"], (
                            f"seed {s}, turn {e.turn}: equal visible histories, other anchor keys")
                    else:
                        assert key != info["anchor_key"], (
                            f"seed {s}, turn {e.turn}: different visible histories share an anchor key")
                seen[visible] = info["anchor_key"]
                if e.done:
                    break
                info = _step(e, _pick(e, info, actions), f"anchor check, seed {s}, turn {e.turn}")[4]
        finally:
            _close(e)
    info = _warm_up(env, seed, actions)
    if env.done:
        return
    a, b, c = env.fork(3)
    try:
        act1 = _pick(env, info, actions)
        act2 = next((_pick(env, info, actions, k) for k in range(1, 64) if _pick(env, info, actions, k) != act1), None)
        ka, kb = a.step(act1)[4]["anchor_key"], b.step(act1)[4]["anchor_key"]
        assert ka == kb, f"two forks took the same action {act1!r} and got different anchor keys {ka} != {kb}"
        if act2 is not None:
            kc = c.step(act2)[4]["anchor_key"]
            assert kc != ka, f"forks taking different actions {act1!r} and {act2!r} got the same anchor key {ka}"
    finally:
        _close(a, b, c)


def check_observations_in_space(env: TextEnv, seed: int = 0, actions: Sequence[str] | None = None) -> None:
    """Every observation of an episode (``reset(seed=seed)``, then picked actions to its end) is contained in
    ``env.observation_space``. (The other checks assert the same of every observation they see.)"""
    obs, info = env.reset(seed=seed)
    _assert_in_space(env, obs, f"reset(seed={seed})")
    _run(env, info, actions, "episode")


def check_fork_contract(env: TextEnv, seed: int = 0, actions: Sequence[str] | None = None, *,
                        make_env: Callable[[], TextEnv] | None = None) -> None:
    """Run every check of this module on ``env`` (an unwrapped :class:`TextEnv`; pass ``env.unwrapped`` of a
    ``gymnasium.make`` env): fork independence, snapshot round trip, seeded-reset determinism after fork
    and restore, anchor keys from visible history only, observations in the observation space.

    Args:
        env: the env to check; it is reset and stepped, never closed.
        seed: the first seed the checks use.
        actions: action texts to play (index ``turn % len``); default the env's ``info["legal_actions"]``.
        make_env: builds a fresh env of the same kwargs (default ``type(env)(**kwargs)`` with the kwargs a snapshot
            records).

    Raises:
        AssertionError: naming the first broken promise.
    """
    assert isinstance(env, TextEnv), f"check_fork_contract needs an unwrapped TextEnv, got {type(env).__name__}"
    if actions is not None:
        actions = list(actions)
        assert actions and all(isinstance(a, str) for a in actions), "actions must be a non-empty list of strings"
    check_observations_in_space(env, seed, actions)
    check_fork_independence(env, seed, actions)
    check_snapshot_round_trip(env, seed, actions, make_env)
    check_seeded_reset_determinism(env, seed, actions, make_env)
    check_anchor_keys(env, seed, actions, make_env)
