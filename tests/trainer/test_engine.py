"""The batched rollout engine (trainer/text/engine.py): the same seeds give the same episodes as the serial loops of
trainer/rollout.py, token for token, for group and tree rollouts, on forkyard's transformer and a Hugging Face
Llama; behavior log-probs equal the trainer's recompute.

Tolerance: sampled ids, actions, rewards, masks, anchor keys and env-call counts are compared exactly;
behavior log-probs with atol 1e-5 (padding and batching change the order of float32 sums, about 1e-6 here).
Models are small and random, their end-of-turn logit raised (as in tests/trainer/test_text_policy.py) so actions end
both by ``<|end|>`` and at the token limit; a small context makes windows move (left truncation).
"""

import random
import threading

import pytest
import torch

from envs.clueprobe import ClueProbeEnv
from trainer.text.engine import RolloutEngine
from trainer.waves import Row, blocking
from trainer.text.lm import ByteTokenizer, LMConfig, build_model
from trainer.loop import make_env
from trainer.rollout import Rollout, episode_seeds, stream
from trainer.waves import group_rollout, tree_rollout
from trainer.text.text_policy import SamplingConfig, TextPolicy, token_logprobs

TOK = ByteTokenizer()


def tiny(context=160, seed=0):
    model = build_model(LMConfig(d_model=32, n_layers=2, n_heads=2, context=context), device="cpu", seed=seed)
    with torch.no_grad():
        e = model.tok.weight[TOK.eot_id]
        model.ln_f.bias += 3.0 * e / e.pow(2).sum()
    return model.eval()


def llama(context=160):
    from trainer.text.hf import build_llama

    return build_llama(LMConfig(d_model=32, n_layers=2, n_heads=2, context=context), TOK, "cpu")


def same(serial, batched) -> None:
    """The two rollouts hold the same episodes (module docstring's tolerance)."""
    assert (serial.kind, serial.env_calls, serial.forks, serial.forks_failed, serial.branches_lost) == (
        batched.kind, batched.env_calls, batched.forks, batched.forks_failed, batched.branches_lost)
    assert len(serial.episodes) == len(batched.episodes)
    for a, b in zip(serial.episodes, batched.episodes, strict=True):
        assert (a.seed, a.base, a.branch, a.fork_turn, a.reward, a.reason, a.infra_failure, a.env_metrics) == (
            b.seed, b.base, b.branch, b.fork_turn, b.reward, b.reason, b.infra_failure, b.env_metrics)
        for s, t in zip(a.steps, b.steps, strict=True):
            assert (s.turn, s.anchor_key, s.action) == (t.turn, t.anchor_key, t.action)
            x, y = s.data, t.data
            assert (x.context, x.action_ids, x.window_start, x.stop, x.legal) == (
                y.context, y.action_ids, y.window_start, y.stop, y.legal)
            assert x.logps == pytest.approx(y.logps, abs=1e-5)
            assert x.entropies == pytest.approx(y.entropies, abs=1e-4)


@pytest.fixture(scope="module")
def env():
    e = make_env("forkyard/ClueProbe-v0", {"turns": 3})
    yield e
    e.close()


@pytest.mark.parametrize("sampling", [{}, {"top_p": 0.8}, {"temperature": 0.0},
                                      {"temperature": 0.7, "stop_strings": tuple("abcdefghijklmnopqrstuvwxyz")}])
def test_group_rollout_is_the_serial_one_token_for_token(env, sampling):
    policy = TextPolicy(tiny(), sampling=SamplingConfig(max_new_tokens=10, **sampling))
    serial = group_rollout(env, policy, 7, list(range(7)), random.Random(5))
    batched = RolloutEngine(max_batch=3).group_rollout(env, policy, 7, list(range(7)), random.Random(5))
    same(serial, batched)
    steps = serial.steps
    assert any(s.data.window_start > 0 for s in steps)  # the window moved
    stops = {s.data.stop for s in steps}
    if "stop_strings" in sampling:
        assert {"eot", "stop_string"} <= stops
    else:
        assert stops >= ({"eot"} if sampling.get("temperature") == 0.0 else {"eot", "max_tokens"})


@pytest.mark.parametrize("selection,entropy_mode",
                         [("uniform", "first"), ("entropy", "first"), ("entropy", "greedy_max")])
