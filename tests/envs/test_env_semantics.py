"""Env semantics found by trying forkyard (field cases S13, S24, S28): seeded resets that must not inherit
the past, Gymnasium vector envs over real text, and tree rollouts that survive a failed fork."""

import copy
import json
import random

import gymnasium as gym
import httpx
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs import EnvInfraError, RemoteEnv, TextSpace
from envs.clueprobe import ClueProbeEnv
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread
from trainer.waves import tree_rollout
from trainer.tabular import TabularPolicy
from trainer.estimators import step_advantages
from trainer.tabular_config import TrainConfig
from trainer.train import train

# ClueProbe(max_turns=3, bits=8): the case's numbers. A fresh env reset with seed 5 hides 171; a child forked
# after its parent's reset(seed=0) used to draw 163 (the parent's next unseeded draw) instead.
KW = {"max_turns": 3, "bits": 8}
ACTIONS = ["probe(0)", "probe(7)", "answer(0)"]  # the answer's observation names the target when wrong


def target(env) -> int:
    return env.snapshot().state["task"]["target"]


def trajectory(env, seed, actions=ACTIONS, options=None):
    """Everything the agent sees from ``reset(seed)`` then ``actions``: observations, infos, rewards, flags."""
    out = [env.reset(seed=seed, options=options)]
    for action in actions:
        out.append(env.step(action))
        if out[-1][2] or out[-1][3]:
            break
    return out


def fresh_trajectory(seed, actions=ACTIONS):
    return trajectory(ClueProbeEnv(**KW), seed, actions)


# ---------------------------------------------------------------------------------------------- S13
def test_s13_forked_child_seeded_reset_is_a_fresh_reset():
    fresh = ClueProbeEnv(**KW)
    fresh.reset(seed=5)
    assert target(fresh) == 171
    p = ClueProbeEnv(**KW)
    p.reset(seed=0)
    c = p.fork(1)[0]
    c.reset(seed=5)
    assert target(c) == 171
    assert "the target was 171" in trajectory(c, 5)[-1][0]


@pytest.mark.parametrize("seed", [0, 5, 17, 2**31 - 1])
def test_s13_seeded_reset_ignores_every_kind_of_past(seed):
    want = fresh_trajectory(seed)
    p = ClueProbeEnv(**KW)
    p.reset(seed=seed + 1)
    p.step("probe(3)")
    child, grandchild_parent = p.fork(2)
    grandchild = grandchild_parent.fork(1)[0]  # a fork of a fork whose RNG was never used
    restored_same = ClueProbeEnv(**KW)
    restored_same.reset(seed=99)
    restored_same.restore(p.snapshot())
    restored_new = ClueProbeEnv(**KW)
    restored_new.restore(p.snapshot().to_bytes())
    after_options = ClueProbeEnv(**KW)
    after_options.reset(seed=3, options={"target": 200})
    after_unseeded = p.fork(1)[0]
    after_unseeded.reset()
    after_unseeded.step("probe(1)")
    for env in (p, child, grandchild, restored_same, restored_new, after_options, after_unseeded):
        assert trajectory(env, seed) == want
        assert trajectory(env, seed) == want  # and again, after that episode


def test_s13_s40_unseeded_reset_parent_continues_its_stream_a_child_draws_its_own():
    p = ClueProbeEnv(**KW)
    p.reset(seed=0)
    c = p.fork(1)[0]
    assert target(c) == target(p)  # the forked episode is shared
    c.reset()
    p.reset()
    assert target(p) == 163  # the parent's own next draw, as if it had never forked
    assert target(c) != 163  # field case S40: the copy draws another later episode


def test_np_random_set_by_hand_survives_a_seed_query():
    env = ClueProbeEnv(**KW)
    env.np_random = np.random.default_rng(7)
    assert env.np_random_seed == -1  # Gymnasium's "unknown seed", not a reason to draw a new Generator
    env.reset()
    assert target(env) == int(np.random.default_rng(7).integers(256))


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reset"), st.one_of(st.none(), st.integers(0, 2**31 - 1))),
        st.tuples(st.just("step"), st.sampled_from(["probe(0)", "probe(5)", "answer(9)", "nonsense é"])),
        st.tuples(st.just("fork"), st.integers(1, 3)),
        st.tuples(st.just("restore"), st.booleans()),
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(_OPS, st.integers(0, 2**31 - 1))
def test_s13_property_any_history_then_seeded_reset_equals_fresh(ops, seed):
    env = ClueProbeEnv(**KW)
    env.reset(seed=1)
    for op, arg in ops:
        if op == "reset":
            env.reset(seed=arg)
        elif op == "step" and not env.done:
            env.step(arg)
        elif op == "fork":
            env = env.fork(arg)[-1]
        elif op == "restore":
            other = ClueProbeEnv(**KW)
            if arg:
                other.reset(seed=seed ^ 1)
            other.restore(env.snapshot())
            env = other
    assert trajectory(env, seed) == fresh_trajectory(seed)


