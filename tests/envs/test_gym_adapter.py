"""forkyard/Gym-v0 (envs/gym_adapter/): Gymnasium envs as forkable text envs. Registration and Gymnasium's checker,
the fork contract for each fork method (state codec, deepcopy, verified replay), a replay that diverges refused,
snapshots restored in another process, the allow-list and bounded kwargs, tools and illegal actions, the
terminated / truncated mapping, and the scripted demonstrator against random play per env."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401 - registers forkyard/Gym-v0
from envs.checks import check_fork_contract
from envs.gym_adapter import GYM_PROFILES, GymTextEnv, ReplayDivergedError, allow_gym_id

ROOT = Path(__file__).resolve().parents[2]
SHOWN = ["FrozenLake-v1", "Taxi-v4", "CliffWalking-v1", "Blackjack-v1", "MiniGrid-DoorKey-5x5-v0"]


def make(gym_id: str, **kwargs) -> GymTextEnv:
    env = gym.make("forkyard/Gym-v0", gym_id=gym_id, **kwargs).unwrapped
    assert isinstance(env, GymTextEnv)
    return env


# ------------------------------------------------------------------ wrapped envs of the tests' own
class GuessEnv(gym.Env):
    """Text actions; its own get_state / set_state (the codec protocol). Guess a 3-letter word over ``abcd``; the
    observation is the number of letters in place, plus a hint letter drawn from the env's RNG every step."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.action_space = spaces.Text(max_length=3, min_length=3, charset="abcd")
        self.observation_space = spaces.Discrete(4)
        self.word, self.last, self.hint = "aaa", 0, "a"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = "".join(self.np_random.choice(list("abcd"), 3))
        self.last, self.hint = 0, "a"
        return 0, {}

    def step(self, action):
        self.last = sum(a == b for a, b in zip(action, self.word, strict=True))
        self.hint = self.word[int(self.np_random.integers(3))]
        return self.last, float(action == self.word), action == self.word, False, {}

    def render(self):
        return f"{self.last} letters in place; the word holds {self.hint!r}"

    def get_state(self):
        return {"word": self.word, "last": self.last, "hint": self.hint,
                "rng": dict(self.np_random.bit_generator.state)}

    def set_state(self, state):
        import numpy as np
        self.word, self.last, self.hint = state["word"], state["last"], state["hint"]
        bitgen = np.random.PCG64()
        bitgen.state = state["rng"]
        self.np_random = np.random.Generator(bitgen)


class NoisyEnv(gym.Env):
    """Deliberately nondeterministic: each step's observation comes from Python's global, unseeded RNG."""

    metadata = {"render_modes": []}

    def __init__(self, render_mode=None):
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(0.0, 1.0, (1,))
        self.n = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return [0.0], {}

    def step(self, action):
        self.n += 1
        return [random.random()], 0.0, False, self.n >= 50, {}


class LockedCounterEnv(gym.Env):
    """Deterministic, but holds a lock, so it cannot be deep-copied: "auto" falls back to verified replay."""

    metadata = {"render_modes": []}

    def __init__(self, render_mode=None):
        self.action_space = spaces.Discrete(3, start=1)
        self.observation_space = spaces.Discrete(100)
        self.lock, self.total = threading.Lock(), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.total = int(self.np_random.integers(10))
        return self.total, {}

    def step(self, action):
        self.total += int(action) + int(self.np_random.integers(2))
        done = self.total >= 30
        return min(self.total, 99), float(done), done, False, {}


TEST_IDS = {"ForkyardTest/Guess-v0": GuessEnv, "ForkyardTest/Noisy-v0": NoisyEnv,
            "ForkyardTest/Locked-v0": LockedCounterEnv}


@pytest.fixture(scope="module", autouse=True)
def test_ids():
    for gym_id, cls in TEST_IDS.items():
        if gym_id not in gym.registry:
            gym.register(id=gym_id, entry_point=cls)
        allow_gym_id(gym_id)
    yield
    for gym_id in TEST_IDS:
        GYM_PROFILES.pop(gym_id, None)


