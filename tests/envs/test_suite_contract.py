"""Every registered forkyard env (built-in, the suite of envs/suite/, plugins), in this process: the registry is
Gymnasium's and the catalog describes every id truthfully; ``gymnasium.make`` and Gymnasium's ``check_env``;
``check_fork_contract``; a seeded reset is the same episode on a fresh env, a fork and a restored snapshot. The
settings that keep it fast and the scripted play: tests/suite_support.py. The clients (server, OpenEnv, TRL,
SkyRL): tests/integrations/test_suite_clients.py."""

from __future__ import annotations

import random
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.catalog import EnvCard, catalog, describe
from envs.core import FORK_METHODS, Snapshot, TextEnv
from envs.features import ToolSchemas
from envs.suite import SUITE
from envs.tool_calls import canonical_action
from tests.suite_support import ACTIONS, SEED, SETTINGS, env_class, id_params, make_local, pick, plain, suite_ids


# ------------------------------------------------------------------------------------ one registry, one catalog
def test_the_registry_is_gymnasiums_and_lists_every_id_once():
    ids = suite_ids()
    assert {"forkyard/ClueProbe-v0", "forkyard/FileQA-v0", *(i for i, _, _ in SUITE)} <= set(ids)
    for env_id in ids:
        spec = gym.spec(env_id)  # the one registry: Gymnasium's EnvSpec is forkyard's
        assert envs.env_spec(env_id) == (env_id, spec.entry_point.entry_point, spec.kwargs)
    assert [i for i, _, _ in SUITE] == [i for i in envs.forkyard_specs() if i in {s[0] for s in SUITE}]  # in order
    with pytest.raises(KeyError, match="unknown env id 'CartPole-v1'"):  # Gymnasium's own envs are not forkyard's
        envs.env_spec("CartPole-v1")
    with pytest.raises(ValueError, match="another package's env"):
        envs.register_env("CartPole-v1", "envs.clueprobe:ClueProbeEnv")
    with pytest.raises(ValueError, match="already registered as envs.clueprobe:ClueProbeEnv"):
        envs.register_env("forkyard/ClueProbe-v0", "envs.clueprobe:ClueProbeEnv", max_turns=9)
    envs.register_env("forkyard/ClueProbe-v0", "envs.clueprobe:ClueProbeEnv", max_turns=5, bits=3)  # same: no-op


def test_a_registration_reaches_the_catalog_and_leaves_with_gymnasiums_entry():
    env_id = "forkyard-test/Probe-v0"
    envs.register_env(env_id, "envs.clueprobe:ClueProbeEnv", max_turns=2, bits=1)
    try:
        card = describe(env_id)
        assert (card.max_turns, card.tools, card.kwargs) == (2, ["probe", "answer"], {"max_turns": 2, "bits": 1})
        assert env_id in [c.env_id for c in catalog(tools=False)]
    finally:
        gym.registry.pop(env_id)
    assert env_id not in envs.forkyard_specs()


@pytest.fixture(scope="module")
def cards() -> dict[str, EnvCard]:
    return {c.env_id: c for c in catalog()}


@pytest.mark.parametrize("env_id", id_params())
def test_the_catalog_describes_each_env_as_it_is(env_id, cards):
    card = cards[env_id]
    assert card.fork_method in FORK_METHODS, f"{env_id}: {card.note}"  # the class imports (or says why not)
    assert card.summary
    names = [s.name for s in card.settings]
    assert "max_turns" in names and len(set(names)) == len(names)
    cls = env_class(env_id)
    assert card.sandboxed == cls.uses_sandbox and card.demonstrator == hasattr(cls, "demo_action")
    assert card.finite_actions == hasattr(cls, "action_vocabulary")
    assert card.evaluation_resets == hasattr(cls, "evaluation_resets")
    env = make_local(env_id)
    try:
        assert isinstance(env, ToolSchemas), f"{env_id} declares no tool schemas"
        env.reset(seed=SEED)
        tools = [t["function"]["name"] for t in env.tool_schemas()]
        assert env.fork_method in FORK_METHODS
        if card.sandboxed:
            assert card.tools is None and card.note == "needs a sandbox"
        else:  # built with its registered defaults, by the catalog
            assert card.tools == tools and card.note == "" and card.fork_method == env.fork_method
            defaults = gym.make(env_id).unwrapped
            assert card.max_turns == defaults.max_turns >= 1
            defaults.close()
        for s in card.settings:
            assert s.doc, f"{env_id}: the setting {s.name!r} is not described in the class docstring's Args"
    finally:
        env.close()


# ------------------------------------------------------------------------------------ Gymnasium, fork contract
@pytest.mark.parametrize("env_id", id_params())
def test_gymnasium_make_and_check_env(env_id):
    env = make_local(env_id)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning of Gymnasium's checker is a failure
            check_env(env)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", id_params())
def test_check_fork_contract(env_id):
    env = make_local(env_id)
    try:
        envs.check_fork_contract(env, seed=SEED, actions=ACTIONS.get(env_id),
                                 make_env=lambda: make_local(env_id))
    finally:
        env.close()


@pytest.mark.parametrize("env_id", id_params())
def test_a_seeded_reset_is_one_episode_on_a_fresh_env_a_fork_and_a_restored_snapshot(env_id):
    env, fresh, restored = make_local(env_id), make_local(env_id), make_local(env_id)
    kids: list[TextEnv] = []
    try:
        first = env.reset(seed=SEED)
        rng, info = random.Random(SEED), first[1]
        for _ in range(2):
            if env.done:
                break
            info = env.step(pick(env_id, info, rng))[4]
        kids = env.fork(1)
        restored.restore(Snapshot.from_bytes(env.snapshot().to_bytes()))  # through JSON bytes, as it travels
        assert restored.last_observation == env.last_observation
        want = (first[0], plain(first[1]))
        for other in (fresh, kids[0], restored, env):
            obs, info = other.reset(seed=SEED)
            assert (obs, plain(info)) == want, f"{env_id}: reset(seed={SEED}) differs on {other!r}"
    finally:
        for e in (env, fresh, restored, *kids):
            e.close()


@pytest.mark.parametrize("env_id", id_params())
def test_every_legal_action_is_the_canonical_text_of_a_tool_call(env_id):
    """What TRL, SkyRL, the OpenAI client and the text policy send is the canonical text of the model's tool call
    (:func:`envs.tool_calls.call_to_action`); a menu written otherwise (``f(x=1)`` where ``f(1)`` is canonical)
    gives the same move another history, hence other anchor keys, than a model's call."""
    env = make_local(env_id)
    try:
        obs, info = env.reset(seed=SEED)
        tools, rng = env.tool_schemas(), random.Random(SEED)
        while True:
            for action in info.get("legal_actions") or []:
                assert canonical_action(action, tools) == action, (
                    f"{env_id}: the legal action {action!r} is not canonical: a tool call of it reads as "
                    f"{canonical_action(action, tools)!r}")
            obs, _, terminated, truncated, info = env.step(pick(env_id, info, rng))
            if terminated or truncated:
                break
    finally:
        env.close()


def test_the_settings_table_names_registered_ids_and_real_settings():
    for env_id, kwargs in SETTINGS.items():
        assert env_id in envs.forkyard_specs(), f"tests/suite_support.py SETTINGS names {env_id}, not registered"
        names = {s.name for s in describe(env_id, tools=False).settings}
        assert set(kwargs) <= names, f"{env_id}: {sorted(set(kwargs) - names)} are no settings of it"