def test_tree_rollout_is_the_serial_one_token_for_token(env, selection, entropy_mode):
    policy = TextPolicy(tiny(), sampling=SamplingConfig(max_new_tokens=8, entropy_mode=entropy_mode))
    serial = tree_rollout(env, policy, 4, 3, [3, 4, 5, 6], random.Random(1), selection)
    batched = RolloutEngine(max_batch=5).tree_rollout(env, policy, 4, 3, [3, 4, 5, 6], random.Random(1), selection)
    same(serial, batched)
    assert batched.forks > 0 and len(batched.episodes) == 12
    for e in batched.episodes:  # a branch continues from its base's history at the fork turn
        if e.branch and e.steps:
            base = next(b for b in batched.episodes if b.base == e.base and b.branch == 0)
            assert e.steps[0].data.context == next(s for s in base.steps if s.turn == e.fork_turn).data.context


def test_hugging_face_llama_group_and_tree(env):
    policy = TextPolicy(llama(), sampling=SamplingConfig(max_new_tokens=8))
    engine = RolloutEngine(max_batch=4)
    same(group_rollout(env, policy, 5, list(range(5)), random.Random(2)),
         engine.group_rollout(env, policy, 5, list(range(5)), random.Random(2)))
    same(tree_rollout(env, policy, 2, 3, [0, 1], random.Random(2)),
         engine.tree_rollout(env, policy, 2, 3, [0, 1], random.Random(2)))


def test_behavior_logprobs_equal_the_trainers_recompute(env):
    model = tiny()
    policy = TextPolicy(model, sampling=SamplingConfig(max_new_tokens=10, temperature=0.8))
    ro = RolloutEngine().tree_rollout(env, policy, 3, 3, [0, 1, 2], random.Random(0))
    for s in ro.steps:
        r = s.data
        ids = torch.tensor([r.context[r.window_start:] + r.action_ids])
        with torch.no_grad():
            logp, ent, _ = token_logprobs(model, ids, temperature=0.8)
        n = len(r.action_ids)
        assert logp[0, -n:].tolist() == pytest.approx(r.logps, abs=1e-5)
        assert ent[0, -n:].tolist() == pytest.approx(r.entropies, abs=1e-4)


def test_episode_streams_do_not_depend_on_the_other_episodes(env):
    """Episode i of a group depends on its own stream only: the same stream seed gives the same episode
    in a group of 1 (the serial loop's arithmetic, one session at a time)."""
    policy = TextPolicy(tiny(), sampling=SamplingConfig(max_new_tokens=8))
    ro = RolloutEngine().group_rollout(env, policy, 4, [10, 11, 12, 13], random.Random(9))
    seeds = episode_seeds(random.Random(9), 4)
    obs, info = env.reset(seed=12)
    session, rng = policy.session(obs, info), stream(seeds[2])
    first = session.act(rng)
    assert first.data.action_ids == ro.episodes[2].steps[0].data.action_ids
    assert stream(seeds[2], 1).random() != stream(seeds[2]).random()


def test_padded_forward_equals_the_unpadded_one():
    """TinyCausalLM.forward with a slot mask and positions: rows of different lengths, right-padded, give the
    logits and cache of each row run alone."""
    model = tiny()
    a, b = [5, 6, 7, 8, 9], [1, 2, 3]
    with torch.no_grad():
        la, pa = model(torch.tensor([a]))
        lb, pb = model(torch.tensor([b]))
        ids = torch.tensor([a, b + [0, 0]])
        mask = torch.tensor([[1] * 5, [1] * 3 + [0, 0]], dtype=torch.bool)
        out, cache = model(ids, mask=mask, positions=torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]))
        assert torch.allclose(out[0], la[0], atol=1e-5) and torch.allclose(out[1, :3], lb[0], atol=1e-5)
        # one more token each, after the padded cache: row b's position is 3, its padding slots masked
        nxt = torch.tensor([[4], [4]])
        step, _ = model(nxt, cache, mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.bool)], 1),
                        positions=torch.tensor([[5], [3]]))
        ra, _ = model(torch.tensor([[4]]), pa)
        rb, _ = model(torch.tensor([[4]]), pb)
        assert torch.allclose(step[0], ra[0], atol=1e-5) and torch.allclose(step[1], rb[0], atol=1e-5)


def test_max_batch_must_be_positive():
    with pytest.raises(ValueError, match="max_batch"):
        RolloutEngine(0)