# ------------------------------------------------------------------ registration, checker
@pytest.mark.parametrize("gym_id", SHOWN)
def test_gymnasium_make_and_check_env(gym_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = make(gym_id)
        try:
            check_env(env)
        finally:
            env.close()


def test_gym_kwargs_travel_as_json_text_or_object_and_are_recorded_once():
    a = make("Taxi-v4", gym_kwargs={"is_rainy": True})
    b = make("Taxi-v4", gym_kwargs='{"is_rainy": true}')
    assert a._kwargs == b._kwargs == {"gym_id": "Taxi-v4", "gym_kwargs": {"is_rainy": True}, "max_turns": 200,
                                      "fork_method": "state_codec", "action_names": None}
    assert a._wrapped.rainy_probability == 0.8 and a._wrapped.P != make("Taxi-v4")._wrapped.P
    b.restore(a.snapshot().to_bytes())  # equal kwargs, whichever spelling


def test_fork_method_auto_is_declared_per_wrapped_env():
    assert {g: make(g).fork_method for g in SHOWN} == {
        "FrozenLake-v1": "state_codec", "Taxi-v4": "state_codec", "CliffWalking-v1": "state_codec",
        "Blackjack-v1": "state_codec", "MiniGrid-DoorKey-5x5-v0": "deepcopy"}
    assert make("ForkyardTest/Guess-v0").fork_method == "state_codec"  # its own get_state / set_state
    assert make("ForkyardTest/Locked-v0").fork_method == "replay"  # no codec, no deepcopy
    assert make("ForkyardTest/Noisy-v0").fork_method == "deepcopy"
    assert make("MiniGrid-DoorKey-5x5-v0").observation_source == "state"
    assert make("CliffWalking-v1").observation_source == "ansi"
    assert make("Blackjack-v1").observation_source == "described"


# ------------------------------------------------------------------ the fork contract, per method
#: Actions for the checks where the menu's order would end episodes at once (Blackjack's stick() is first): hit on
#: the warm-up turn, then stick after the fork, so that the dealer draws from the forked RNG.
PLAY = {"Blackjack-v1": ["hit()", "stick()"]}

@pytest.mark.parametrize("gym_id, kwargs", [
    ("FrozenLake-v1", {}),
    ("FrozenLake-v1", {"gym_kwargs": {"map_name": "8x8"}, "max_turns": 30}),
    ("Taxi-v4", {"gym_kwargs": {"is_rainy": True, "fickle_passenger": True}, "max_turns": 25}),
    ("CliffWalking-v1", {"max_turns": 30}),
    ("CliffWalkingSlippery-v1", {"max_turns": 30}),
    ("Blackjack-v1", {}),
    ("ForkyardTest/Guess-v0", {"max_turns": 6}),
])
def test_fork_contract_by_state_codec(gym_id, kwargs):
    env = make(gym_id, **kwargs)
    assert env.fork_method == "state_codec"
    check_fork_contract(env, seed=0, actions=PLAY.get(gym_id))


@pytest.mark.parametrize("gym_id, kwargs", [
    ("MiniGrid-DoorKey-5x5-v0", {"max_turns": 30}),
    ("MiniGrid-LavaGapS5-v0", {"max_turns": 20}),
    ("FrozenLake-v1", {"fork_method": "deepcopy"}),
    ("Blackjack-v1", {"fork_method": "deepcopy"}),
])
def test_fork_contract_by_deepcopy(gym_id, kwargs):
    env = make(gym_id, **kwargs)
    assert env.fork_method == "deepcopy"
    check_fork_contract(env, seed=2, actions=PLAY.get(gym_id))


@pytest.mark.parametrize("gym_id, kwargs", [
    ("Taxi-v4", {"fork_method": "replay", "gym_kwargs": {"is_rainy": True}, "max_turns": 25}),
    ("MiniGrid-Empty-Random-6x6-v0", {"fork_method": "replay", "max_turns": 20}),
    ("ForkyardTest/Locked-v0", {}),
])
def test_fork_contract_by_verified_replay(gym_id, kwargs):
    env = make(gym_id, **kwargs)
    assert env.fork_method == "replay"
    check_fork_contract(env, seed=1)


def test_a_replay_that_diverges_is_refused_naming_the_env():
    env = make("ForkyardTest/Noisy-v0", fork_method="replay", max_turns=20)
    env.reset(seed=0)
    env.step("act(1)")
    with pytest.raises(ReplayDivergedError, match=r"ForkyardTest/Noisy-v0.*step 1 \(act\(1\)\).*not deterministic"):
        env.fork(2)
    data = env.snapshot().to_bytes()
    with pytest.raises(ReplayDivergedError, match="cannot restore GymTextEnv"):
        make("ForkyardTest/Noisy-v0", fork_method="replay", max_turns=20).restore(data)
    # deepcopy forks it in-process, but its snapshot restores by the same verified replay: refused too
    env = make("ForkyardTest/Noisy-v0", max_turns=20)
    env.reset(seed=0)
    env.step("act(0)")
    child = env.fork(1)[0]
    assert child.step("act(1)")[1:4] == (0.0, False, False)
    with pytest.raises(ReplayDivergedError, match="ForkyardTest/Noisy-v0"):
        make("ForkyardTest/Noisy-v0", max_turns=20).restore(env.snapshot().to_bytes())
    with pytest.raises(ValueError, match="has no state codec"):
        make("ForkyardTest/Noisy-v0", fork_method="state_codec")
    with pytest.raises(ValueError, match="cannot be deep-copied"):
        make("ForkyardTest/Locked-v0", fork_method="deepcopy")


def test_a_forged_snapshot_is_refused_and_leaves_the_env_as_it_was():
    env = make("Taxi-v4", fork_method="replay", max_turns=20)
    env.reset(seed=4)
    env.step("north()")
    snap = env.snapshot()
    target = make("Taxi-v4", fork_method="replay", max_turns=20)
    target.reset(seed=9)
    target.step("south()")
    before = target.snapshot().to_bytes()
    forged = snap.model_copy(deep=True)
    forged.state["task"]["trace"][1][1] = 5.0  # a reward the replay will not give
    with pytest.raises(ReplayDivergedError, match=r"Taxi-v4.*step 1 \(north\(\)\)"):
        target.restore(forged)
    forged = snap.model_copy(deep=True)
    forged.state["task"]["actions"] = [99]
    with pytest.raises(ValueError, match="99, which is no action of Taxi-v4"):
        target.restore(forged)
    assert target.snapshot().to_bytes() == before
    target.restore(snap)
    assert target.history == env.history and target.step("east()") == env.step("east()")


RESTORE_ELSEWHERE = """
import sys, json, gymnasium as gym, envs
for line in sys.stdin:
    job = json.loads(line)
    env = gym.make("forkyard/Gym-v0", **job["kwargs"]).unwrapped
    env.restore(job["snapshot"])
    print(json.dumps([list(env.step(a)[:4]) for a in job["actions"]]))
"""


def test_snapshots_are_plain_json_and_restore_in_another_process():
    cases = [("Blackjack-v1", {}, 0), ("Taxi-v4", {"gym_kwargs": {"is_rainy": True}}, 7),
             ("MiniGrid-DoorKey-5x5-v0", {}, 3), ("FrozenLake-v1", {"fork_method": "replay"}, 1)]
    jobs, want = [], []
    for gym_id, kwargs, seed in cases:
        env = make(gym_id, **kwargs)
        env.reset(seed=seed)
        env.step(env.current_info()["legal_actions"][1])
        json.loads(env.snapshot().to_bytes())
        actions = env.current_info()["legal_actions"][:2] * 2
        twin = env.fork(1)[0]
        want.append([list(twin.step(a)[:4]) for a in actions if not twin.done])
        jobs.append(json.dumps({"kwargs": {"gym_id": gym_id, **kwargs}, "snapshot": env.snapshot().to_bytes().decode(),
                                "actions": actions[:len(want[-1])]}))
    out = subprocess.run([sys.executable, "-c", RESTORE_ELSEWHERE], input="\n".join(jobs), capture_output=True,
                         text=True, cwd=ROOT, check=True, timeout=120)
    assert [json.loads(line) for line in out.stdout.splitlines()] == want


def test_pickle_and_deepcopy_continue_the_episode():
    import copy
    for gym_id in ("Taxi-v4", "MiniGrid-Empty-5x5-v0"):
        env = make(gym_id)
        env.reset(seed=3)
        env.step(env.current_info()["legal_actions"][0])
        for other in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env)):
            assert other.history == env.history
            assert other.fork(1)[0].step(env.current_info()["legal_actions"][2]) == \
                env.fork(1)[0].step(env.current_info()["legal_actions"][2])