@pytest.fixture(scope="module")
def server():
    srv = UvicornThread(create_env_app(ttl_s=600)).start()
    yield srv
    srv.stop()


def test_s13_over_http_a_forked_session_reset_matches_a_fresh_session(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        def play(sid, seed):
            r = http.post(f"/v1/envs/{sid}/reset", json={"seed": seed})
            assert r.status_code == 200, r.text
            out = [(r.json()["observation"], r.json()["info"])]
            for action in ACTIONS:
                s = http.post(f"/v1/envs/{sid}/step", json={"action": action}).json()
                out.append((s["observation"], s["reward"], s["terminated"], s["truncated"], s["info"]))
            return out

        body = {"env_id": "forkyard/ClueProbe-v0", "kwargs": KW}
        parent = http.post("/v1/envs", json={**body, "seed": 0}).json()["session_id"]
        http.post(f"/v1/envs/{parent}/step", json={"action": "probe(2)"})
        child = http.post(f"/v1/envs/{parent}/fork", json={"n": 2}).json()["session_ids"][1]
        fresh = http.post("/v1/envs", json={**body, "seed": 123}).json()["session_id"]
        got, want = play(child, 5), play(fresh, 5)
        assert got == want
        assert "the target was 171" in got[-1][0]
        local = fresh_trajectory(5)
        assert [o[0] for o in got] == [o[0] for o in local]
        for sid in (parent, child, fresh):
            http.delete(f"/v1/envs/{sid}")


def test_s13_remote_env_fork_then_seeded_reset_matches_a_fresh_local_env(server):
    env = gym.make("forkyard/ClueProbe-v0", server_url=server.url, **KW).unwrapped
    assert isinstance(env, RemoteEnv)
    env.reset(seed=0)
    env.step("probe(1)")
    child = env.fork(1)[0]
    try:
        got = trajectory(child, 5)
        want = fresh_trajectory(5)
        assert [o[0] for o in got] == [o[0] for o in want]
        assert [o[1:4] for o in got[1:]] == [o[1:4] for o in want[1:]]
        assert got[0][1]["anchor_key"] == want[0][1]["anchor_key"]
    finally:
        child.close()
        env.close()


# ---------------------------------------------------------------------------------------------- S24
# Per step, the actions of the two sub-envs. The second env's first action is refused with an observation
# that quotes it (spaces, newline, non-ASCII, an astral code point); step 3 ends both episodes, step 4 is
# the NEXT_STEP autoreset (actions ignored), step 5 probes the new hidden targets.
VEC_ACTIONS = [
    ["probe(0)", "probe('café 中文 🚀')"],
    ["probe(1)", "probe(2)"],
    ["answer(3)", "answer(5)"],
    ["probe(0)", "probe(0)"],
    ["probe(2)", "probe(1)"],
]


def single_env_reference(seeds):
    """What each sub-env of a NEXT_STEP vector env must return, from plain single envs."""
    per_env = []
    for i, seed in enumerate(seeds):
        env = ClueProbeEnv(max_turns=3)
        out = [(env.reset(seed=seed)[0], 0.0, False, False)]
        for actions in VEC_ACTIONS:
            if env.done:  # NEXT_STEP autoreset: the RNG stream continues (no seed)
                out.append((env.reset()[0], 0.0, False, False))
            else:
                obs, r, te, tr, _ = env.step(actions[i])
                out.append((obs, r, te, tr))
        per_env.append(out)
    return per_env


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_s24_vector_envs_with_default_arguments_carry_real_text(mode):
    seeds = [11, 12]
    want = single_env_reference(seeds)
    assert any("🚀" in o[0] and "é" in o[0] and "中文" in o[0] for o in want[1])
    assert any(o[0].startswith("ClueProbe") for o in want[0][4:5])  # the autoreset observation
    vec = gym.make_vec("forkyard/ClueProbe-v0", num_envs=2, vectorization_mode=mode, max_turns=3)
    try:
        assert vec.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
        obs, _ = vec.reset(seed=seeds)
        got = [[(obs[i], 0.0, False, False)] for i in range(2)]
        assert isinstance(obs, tuple) and vec.observation_space.contains(obs)
        for actions in VEC_ACTIONS:
            obs, rew, te, tr, _ = vec.step(tuple(actions))
            assert isinstance(obs, tuple) and vec.observation_space.contains(obs)
            for i in range(2):
                got[i].append((obs[i], float(rew[i]), bool(te[i]), bool(tr[i])))
        assert got == want
    finally:
        vec.close()


def test_s24_every_text_env_declares_its_autoreset_mode():
    assert envs.TextEnv.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert gym.make("forkyard/ClueProbe-v0").unwrapped.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert RemoteEnv.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=64), min_size=1, max_size=4))