def test_train_lm_samples_through_the_engine_by_default_and_serial_on_request():
    from trainer.text.text_config import TextTrainConfig
    from trainer.text.text_sft import new_model
    from trainer.text.text_train import PPOTextPolicy, sample_batch

    rollouts = {}
    for sampler in ("batched", "serial"):
        cfg = TextTrainConfig(max_turns=2, n_base=3, branches=3, estimator="tree", tokenizer="byte", d_model=32,
                              n_layers=1, n_heads=2, context=256, max_new_tokens=6, device="cpu", sampler=sampler)
        policy = PPOTextPolicy.from_config(new_model(cfg), cfg)
        assert (policy.engine is not None) == (sampler == "batched")
        env = make_env(cfg.env_id, cfg.env_options())
        rollouts[sampler] = sample_batch(cfg, env, policy, random.Random(0), 0)[0]
        env.close()
    assert TextTrainConfig().sampler == "batched"
    same(rollouts["serial"], rollouts["batched"])


def test_infrastructure_failures_lose_the_same_episodes():
    from envs.clueprobe import ClueProbeEnv
    from envs.core import EnvInfraError

    class Flaky(ClueProbeEnv):
        """ClueProbe whose infrastructure fails at the second step of episodes reset with seed 2."""

        def reset(self, *, seed=None, options=None):
            self.current = seed
            return super().reset(seed=seed, options=options)

        def step(self, action):
            if self.current == 2 and self.turn == 1:
                raise EnvInfraError("sandbox lost")
            return super().step(action)

    env = Flaky(turns=3)
    policy = TextPolicy(tiny(), sampling=SamplingConfig(max_new_tokens=6))
    serial = group_rollout(env, policy, 4, [0, 1, 2, 3], random.Random(4))
    batched = RolloutEngine(max_batch=2).group_rollout(env, policy, 4, [0, 1, 2, 3], random.Random(4))
    same(serial, batched)
    assert [e.infra_failure for e in batched.episodes] == [False, False, True, False]
    same(tree_rollout(env, policy, 3, 2, [1, 2, 3], random.Random(4)),
         RolloutEngine().tree_rollout(env, policy, 3, 2, [1, 2, 3], random.Random(4)))


