"""Field case S44: envs made by ``gymnasium.make("forkyard/...")`` and their specs pickle and unpickle into
working envs (multiprocessing with spawn, Ray and checkpointing code pickle envs); a live sandbox-backed env
and a RemoteEnv holding a server session refuse with a message naming what cannot cross."""

from __future__ import annotations

import multiprocessing
import pickle

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs import RemoteEnv, TextEnv
from envs.clueprobe import ClueProbeEnv
from sandbox_server.app import create_env_app
from sandbox_server.embedded import shared_provider
from tests.docker_support import UvicornThread, require_bwrap

IDS = sorted(envs.forkyard_specs())
KW = {"max_turns": 4, "bits": 5}


def play(env: gym.Env, seed: int, n_steps: int = 3) -> list:
    """``reset(seed)`` then ``n_steps`` steps of the first legal action (or ``ls()``): everything returned."""
    obs, info = env.reset(seed=seed)
    out: list = [(obs, info)]
    for _ in range(n_steps):
        legal = info.get("legal_actions") or ["ls()"]
        obs, reward, term, trunc, info = env.step(legal[0])
        out.append((obs, reward, term, trunc, info))
        if term or trunc:
            break
    return out


def play_pickled(data: bytes, seed: int) -> list:
    """Run in a spawned process: unpickle an env, play it, close it."""
    import envs  # noqa: F401 - what a worker imports anyway; the pickle names its classes by module

    env = pickle.loads(data)
    try:
        return play(env, seed)
    finally:
        env.close()


def continue_pickled(data: bytes) -> list:
    """Run in a spawned process: unpickle an env in mid-episode and step it with ``probe(1)`` then ``answer(0)``."""
    env = pickle.loads(data)
    return [env.step("probe(1)"), env.step("probe(2)"), env.step("answer(0)")]


@pytest.fixture(scope="module")
def server():
    """A real env server on loopback that serves every id (FileQA on the local sandbox backend)."""
    require_bwrap()
    srv = UvicornThread(create_env_app(ttl_s=600, sandbox_provider=shared_provider("local"))).start()
    yield srv
    srv.stop()


# ---------------------------------------------------------------------------------------------- specs
@pytest.mark.parametrize("env_id", IDS)
def test_s44_every_registered_spec_pickles_and_makes_a_working_env(env_id):
    spec = gym.spec(env_id)
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and back.entry_point == spec.entry_point
    made = gym.make(back, **({"kinds": ["constant"]} if env_id == "forkyard/FileQA-v0" else {}))
    try:
        assert isinstance(made.unwrapped, TextEnv) and made.spec.id == env_id
        steps = play(made, seed=3)
        assert len(steps) >= 2 and made.observation_space.contains(steps[-1][0])
    finally:
        made.close()


# ---------------------------------------------------------------------------------------------- made envs
@pytest.mark.parametrize("env_id", IDS)
def test_s44_every_made_env_pickles_into_a_working_env_or_refuses_by_name(env_id):
    made = gym.make(env_id)
    try:
        if not made.unwrapped.uses_sandbox:
            back = pickle.loads(pickle.dumps(made))
            assert [type(w) for w in _layers(back)] == [type(w) for w in _layers(made)]
            assert back.spec == made.spec
            assert play(back, seed=7) == play(made, seed=7)
            return
        with pytest.raises(TypeError, match="sandbox provider .* cannot cross a process boundary"):
            pickle.dumps(made)
    finally:
        made.close()


def _layers(env: gym.Env) -> list:
    out = [env]
    while hasattr(out[-1], "env"):
        out.append(out[-1].env)
    return out


def test_s44_the_case_clueprobe_in_mid_episode_continues_where_it_was():
    made = gym.make("forkyard/ClueProbe-v0", max_episode_steps=10, **KW)
    made.reset(seed=11)
    made.step("probe(0)")
    back = pickle.loads(pickle.dumps(made))
    assert back.unwrapped.turn == 1 and back.unwrapped.history == made.unwrapped.history
    for action in ("probe(1)", "probe(2)", "answer(9)"):
        assert back.step(action) == made.step(action)
    assert play(back, seed=None) == play(made, seed=None)  # the RNG crossed too: the same unseeded episode


