"""What the tests over every registered env share (tests/envs/test_suite_contract.py,
tests/integrations/test_suite_clients.py): the ids, the one small per-env table of settings that keep the tests
fast, local envs built with their infrastructure, and a seeded scripted episode every client replays.

Every registered forkyard id is tested; none is skipped for what it is. An env whose class cannot be imported
(an optional package of the ``suite`` extra missing: ``make`` installs it) fails, with the catalog's note naming
the package. A sandboxed env (``uses_sandbox``) runs on the local backend, which needs bubblewrap
(:func:`tests.docker_support.require_bwrap`: a failure in CI); one that needs Docker would run under the docker
marker (:data:`NEEDS_DOCKER`).
"""

from __future__ import annotations

import json
import random
from typing import Any

import gymnasium as gym
import pytest

import envs
from envs.catalog import describe
from envs.core import TextEnv
from tests.docker_support import require_bwrap, require_docker

#: Settings that keep each env's tests fast (small rooms, short turn budgets); an id without a line runs with its
#: registered defaults. JSON values only: the same kwargs go to the server and every client.
SETTINGS: dict[str, dict[str, Any]] = {
    "forkyard/ClueProbe-v0": {"max_turns": 4},
    "forkyard/FileQA-v0": {"kinds": ["line_count"], "max_turns": 3},
    "forkyard/Household-v0": {"max_turns": 6, "rooms": 2, "objects": 3, "quest_length": 2, "n_games": 2},
    "forkyard/TextToSQL-v0": {"max_turns": 4, "rows": 6, "tables": 3},
    "forkyard/CodeRepair-v0": {"max_turns": 6, "functions": 2},
    "forkyard/Sokoban-v0": {"max_turns": 6, "dim": 5},
    "forkyard/FrozenLake-v0": {"max_turns": 6},
    "forkyard/Wordle-v0": {"max_turns": 4},
    "forkyard/TicketAPI-v0": {"max_turns": 6},
}
#: Actions to play (the one at index ``turn % len``) for an env whose ``info["legal_actions"]`` is empty; every
#: suite env is asked to offer the menu, so this stays empty unless one cannot.
ACTIONS: dict[str, list[str]] = {}
#: Ids whose infrastructure is Docker (none yet: sandboxed envs run on the local backend).
NEEDS_DOCKER: frozenset[str] = frozenset()
#: The seed of the scripted episodes.
SEED = 3


def suite_ids() -> list[str]:
    """Every registered forkyard id (built-in, the suite, plugins of this environment), sorted."""
    return sorted(envs.forkyard_specs())


def id_params(ids: list[str] | None = None) -> list[Any]:
    """``ids`` (default :func:`suite_ids`) as pytest params, those of :data:`NEEDS_DOCKER` under the docker mark."""
    return [pytest.param(i, id=i, marks=[pytest.mark.docker] if i in NEEDS_DOCKER else [])
            for i in (suite_ids() if ids is None else ids)]


def env_class(env_id: str) -> type[TextEnv]:
    """The class of ``env_id``; fails (never skips) with the catalog's note when it cannot be imported."""
    card = describe(env_id, tools=False)
    if card.fork_method is None:
        pytest.fail(f"{env_id} cannot be loaded: {card.note}")
    module, _, name = card.entry_point.partition(":")
    return getattr(__import__(module, fromlist=[name]), name)


def settings(env_id: str) -> dict[str, Any]:
    """The kwargs the tests use for ``env_id`` (a copy)."""
    return json.loads(json.dumps(SETTINGS.get(env_id, {})))


def require_infra(env_id: str) -> None:
    """Fail in CI (skip elsewhere) when ``env_id``'s infrastructure is missing: a sandboxed env runs in-process on
    its default backend (``FORKYARD_BACKEND``, else the local one: bubblewrap), Docker for :data:`NEEDS_DOCKER`."""
    if env_id in NEEDS_DOCKER:
        require_docker()
    elif env_class(env_id).uses_sandbox:
        require_bwrap()


def make_local(env_id: str, **extra: Any) -> TextEnv:
    """``gymnasium.make(env_id, **settings)``, unwrapped (a sandboxed env takes its default backend's shared
    provider, as a user's in-process env does: JSON kwargs only, so ``env.spec`` makes it again)."""
    require_infra(env_id)
    return gym.make(env_id, **settings(env_id), **extra).unwrapped


def pick(env_id: str, info: dict[str, Any], rng: random.Random) -> str:
    """A legal action for this turn: drawn with ``rng`` from ``info["legal_actions"]`` (else :data:`ACTIONS`)."""
    legal = info.get("legal_actions") or []
    if legal:
        return rng.choice(list(legal))
    actions = ACTIONS.get(env_id)
    assert actions, (f"{env_id} offers no info['legal_actions'] at turn {info.get('turn')} and the test table has "
                     "no actions for it (tests/suite_support.py ACTIONS)")
    return actions[int(info.get("turn", 0)) % len(actions)]


def plain(value: Any) -> Any:
    """``value`` as JSON carries it (tuples as lists): what a server or a client hands back."""
    return json.loads(json.dumps(value))


def scripted_episode(env_id: str, seed: int = SEED, max_steps: int = 64) -> dict[str, Any]:
    """A local episode of seeded random legal play (:func:`pick` with ``random.Random(seed)``), to the end:
    ``first`` (observation, info), ``actions``, and ``steps`` (observation, reward, terminated, truncated, info)
    per action, infos as JSON carries them."""
    env = make_local(env_id)
    try:
        obs, info = env.reset(seed=seed)
        out: dict[str, Any] = {"first": (obs, plain(info)), "actions": [], "steps": []}
        rng = random.Random(seed)
        for _ in range(max_steps):
            action = pick(env_id, info, rng)
            obs, reward, terminated, truncated, info = env.step(action)
            out["actions"].append(action)
            out["steps"].append((obs, float(reward), bool(terminated), bool(truncated), plain(info)))
            if terminated or truncated:
                return out
        pytest.fail(f"{env_id}: an episode of random legal play did not end within {max_steps} steps")
    finally:
        env.close()