def test_s24_text_shared_memory_round_trips_any_text(texts):
    space = TextSpace(64)
    shm = create_shared_memory(space, n=len(texts))
    view = read_from_shared_memory(space, shm, n=len(texts))
    for i, text in enumerate(texts):
        write_to_shared_memory(space, i, text, shm)
    assert tuple(view) == tuple(texts)
    assert copy.deepcopy(view) == tuple(texts) and type(copy.deepcopy(view)) is tuple
    write_to_shared_memory(space, 0, "", shm)  # a shorter value replaces a longer one entirely
    assert view[0] == ""
    with pytest.raises(ValueError, match="does not fit"):
        write_to_shared_memory(space, 0, "x" * 65, shm)


# ---------------------------------------------------------------------------------------------- S28
class ForkFailClueProbe(ClueProbeEnv):
    """ClueProbe whose fork fails like a full sandbox pool: every ``fork(n)`` with ``n`` in ``fail_n`` made
    during an episode reset with ``bad_seed`` raises EnvInfraError. ``fork_log`` (shared with all forks)
    records ``(seed, n, failed)`` for every fork call."""

    def __init__(self, bad_seed=1, fail_n=(1,), **kwargs):
        super().__init__(**kwargs)
        self.bad_seed, self.fail_n = bad_seed, set(fail_n)
        self.fork_log = []
        self.current = None

    def reset(self, *, seed=None, options=None):
        self.current = seed
        return super().reset(seed=seed, options=options)

    def _fork_into(self, children):
        failed = self.current == self.bad_seed and len(children) in self.fail_n
        self.fork_log.append((self.current, len(children), failed))
        if failed:
            raise EnvInfraError("all 3 sandboxes are in use")
        super()._fork_into(children)


def check_counts(ro, env):
    assert ro.forks == len(env.fork_log)
    assert ro.forks_failed == sum(f for *_, f in env.fork_log) >= 1
    assert ro.env_calls == sum(len(e.steps) for e in ro.episodes)
    lost = [e for e in ro.episodes if e.infra_failure]
    assert ro.branches_lost == len(lost)
    for e in lost:
        assert e.reason == "infra_error" and e.steps == [] and e.branch >= 1 and e.seed == 1


@pytest.mark.parametrize("selection", ["uniform", "entropy"])
def test_s28_a_failed_checkpoint_fork_loses_only_its_branches(selection):
    env = ForkFailClueProbe(bad_seed=1, fail_n=(1,), max_turns=3)
    ro = tree_rollout(env, TabularPolicy(device="cpu"), 3, 4, seeds=[0, 1, 2], rng=random.Random(0),
                      fork_selection=selection)
    assert len(ro.episodes) == 12
    check_counts(ro, env)
    assert ro.branches_lost == 3
    for e in ro.episodes:
        if e.seed != 1:
            assert not e.infra_failure and e.reason == "answered" and e.steps
    base1 = next(e for e in ro.episodes if e.seed == 1 and e.branch == 0)
    assert not base1.infra_failure and base1.reason == "answered" and len(base1.steps) == 3
    assert base1.fork_turn is None  # nothing branched from it
    assert [e.branch for e in ro.episodes if e.seed == 1] == [0, 1, 2, 3]
    # The bases and the other forks train: every valid step gets an advantage, no lost episode counts.
    assigned = step_advantages(ro, TrainConfig(estimator="tree"))
    assert assigned.n_episodes == 9
    assert len(assigned.steps) == ro.env_calls
    prefix = [a for s, a in zip(assigned.steps, assigned.advantages, strict=True) if any(s is t for t in base1.steps)]
    assert len(prefix) == 3 and len(set(prefix)) == 1  # the whole base trains as a prefix


