"""The scripted demonstrators of wrapped envs: ``policy(env) -> the wrapped env's action``, from the visible state.

:meth:`envs.gym_adapter.GymTextEnv.demo_action` plays a profile's policy with probability ``skill`` (the mixing
rule of :func:`envs.features.mixed_demo`). FrozenLake, Taxi and CliffWalking: :func:`tabular_policy`, greedy on a
finite-horizon dynamic programme (discount :data:`DP_DISCOUNT`, horizon = the turns left) over the transition table
``P`` the env publishes, which follows from the visible map and the documented rules (shortest paths where moves
are deterministic, the most likely success on slippery ice). Blackjack: :func:`blackjack_policy`, the basic
strategy for hit / stick (Sutton & Barto, Reinforcement Learning, 2nd ed., ch. 5). MiniGrid:
:func:`minigrid_policy`, breadth-first search over (cell, heading) on the visible grid, to the goal, or first to
the key and the door it opens.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from envs.gym_adapter.renderings import MG_VEC


class PolicyView(Protocol):
    """What a demonstrator reads of a :class:`envs.gym_adapter.GymTextEnv`: the wrapped env, the turn budget and
    the turns taken, and the key of the wrapped env's model (its id and kwargs, for caches)."""

    _wrapped: Any
    max_turns: int

    @property
    def turn(self) -> int: ...

    def _model_key(self) -> str: ...


_DP_CACHE: OrderedDict[str, dict[str, Any]] = OrderedDict()
_DP_LOCK = threading.Lock()
DP_DISCOUNT = 0.999
#: Turns left beyond this are planned as this many (the discounted values have settled by then).
DP_MAX_HORIZON = 300


def tabular_policy(env: PolicyView) -> int:
    """The action of a finite-horizon dynamic programme over the wrapped env's transition table ``P`` (toy-text
    envs: ``P[s][a] = [(prob, next_s, reward, terminated), ...]``), with discount :data:`DP_DISCOUNT` and the
    horizon of the turns left (at most :data:`DP_MAX_HORIZON`); ties go to the lowest action index. Tables are cached
    per model (32 at most), under a lock."""
    wrapped = env._wrapped
    key = env._model_key()
    with _DP_LOCK:
        return _tabular_action(wrapped, key, max(1, min(env.max_turns - env.turn, DP_MAX_HORIZON)))


def _tabular_action(wrapped: Any, key: str, horizon: int) -> int:
    model = _DP_CACHE.get(key)
    if model is None:  # P as padded arrays: successor index and probability (0 for terminal) per outcome
        table = wrapped.P
        n_s, n_a = len(table), len(table[0])
        width = max(len(table[s][a]) for s in range(n_s) for a in range(n_a))
        reward, nxt, prob = np.zeros((n_s, n_a)), np.zeros((n_s, n_a, width), int), np.zeros((n_s, n_a, width))
        for s in range(n_s):
            for a in range(n_a):
                for k, (p, s2, r, done) in enumerate(table[s][a]):
                    reward[s, a] += p * r
                    nxt[s, a, k], prob[s, a, k] = s2, 0.0 if done else p
        model = _DP_CACHE[key] = {"R": reward, "N": nxt, "P": prob, "V": [np.zeros(n_s)]}
        while len(_DP_CACHE) > 32:
            _DP_CACHE.popitem(last=False)
    _DP_CACHE.move_to_end(key)
    values: list[np.ndarray] = model["V"]
    while len(values) < horizon:
        q_all = model["R"] + DP_DISCOUNT * (model["P"] * values[-1][model["N"]]).sum(axis=-1)
        values.append(q_all.max(axis=1))
    s = int(wrapped.s)
    q = model["R"][s] + DP_DISCOUNT * (model["P"][s] * values[horizon - 1][model["N"][s]]).sum(axis=-1)
    return int(np.flatnonzero(q >= q.max() - 1e-12)[0])


def blackjack_policy(env: PolicyView) -> int:
    """Basic strategy for hit (1) / stick (0) from the visible (sum, dealer card, usable ace): soft 19+ stick,
    soft 18 stick against 2..8; hard 17+ stick, 13..16 stick against 2..6, 12 stick against 4..6; else hit."""
    total, dealer, usable = (int(x) for x in env._wrapped._get_obs())
    if usable:
        return 0 if total >= 19 or (total == 18 and 2 <= dealer <= 8) else 1
    if total >= 17 or (13 <= total <= 16 and 2 <= dealer <= 6) or (total == 12 and 4 <= dealer <= 6):
        return 0
    return 1


_MG_LEFT, _MG_RIGHT, _MG_FORWARD, _MG_PICKUP, _MG_DROP, _MG_TOGGLE = range(6)


def _mg_plan(w: Any, target: Callable[[Any], bool], act: int) -> int | None:
    """First action of a shortest (cell, heading) plan until the cell in front satisfies ``target``, then ``act``;
    None when no such state is reachable over empty cells, open doors and the goal (never lava)."""
    grid = w.grid

    def cell(x: int, y: int) -> Any:
        return grid.get(x, y) if 0 <= x < grid.width and 0 <= y < grid.height else False

    def front(x: int, y: int, d: int) -> tuple[int, int]:
        return x + MG_VEC[d][0], y + MG_VEC[d][1]

    start = (int(w.agent_pos[0]), int(w.agent_pos[1]), int(w.agent_dir))
    seen = {start}
    queue: deque[tuple[tuple[int, int, int], int | None]] = deque([(start, None)])
    while queue:
        (x, y, d), first = queue.popleft()
        ahead = cell(*front(x, y, d))
        if ahead is not False and target(ahead):
            return act if first is None else first
        steps = [((x, y, (d - 1) % 4), _MG_LEFT), ((x, y, (d + 1) % 4), _MG_RIGHT)]
        if ahead is None or (ahead is not False and ahead.can_overlap() and ahead.type not in ("lava", "goal")):
            steps.append(((*front(x, y, d), d), _MG_FORWARD))
        for state, action in steps:
            if state not in seen:
                seen.add(state)
                queue.append((state, action if first is None else first))
    return None


def minigrid_policy(env: PolicyView) -> int:
    """Scripted MiniGrid play on the visible grid (:func:`_mg_plan`): to the goal if a path is open; else open a
    closed door; else with the key of a locked door in hand, unlock it; else pick that key up."""
    w = env._wrapped
    carrying = w.carrying
    locked = {c.color for c in w.grid.grid if c is not None and c.type == "door" and c.is_locked}
    plans: list[tuple[Callable[[Any], bool], int]] = [
        (lambda c: c is not None and c.type == "goal", _MG_FORWARD),
        (lambda c: c is not None and c.type == "door" and not c.is_open and not c.is_locked, _MG_TOGGLE),
    ]
    if carrying is not None and carrying.type == "key":
        plans.append((lambda c: c is not None and c.type == "door" and c.is_locked and c.color == carrying.color,
                      _MG_TOGGLE))
    elif carrying is None:
        plans.append((lambda c: c is not None and c.type == "key" and c.color in locked, _MG_PICKUP))
    for target, act in plans:
        action = _mg_plan(w, target, act)
        if action is not None:
            return action
    return _MG_LEFT