def test_a_small_kv_cap_gives_the_same_episodes_in_more_waves(env):
    """``max_kv_tokens``: waves of at most that many KV slots (rows x the longest row's window + action), at
    least one row each; the episodes are those of no cap and of the serial loop."""
    policy = TextPolicy(tiny(), sampling=SamplingConfig(max_new_tokens=8))
    capped = RolloutEngine(max_batch=64, max_kv_tokens=300)
    serial = tree_rollout(env, policy, 4, 3, [3, 4, 5, 6], random.Random(3))
    same(serial, capped.tree_rollout(env, policy, 4, 3, [3, 4, 5, 6], random.Random(3)))
    same(serial, RolloutEngine(max_batch=64).tree_rollout(env, policy, 4, 3, [3, 4, 5, 6], random.Random(3)))
    same(group_rollout(env, policy, 6, list(range(6)), random.Random(1)),
         RolloutEngine(max_kv_tokens=1).group_rollout(env, policy, 6, list(range(6)), random.Random(1)))
    obs, info = env.reset(seed=0)
    rows = [Row(env, policy.session(obs, info), None, random.Random(0)) for _ in range(7)]
    need = min(len(rows[0].session.ids) + 8, 160)  # window + max_new_tokens, at most the context
    assert [len(w) for w in capped.waves(rows)] == [300 // need] * (7 // (300 // need)) + (
        [7 % (300 // need)] if 7 % (300 // need) else [])
    assert [len(w) for w in RolloutEngine(max_batch=4).waves(rows)] == [4, 3]
    assert [len(w) for w in RolloutEngine(max_kv_tokens=1).waves(rows)] == [1] * 7
    with pytest.raises(ValueError, match="max_kv_tokens"):
        RolloutEngine(max_kv_tokens=0)
    from trainer.text.text_config import TextTrainConfig

    e = RolloutEngine.from_config(TextTrainConfig(max_batch=5, max_kv_tokens=500, env_threads=3, max_live=7))
    assert (e.max_batch, e.max_kv_tokens, e.env_threads, e.max_live) == (5, 500, 3, 7)
    assert TextTrainConfig(window_step=32).sampling().window_step == 32
    with pytest.raises(ValueError, match="env_threads"):
        RolloutEngine(env_threads=0)


class ThreadProbe(ClueProbeEnv):
    """ClueProbe that records the thread of each step; ``blocking`` as the class says (a sandbox env's flag)."""

    threads: list[int] = []

    def step(self, action):
        ThreadProbe.threads.append(threading.get_ident())
        return super().step(action)


class BlockingProbe(ThreadProbe):
    blocking = True


def test_env_steps_of_a_blocking_env_run_in_worker_threads_with_the_serial_results():
    """A blocking env's steps run in the engine's worker threads, a pure-Python env's inline; episodes,
    rewards and counters are the serial loop's either way (results applied in row order)."""
    policy = TextPolicy(tiny(), sampling=SamplingConfig(max_new_tokens=6))
    assert not blocking(ClueProbeEnv(max_turns=3)) and blocking(BlockingProbe(max_turns=3))
    for cls, threads in ((ThreadProbe, {threading.get_ident()}), (BlockingProbe, None)):
        env = cls(max_turns=3)
        serial = tree_rollout(env, policy, 4, 3, [0, 1, 2, 3], random.Random(6))
        ThreadProbe.threads = []
        same(serial, RolloutEngine(env_threads=4).tree_rollout(env, policy, 4, 3, [0, 1, 2, 3], random.Random(6)))
        assert ThreadProbe.threads
        if threads is not None:
            assert set(ThreadProbe.threads) == threads
        else:
            assert threading.get_ident() not in ThreadProbe.threads and len(set(ThreadProbe.threads)) > 1
        ThreadProbe.threads = []
        same(serial, RolloutEngine(env_threads=1).tree_rollout(env, policy, 4, 3, [0, 1, 2, 3], random.Random(6)))
        assert set(ThreadProbe.threads) == {threading.get_ident()}


def test_fileqa_local_backend_batched_with_worker_threads_is_the_serial_rollout():
    """FileQA over the local sandbox backend (a blocking env: resets and steps wait on sandboxes): the engine's
    threaded env calls give the serial loop's episodes."""
    env = make_env("forkyard/FileQA-v0", {"backend": "local", "max_turns": 2})
    try:
        policy = TextPolicy(tiny(context=256), sampling=SamplingConfig(max_new_tokens=8, max_obs_tokens=48))
        same(group_rollout(env, policy, 4, [0, 1, 2, 3], random.Random(2)),
             RolloutEngine(env_threads=4).group_rollout(env, policy, 4, [0, 1, 2, 3], random.Random(2)))
        same(tree_rollout(env, policy, 2, 2, [4, 5], random.Random(2)),
             RolloutEngine(env_threads=4).tree_rollout(env, policy, 2, 2, [4, 5], random.Random(2)))
    finally:
        env.close()


def test_a_window_step_moves_the_window_in_multiples_and_batched_is_still_serial(env):
    """``SamplingConfig.window_step``: window starts are multiples of the step (the window moved, fewer times
    than with the default), the same in both paths, and the behavior log-probs are the trainer's recompute."""
    model = tiny()
    starts = {}
    for step in (1, 64):
        policy = TextPolicy(model, sampling=SamplingConfig(max_new_tokens=8, window_step=step))
        serial = tree_rollout(env, policy, 3, 3, [0, 1, 2], random.Random(8))
        batched = RolloutEngine(max_batch=4).tree_rollout(env, policy, 3, 3, [0, 1, 2], random.Random(8))
        same(serial, batched)
        starts[step] = [s.data.window_start for s in batched.steps]
        for s in batched.steps:
            r = s.data
            assert r.window_start % step == 0 and len(r.context) - r.window_start + 8 <= 160
            with torch.no_grad():
                logp, _, _ = token_logprobs(model, torch.tensor([r.context[r.window_start:] + r.action_ids]))
            assert logp[0, -len(r.action_ids):].tolist() == pytest.approx(r.logps, abs=1e-5)
    assert any(starts[64]) and len(set(starts[64])) < len(set(starts[1]))
    with pytest.raises(ValueError, match="window_step"):
        SamplingConfig(window_step=0)


def test_max_live_runs_episodes_in_cohorts_with_the_same_episodes(env):
    """``max_live``: at most that many episodes hold an env copy at once (tree: ``max_live // branches`` bases
    and their branches at a time); group, tree and play give the serial loop's episodes and counters."""
    policy = TextPolicy(tiny(), sampling=SamplingConfig(max_new_tokens=6))
    for live in (1, 3, 5):
        engine = RolloutEngine(max_live=live)
        same(group_rollout(env, policy, 7, list(range(7)), random.Random(4)),
             engine.group_rollout(env, policy, 7, list(range(7)), random.Random(4)))
        same(tree_rollout(env, policy, 5, 3, [0, 1, 2, 3, 4], random.Random(4)),
             engine.tree_rollout(env, policy, 5, 3, [0, 1, 2, 3, 4], random.Random(4)))
        resets = [(i, None) for i in range(5)]
        a = RolloutEngine().play(env, policy, resets, random.Random(2))
        b = engine.play(env, policy, resets, random.Random(2))
        assert [[s.data.action_ids for s in e.steps] for e in a] == [[s.data.action_ids for s in e.steps] for e in b]
    assert [(c.start, c.stop) for c in RolloutEngine(max_live=7)._cohorts(16, 3)] == [(0, 2), (2, 4), (4, 6), (6, 8),
                                                                                     (8, 10), (10, 12), (12, 14),
                                                                                     (14, 16)]
    assert [(c.start, c.stop) for c in RolloutEngine()._cohorts(16, 3)] == [(0, 16)]
    with pytest.raises(ValueError, match="max_live"):
        RolloutEngine(max_live=0)


def per_task(rollouts: list) -> Rollout:
    """Serial per-task rollouts (one base or episode each, its own RNG) as one: episodes in order, each tree
    episode's ``base`` its task's index, counters summed."""
    episodes = []
    for b, ro in enumerate(rollouts):
        for e in ro.episodes:
            e.base = b if ro.kind == "tree" else None
            episodes.append(e)
    return Rollout(rollouts[0].kind, episodes, sum(r.env_calls for r in rollouts), sum(r.forks for r in rollouts),
                   sum(r.forks_failed for r in rollouts), sum(r.branches_lost for r in rollouts))


def test_explicit_stream_seeds_run_several_bases_as_their_own_serial_calls(env):
    """``stream_seeds`` (a Ray rollout worker's bases, ray_cluster/collector.py): several bases or group episodes in
    one engine call, each seeded with ``episode_seeds(rng_b, 1)[0]`` of its own RNG, are the serial calls of one
    base (episode) each with that RNG, token for token; the serial loops take the same argument."""
    policy = TextPolicy(tiny(), sampling=SamplingConfig(max_new_tokens=8))
    engine = RolloutEngine(max_batch=4)

    def rng(b):
        return random.Random(f"7:1:{b}")  # ray_cluster.collector.task_rng(7, 1, b)

    seeds = [21, 22, 23, 24]
    streams = [episode_seeds(rng(b), 1)[0] for b in range(4)]
    serial_tree = per_task([tree_rollout(env, policy, 1, 3, [s], rng(b)) for b, s in enumerate(seeds)])
    batched_tree = engine.tree_rollout(env, policy, 4, 3, seeds, None, stream_seeds=streams)
    same(serial_tree, batched_tree)
    same(serial_tree, tree_rollout(env, policy, 4, 3, seeds, None, stream_seeds=streams))
    assert batched_tree.forks > 0 and len(batched_tree.episodes) == 12
    serial_group = per_task([group_rollout(env, policy, 1, [s], rng(b)) for b, s in enumerate(seeds)])
    same(serial_group, engine.group_rollout(env, policy, 4, seeds, None, stream_seeds=streams))
    same(serial_group, group_rollout(env, policy, 4, seeds, None, stream_seeds=streams))
    # Given stream seeds, the rng is not read; without them the rollouts are what they were.
    r = random.Random(3)
    engine.group_rollout(env, policy, 4, seeds, r, stream_seeds=streams)
    assert r.random() == random.Random(3).random()
    same(group_rollout(env, policy, 4, seeds, random.Random(3)), engine.group_rollout(env, policy, 4, seeds,
                                                                                       random.Random(3)))
    with pytest.raises(ValueError, match="3 stream seeds for 4"):
        engine.tree_rollout(env, policy, 4, 3, seeds, None, stream_seeds=streams[:3])
    with pytest.raises(ValueError, match="need rng or stream_seeds"):
        group_rollout(env, policy, 4, seeds, None)