def test_seeded_resets_are_deterministic_and_seeds_differ():
    env = make("Taxi-v4")
    first = {s: env.reset(seed=s)[0] for s in range(8)}
    assert len(set(first.values())) > 3
    assert all(make("Taxi-v4").reset(seed=s)[0] == first[s] for s in range(8))
    env.reset(seed=2)
    rng = random.Random(0)
    a = [env.step(env.demo_action(rng, 0.0))[0] for _ in range(10)]
    env.reset(seed=2)
    rng = random.Random(0)
    assert [env.step(env.demo_action(rng, 0.0))[0] for _ in range(10)] == a


# ------------------------------------------------------------------ security: ids and kwargs
@pytest.mark.parametrize("gym_id, says", [
    ("json.tool:Anything", "no module: part"),
    ("gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv", "no module: part"),
    ("CartPole-v1", "not allowed"),
    ("forkyard/Gym-v0", "not allowed"),
    ("forkyard/ClueProbe-v0", "not allowed"),
    ("NoSuchEnv-v9", "not allowed"),
    ("", "Gymnasium id"),
    (7, "Gymnasium id"),
    ("x" * 101, "Gymnasium id"),
])
def test_ids_outside_the_allow_list_are_refused_without_imports(gym_id, says):
    before = set(sys.modules)
    with pytest.raises(ValueError, match=says):
        GymTextEnv(gym_id=gym_id)
    assert "json.tool" not in set(sys.modules) - before