def test_s44_s40_a_pickled_fork_copy_keeps_its_own_later_episodes():
    parent = ClueProbeEnv(**KW)
    parent.reset(seed=11)
    a, b = parent.fork(2)
    a2, b2 = pickle.loads(pickle.dumps(a)), pickle.loads(pickle.dumps(b))
    for original, copy in ((a, a2), (b, b2)):
        original.reset()
        copy.reset()
        assert copy.snapshot().state["task"] == original.snapshot().state["task"]
    assert a.snapshot().state["task"] != b.snapshot().state["task"]


_OPS = st.lists(st.one_of(st.tuples(st.just("reset"), st.one_of(st.none(), st.integers(0, 2**31 - 1))),
                          st.tuples(st.just("step"), st.sampled_from(["probe(0)", "probe(3)", "answer(7)", "x y"])),
                          st.tuples(st.just("fork"), st.integers(1, 3))), max_size=8)


@settings(max_examples=40, deadline=None)
@given(_OPS)
def test_s44_property_a_pickled_env_continues_as_the_original_would(ops):
    env = gym.make("forkyard/ClueProbe-v0", **KW)
    env.reset(seed=0)
    bare = env.unwrapped
    for op, arg in ops:
        if op == "reset":
            bare.reset(seed=arg)
        elif op == "step" and not bare.done:
            bare.step(arg)
        elif op == "fork":
            bare = bare.fork(arg)[-1]
    back = pickle.loads(pickle.dumps(bare))
    assert back.snapshot() == bare.snapshot()
    for e in (bare, back):  # finish the episode, then two unseeded episodes: the same for both
        while not e.done:
            e.step("probe(1)")
    assert play(back, seed=None) == play(bare, seed=None)
    assert play(back, seed=None) == play(bare, seed=None)


def test_s44_spawned_processes_run_pickled_envs():
    ctx = multiprocessing.get_context("spawn")
    made = gym.make("forkyard/ClueProbe-v0", **KW)
    made.reset(seed=5)
    made.step("probe(0)")
    with ctx.Pool(2) as pool:
        fresh = pool.apply(play_pickled, (pickle.dumps(gym.make("forkyard/ClueProbe-v0", **KW)), 21))
        middle = pool.apply(continue_pickled, (pickle.dumps(made),))
    assert fresh == play(gym.make("forkyard/ClueProbe-v0", **KW), 21)
    assert middle == [made.step("probe(1)"), made.step("probe(2)"), made.step("answer(0)")]
    assert middle[-1][2] is True and middle[-1][4]["termination_reason"] == "answered"


# ---------------------------------------------------------------------------------------------- RemoteEnv
@pytest.mark.parametrize("env_id", IDS)
def test_s44_a_remote_env_before_reset_pickles_after_reset_refuses(server, env_id):
    kw = {"kinds": ["constant"]} if env_id == "forkyard/FileQA-v0" else {}
    made = gym.make(env_id, server_url=server.url, **kw)
    assert isinstance(made.unwrapped, RemoteEnv)
    back = pickle.loads(pickle.dumps(made))
    try:
        assert back.unwrapped.session_id is None and back.unwrapped._client is not made.unwrapped._client
        assert play(back, seed=2) == play(made, seed=2)  # its own session, the same episode
        with pytest.raises(TypeError, match="live server session"):
            pickle.dumps(made)
    finally:
        back.close()
        made.close()


def test_s44_a_remote_env_runs_in_a_spawned_process(server):
    made = gym.make("forkyard/ClueProbe-v0", server_url=server.url, **KW)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        got = pool.apply(play_pickled, (pickle.dumps(made), 9))
    local = play(gym.make("forkyard/ClueProbe-v0", **KW), 9)
    assert [s[0] for s in got] == [s[0] for s in local]
    assert [s[1:4] for s in got[1:]] == [s[1:4] for s in local[1:]]
    made.close()


def test_s44_a_pickled_remote_env_keeps_its_api_key():
    key = "s44-test-key-0123456789abcdef"
    srv = UvicornThread(create_env_app(ttl_s=600, api_key=key)).start()
    try:
        made = gym.make("forkyard/ClueProbe-v0", server_url=srv.url, api_key=key, **KW)
        back = pickle.loads(pickle.dumps(made))
        try:
            assert play(back, seed=4) == play(made, seed=4)  # the server answered 200: the key crossed
        finally:
            back.close()
            made.close()
        keyless = pickle.loads(pickle.dumps(gym.make("forkyard/ClueProbe-v0", server_url=srv.url, api_key=None, **KW)))
        with pytest.raises(PermissionError):
            keyless.reset(seed=4)
        keyless.close()
    finally:
        srv.stop()