def test_s28_a_failed_spread_fork_keeps_branch_one():
    env = ForkFailClueProbe(bad_seed=1, fail_n=(2,), max_turns=3)
    ro = tree_rollout(env, TabularPolicy(device="cpu"), 3, 4, seeds=[0, 1, 2], rng=random.Random(3))
    check_counts(ro, env)
    assert ro.forks_failed == 1 and ro.branches_lost == 2
    group = [e for e in ro.episodes if e.seed == 1]
    assert [e.infra_failure for e in group] == [False, False, True, True]
    base1, branch1 = group[0], group[1]
    assert base1.fork_turn is not None and branch1.fork_turn == base1.fork_turn
    assert branch1.steps and branch1.steps[0].turn == base1.fork_turn and branch1.reason == "answered"
    assert step_advantages(ro, TrainConfig(estimator="tree")).n_episodes == 10


def test_s28_training_runs_through_fork_failures_and_writes_the_count(tmp_path):
    env_id = "forkyard-test/ForkFailClueProbe-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=ForkFailClueProbe)
    cfg = TrainConfig(env_id=env_id, env_kwargs={"max_turns": 3, "bad_seed": 1, "fail_n": [1]}, estimator="tree",
                      n_base=3, branches=4, iterations=1, eval_episodes=4, run_dir=str(tmp_path), device="cpu")
    result = train(cfg)  # training seeds of iteration 0: 0, 1, 2
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    m = json.loads(line)
    assert m == result.metrics[0]
    assert m["episodes"] == 12 and m["infra_failures"] == 3 and m["branches_lost"] == 3
    assert 1 <= m["forks_failed"] <= 3 and m["forks"] >= m["forks_failed"] + 2 * 2
    assert m["trained_steps"] == m["env_calls"] > 0
    # a ClueProbe subclass inherits ClueProbe's EvaluationResets: every one of the 2**3 targets, once
    assert result.evaluation["episodes"] == 8


# ---------------------------------------------------------------------------------------------- S40
# Field case S40: one ClueProbe env reset with seed 11 and forked 4 times; every later autoreset gave all
# four copies the same target ([32]*4, then [204]*4). The forked episode stays shared; later ones must not.
S40_ACTIONS = ["probe(0)", "probe(7)", "answer(0)"]  # with KW (max_turns=3): the answer names the target if wrong


def answered_target(observation: str) -> int:
    """The target an ``answer(0)`` observation reveals: the number it names when wrong, else 0."""
    return int(observation.split("the target was ")[1].split(".")[0]) if "the target was" in observation else 0


def episode_targets(step, n: int, episodes: int) -> list[tuple[int, ...]]:
    """Drive a NEXT_STEP vector env (``step(actions) -> (obs, ...)``) of ``n`` sub-envs, all at turn 0, through
    ``episodes`` episodes (each ``S40_ACTIONS`` and one autoreset step); the targets, one tuple per episode."""
    out = []
    for _ in range(episodes):
        for action in S40_ACTIONS:
            obs = step([action] * n)[0]
        out.append(tuple(answered_target(o) for o in obs))
        step(["probe(0)"] * n)  # the autoreset step: actions ignored, new episodes start
    return out


def assert_s40(targets: list[tuple[int, ...]], n: int) -> None:
    assert len(set(targets[0])) == 1  # the forked episode is shared, by design
    per_copy = [tuple(t[i] for t in targets[1:]) for i in range(n)]
    assert len(set(per_copy)) == n, f"copies drew the same later episodes: {targets}"
    assert all(len(set(t)) > 1 for t in targets[1:]), f"an autoreset gave every copy the same target: {targets}"


def test_s40_the_case_gymnasium_vector_env_over_forked_envs():
    p = ClueProbeEnv(**KW)
    p.reset(seed=11)
    kids = p.fork(4)
    vec = gym.vector.SyncVectorEnv([lambda k=k: k for k in kids])
    try:
        targets = episode_targets(vec.step, 4, episodes=4)
    finally:
        vec.close()
    assert_s40(targets, 4)
    again = ClueProbeEnv(**KW)  # the same fork history draws the same episodes (per copy, in any process)
    again.reset(seed=11)
    vec = gym.vector.SyncVectorEnv([lambda k=k: k for k in again.fork(4)])
    try:
        assert episode_targets(vec.step, 4, episodes=4) == targets
    finally:
        vec.close()