@pytest.mark.parametrize("kwargs, says", [
    ({"gym_id": "Taxi-v4", "gym_kwargs": {"render_mode": "human"}}, r"no gym_kwargs \['render_mode'\]"),
    ({"gym_id": "Taxi-v4", "gym_kwargs": {"desc": ["SG"]}}, "no gym_kwargs"),
    ({"gym_id": "FrozenLake-v1", "gym_kwargs": {"is_slippery": "yes"}}, "true or false"),
    ({"gym_id": "FrozenLake-v1", "gym_kwargs": {"desc": ["SX", "FG"]}}, "letters S F H G"),
    ({"gym_id": "FrozenLake-v1", "gym_kwargs": {"desc": ["S" + "F" * 20, "G" * 21]}}, "letters S F H G"),
    ({"gym_id": "FrozenLake-v1", "gym_kwargs": {"success_rate": 2}}, r"in \[0.0, 1.0\]"),
    ({"gym_id": "FrozenLake-v1", "gym_kwargs": {"map_name": "99x99"}}, "one of"),
    ({"gym_id": "FrozenLake-v1", "gym_kwargs": "{not json"}, "not valid JSON"),
    ({"gym_id": "FrozenLake-v1", "gym_kwargs": "[1]"}, "JSON object"),
    ({"gym_id": "FrozenLake-v1", "gym_kwargs": " " * 5000}, "limit is 4096"),
    ({"gym_id": "MiniGrid-Empty-5x5-v0", "gym_kwargs": {"max_steps": 10**6}}, r"1\.\.1000"),
    ({"gym_id": "FrozenLake-v1", "max_turns": 0}, "max_turns"),
    ({"gym_id": "FrozenLake-v1", "max_turns": 5000}, "max_turns"),
    ({"gym_id": "FrozenLake-v1", "fork_method": "sandbox"}, "fork_method"),
    ({"gym_id": "MiniGrid-Empty-5x5-v0", "fork_method": "state_codec"}, "no state codec"),
    ({"gym_id": "FrozenLake-v1", "action_names": ["a", "b", "c"]}, "needs 4 names"),
    ({"gym_id": "FrozenLake-v1", "action_names": ["a", "b", "c", "c"]}, "distinct"),
    ({"gym_id": "FrozenLake-v1", "action_names": ["a", "b", "c", "import"]}, "import"),
    ({"gym_id": "FrozenLake-v1", "action_names": ["a", "b", "c", "reset"]}, "reset"),
    ({"gym_id": "FrozenLake-v1", "action_names": ["a", "b", "c", "d(1)"]}, "d\\(1\\)"),
    ({"gym_id": "FrozenLake-v1", "action_names": "abcd"}, "list of strings"),
    ({"gym_id": "ForkyardTest/Guess-v0", "action_names": ["x"]}, "Discrete actions only"),
])
def test_bad_kwargs_raise_clear_value_errors(kwargs, says):
    with pytest.raises(ValueError, match=says):
        GymTextEnv(**kwargs)


