"""The batched rollout engine (trainer/engine.py): the same seeds give the same episodes as the serial loops of
trainer/rollout.py, token for token, for group and tree rollouts, on forkyard's transformer and a Hugging Face
Llama; behavior log-probs equal the trainer's recompute.

Tolerance: sampled ids, actions, rewards, masks, anchor keys and env-call counts are compared exactly;
behavior log-probs with atol 1e-5 (padding and batching change the order of float32 sums, about 1e-6 here).
Models are small and random, their end-of-turn logit raised (as in tests/test_text_policy.py) so actions end
both by ``<|end|>`` and at the token limit; a small context makes windows move (left truncation).
"""

import random

import pytest
import torch

from trainer.engine import RolloutEngine
from trainer.lm import ByteTokenizer, LMConfig, build_model
from trainer.loop import make_env
from trainer.rollout import episode_seeds, group_rollout, stream, tree_rollout
from trainer.text_policy import SamplingConfig, TextPolicy, token_logprobs

TOK = ByteTokenizer()


def tiny(context=160, seed=0):
    model = build_model(LMConfig(d_model=32, n_layers=2, n_heads=2, context=context), device="cpu", seed=seed)
    with torch.no_grad():
        e = model.tok.weight[TOK.eot_id]
        model.ln_f.bias += 3.0 * e / e.pow(2).sum()
    return model.eval()


def llama(context=160):
    from trainer.hf import build_llama

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
    from trainer.text_config import TextTrainConfig
    from trainer.text_sft import new_model
    from trainer.text_train import PPOTextPolicy, sample_batch

    rollouts = {}
    for sampler in ("batched", "serial"):
        cfg = TextTrainConfig(turns=2, n_base=3, branches=3, estimator="tree", tokenizer="byte", d_model=32,
                              n_layers=1, n_heads=2, context=256, max_new_tokens=6, device="cpu", sampler=sampler)
        policy = PPOTextPolicy.from_config(new_model(cfg), cfg)
        assert (policy.engine is not None) == (sampler == "batched")
        env = make_env(cfg.env_id, cfg.env_kwargs())
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