def test_s40_async_vector_env_over_forked_envs_with_spawn():
    p = ClueProbeEnv(**KW)
    p.reset(seed=11)
    vec = gym.vector.AsyncVectorEnv([lambda k=k: k for k in p.fork(3)], context="spawn")
    try:
        assert_s40(episode_targets(vec.step, 3, episodes=3), 3)
    finally:
        vec.close()


def test_s40_through_remote_vector_env_against_a_real_server(server):
    vec = envs.RemoteVectorEnv("forkyard/ClueProbe-v0", server.url, 1, **KW)
    try:
        vec.reset(seed=11)
        forked = vec.fork(4)
        try:
            targets = episode_targets(forked.step, 4, episodes=4)
            assert_s40(targets, 4)
            local = ClueProbeEnv(**KW)  # the server forks as TextEnv.fork does: the same draws
            local.reset(seed=11)
            sync = gym.vector.SyncVectorEnv([lambda k=k: k for k in local.fork(4)])
            assert episode_targets(sync.step, 4, episodes=4) == targets
        finally:
            forked.close()
    finally:
        vec.close()


def test_s40_a_seeded_reset_still_gives_every_copy_the_seed_s_episode():
    p = ClueProbeEnv(**KW)
    p.reset(seed=11)
    kids = p.fork(3)
    assert {target(k) for k in kids} == {target(p)}
    for k in kids:
        k.reset(seed=5)
    assert {target(k) for k in kids} == {171}  # what a fresh env draws for seed 5 (S13)
    for k in kids:
        k.reset()
    assert len({target(k) for k in kids}) == 1  # all three continue seed 5's stream, as fresh envs would


_TREE = st.lists(st.tuples(st.integers(0, 50), st.integers(1, 3), st.booleans()), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(_TREE, st.integers(0, 2**31 - 1))
def test_s40_property_no_two_envs_of_a_fork_tree_share_later_episodes(tree, seed):
    """Any fork tree (fork any env so far, n copies, optionally after an unseeded reset of it): every env's
    next two unseeded episodes (16-bit targets) differ from every other env's."""
    root = ClueProbeEnv(max_turns=3, bits=16)
    root.reset(seed=seed)
    envs_ = [root]
    for pick, n, reset_first in tree:
        src = envs_[pick % len(envs_)]
        if reset_first:
            src.reset()
        envs_.extend(src.fork(n))
    later = []
    for e in envs_:
        e.reset()
        first = target(e)
        e.reset()
        later.append((first, target(e)))
    assert len(set(later)) == len(later)


def test_s40_copies_forked_across_nodes_draw_what_local_copies_would():
    """A cross-node fork (``NodeHost.adopt``: the snapshot restored on another node and forked there) gives the
    copies the fork keys a local fork would have, and the source counts them: later local forks draw other
    episodes, never a remote copy's."""
    from ray_cluster.nodes import NodeHost

    kw = {"max_turns": 3}
    source, twin = (gym.make("forkyard/ClueProbe-v0", **kw).unwrapped for _ in range(2))
    for env in (source, twin):
        env.reset(seed=11)
        env.step("probe(0)")
    host = NodeHost("n1", capacity=8)  # labels this process's new sandboxes <server>-n1 until its shutdown
    try:
        sids = host.adopt("forkyard/ClueProbe-v0", kw, source.snapshot().to_bytes(), 2)
        source.count_forks(2)
        remote = [host.sessions[s] for s in sids]
        local_twins = twin.fork(2)  # what a local fork(2) of the source would have made
        later_local = source.fork(2)
        drawn = {}
        for name, envs_ in (("remote", remote), ("twins", local_twins), ("later", later_local)):
            drawn[name] = []
            for e in envs_:
                targets = []
                for _ in range(6):  # unseeded resets: each copy's own stream
                    e.reset()
                    targets.append(e._target)
                drawn[name].append(tuple(targets))
    finally:
        host.shutdown()  # gives the process its own settings back (the leak check's label)
    assert drawn["remote"] == drawn["twins"]  # the same keys as a local fork(2) would have taken
    assert len(set(drawn["remote"] + drawn["later"])) == 4  # no later local copy repeats a remote one