def test_action_names_and_generic_act_tools():
    env = make("Blackjack-v1", action_names=["stay", "card"])
    assert [t["function"]["name"] for t in env.tool_schemas()] == ["stay", "card"]
    env.reset(seed=0)
    assert env.current_info()["legal_actions"] == ["stay()", "card()"]
    assert env.step("stay()")[2]
    env = make("ForkyardTest/Locked-v0")  # Discrete(3, start=1) without names: act(a)
    (tool,) = env.tool_schemas()
    assert tool["function"]["parameters"]["properties"]["a"] == {
        "type": "integer", "minimum": 1, "maximum": 3, "description": "the action"}
    obs, _ = env.reset(seed=0)
    assert env.action_vocabulary == ["act(1)", "act(2)", "act(3)"] and "act(1), act(2), act(3)" in obs
    assert not env.step("act(a=2)")[4]["invalid_action"]  # keyword form
    for bad, says in [("act(0)", "int a in 1..3"), ("act('2')", "int a in 1..3"), ("left()", "one tool, act(a)"),
                      ("act(b=1)", "no argument 'b'")]:
        obs, r, te, tr, info = env.step(bad)
        assert info["invalid_action"] and says in obs and r == 0.0


def test_text_actions_take_act_text_with_a_curated_menu():
    env = make("ForkyardTest/Guess-v0", max_turns=8)
    (tool,) = env.tool_schemas()
    assert tool["function"]["parameters"]["properties"]["text"]["maxLength"] == 3
    _, info = env.reset(seed=1)
    menu = info["legal_actions"]
    assert 1 <= len(menu) <= 4 and all(a.startswith("act('") for a in menu)
    with pytest.raises(AttributeError):
        _ = env.action_vocabulary
    word = env._wrapped.word
    obs, r, te, tr, info = env.step("act(text='zzz')")
    assert info["invalid_action"] and "3..3 characters" in obs
    obs, r, te, tr, info = env.step(f"act(text={word!r})")
    assert (r, te, info["termination_reason"], info["episode_metrics"]["success"]) == (1.0, True, "answered", 1.0)


@pytest.mark.parametrize("gym_id", ["Taxi-v4", "MiniGrid-Empty-5x5-v0"])
def test_named_tools_are_schemas_and_illegal_calls_explain(gym_id):
    env = make(gym_id)
    tools = env.tool_schemas()
    names = [t["function"]["name"] for t in tools]
    assert names == list(GYM_PROFILES[gym_id].action_names)
    assert all(t["function"]["parameters"]["properties"] == {} and t["function"]["description"] for t in tools)
    env.reset(seed=0)
    for bad, says in [(f"{names[0]}(1)", "takes no arguments"), ("fly()", "is not an action of"),
                      ("up(", "could not parse")]:
        obs, r, te, tr, info = env.step(bad)
        assert info["invalid_action"] and says in obs and (r, te, tr) == (0.0, False, False)
        assert "Turn" in obs and names[0] in obs  # the menu is repeated
    assert env.turn == 3


def test_the_server_serves_any_allowed_id_with_json_gym_kwargs_and_refuses_others():
    import httpx

    from sandbox_server.app import create_env_app
    from tests.docker_support import UvicornThread

    srv = UvicornThread(create_env_app(ttl_s=60)).start()
    try:
        kwargs = {"gym_id": "Taxi-v4", "gym_kwargs": {"is_rainy": True}, "max_turns": 5}
        made = httpx.post(f"{srv.url}/v1/envs", json={"env_id": "forkyard/Gym-v0", "kwargs": kwargs, "seed": 7})
        assert made.status_code == 201, made.text
        sid = made.json()["session_id"]
        local = make(**kwargs)
        assert made.json()["observation"] == local.reset(seed=7)[0]
        step = httpx.post(f"{srv.url}/v1/envs/{sid}/step", json={"action": "north()"}).json()
        assert step["observation"] == local.step("north()")[0]
        fork = httpx.post(f"{srv.url}/v1/envs/{sid}/fork", json={"n": 2})
        assert fork.status_code in (200, 201), fork.text
        for bad in ({"gym_id": "gymnasium.envs.toy_text.taxi:TaxiEnv"}, {"gym_id": "CartPole-v1"},
                    {"gym_id": "Taxi-v4", "gym_kwargs": {"render_mode": "human"}}, {"gym_id": "Taxi-v4", "x": 1}):
            refused = httpx.post(f"{srv.url}/v1/envs", json={"env_id": "forkyard/Gym-v0", "kwargs": bad})
            assert refused.status_code in (400, 422), (bad, refused.status_code, refused.text)
    finally:
        srv.stop()


def test_trl_factory_makes_one_method_per_action():
    from envs.trl import environment_factory
    cls = environment_factory("forkyard/Gym-v0", gym_id="Taxi-v4", max_turns=3)
    tool_env = cls()
    assert "Taxi at row" in tool_env.reset(seed=1)
    assert "reward -1" in tool_env.north()
    assert callable(cls.dropoff) and tool_env.get_reward() == -1.0


# ------------------------------------------------------------------ terminated / truncated
def test_terminated_and_truncated_stay_apart():
    env = make("FrozenLake-v1", gym_kwargs={"is_slippery": False})
    env.reset(seed=0)
    env.step("right()")
    obs, r, te, tr, info = env.step("down()")  # into the hole at row 1, column 1
    assert (r, te, tr, info["termination_reason"]) == (0.0, True, False, "answered")
    assert "X" in obs and info["episode_metrics"] == {"success": 0.0, "return": 0.0}
    env = make("MiniGrid-Empty-5x5-v0", gym_kwargs={"max_steps": 3})  # the wrapped env's own step limit
    env.reset(seed=0)
    for _ in range(3):
        obs, r, te, tr, info = env.step("turn_left()")
    assert (te, tr, info["termination_reason"], env.turn) == (False, True, "max_turns", 3)
    assert "own step limit" in obs
    env = make("CliffWalking-v1", max_turns=2)  # forkyard's turn budget
    env.reset(seed=0)
    env.step("up()")
    obs, r, te, tr, info = env.step("right()")
    assert (te, tr, info["termination_reason"]) == (False, True, "max_turns")


# ------------------------------------------------------------------ demonstrator vs random
def success_rate(env: GymTextEnv, skill: float, seeds: range) -> float:
    rng = random.Random(12345)
    wins = 0.0
    for s in seeds:
        env.reset(seed=s)
        info = {}
        while not env.done:
            info = env.step(env.demo_action(rng, skill))[4]
        wins += info["episode_metrics"]["success"]
    return wins / len(seeds)


# (gym_id, kwargs, seeds, scripted range, random range); measured over 200 seeds: FrozenLake 0.755 / 0.02,
# FrozenLake8x8 0.90 / 0.0, Taxi 1.0 / 0.05, CliffWalking 1.0 / 0.02, Blackjack 0.445 / 0.32, MiniGrid Empty-5x5
# 1.0 / 0.46, DoorKey-5x5 1.0 / 0.135, LavaGapS5 1.0 / 0.04.
RATES = [
    ("FrozenLake-v1", {}, range(60), (0.55, 0.95), (0.0, 0.12)),
    ("FrozenLake-v1", {"gym_kwargs": {"is_slippery": False}}, range(10), (1.0, 1.0), (0.0, 0.3)),
    ("Taxi-v4", {}, range(30), (1.0, 1.0), (0.0, 0.2)),
    ("CliffWalking-v1", {}, range(20), (1.0, 1.0), (0.0, 0.15)),
    ("Blackjack-v1", {}, range(1500), (0.40, 0.49), (0.27, 0.37)),
    ("MiniGrid-Empty-5x5-v0", {}, range(20), (1.0, 1.0), (0.2, 0.75)),
    ("MiniGrid-DoorKey-5x5-v0", {"max_turns": 100}, range(20), (1.0, 1.0), (0.0, 0.3)),
    ("MiniGrid-LavaGapS5-v0", {}, range(20), (1.0, 1.0), (0.0, 0.25)),
]


@pytest.mark.parametrize("gym_id, kwargs, seeds, scripted, rand", RATES,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(RATES)])
def test_demonstrator_beats_random_play(gym_id, kwargs, seeds, scripted, rand):
    env = make(gym_id, **kwargs)
    best, random_play = success_rate(env, 1.0, seeds), success_rate(env, 0.0, seeds)
    assert scripted[0] <= best <= scripted[1], f"{gym_id}: scripted success {best}"
    assert rand[0] <= random_play <= rand[1], f"{gym_id}: random success {random_play}"
    assert best > random_play


def test_scripted_play_is_shortest_where_moves_are_certain():
    env = make("CliffWalking-v1")
    env.reset(seed=0)
    rng = random.Random(0)
    while not env.done:
        info = env.step(env.demo_action(rng, 1.0))[4]
    assert env.turn == 13 and info["episode_metrics"] == {"success": 1.0, "return": -13.0}
    with pytest.raises(ValueError, match="skill"):
        env.demo_action(rng, 1.5)
