"""Exact expected success of a text policy (trainer/text/text_eval.py), checked against the policy's own
sampling: the per-action probability equals the behavior log-prob recorded while sampling, and the summed
tree equals a Monte Carlo estimate of the same quantity from real rollouts."""

import math
import random

import pytest
import torch

from trainer.text.text_eval import action_probabilities, exact_policy_gradient, exact_success
from trainer.text.text_policy import TextPolicy
from trainer.loop import make_env
from trainer.text.text_config import TextTrainConfig
from trainer.text.text_sft import sft

CFG = TextTrainConfig(max_turns=3, vocab=400, d_model=32, n_layers=1, n_heads=2, context=256, device="cpu",
                      sft_steps=200, sft_batch=16, sft_lr=1e-2, demo_skill=1.0, max_new_tokens=8, seed=1)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m, _ = sft(CFG)
    return m


def _episodes(model, n, seed):
    """n sampled ClueProbe episodes (targets cycled); per episode: (return, all actions canonical texts of
    the env's action vocabulary, legal at their turn or not; steps)."""
    env = make_env(CFG.env_id, CFG.env_options())
    vocabulary = env.action_vocabulary
    policy = TextPolicy(model, model.tokenizer, CFG.sampling())
    rng = random.Random(seed)
    out = []
    for i in range(n):
        obs, info = env.reset(seed=i, options={"target": i % 8})
        session = policy.session(obs, info)
        ret, canonical, steps = 0.0, True, []
        while True:
            step = session.act(rng)
            steps.append(step)
            ids = step.data.action_ids
            canonical &= (step.action in vocabulary and step.data.stop == "eot"
                          and ids[:-1] == model.tokenizer.encode(step.action))
            obs, r, te, tr, info = env.step(step.action)
            ret += r
            if te or tr:
                break
            session.observe(obs, info)
        out.append((ret, canonical, steps))
    env.close()
    return out


def test_action_probability_equals_the_recorded_behavior_logprob(model):
    policy = TextPolicy(model, model.tokenizer, CFG.sampling())
    checked = 0
    for _, canonical, steps in _episodes(model, 40, seed=1):
        for step in steps:
            if canonical:  # every action of the episode was a canonical vocabulary text
                p = action_probabilities(policy, step.data.context, [step.action])[0]
                assert p == pytest.approx(math.exp(step.logp), rel=1e-4)
                checked += 1
    assert checked >= 60  # most episodes write canonical calls after SFT


def test_probabilities_of_the_legal_actions_sum_to_at_most_one(model):
    policy = TextPolicy(model, model.tokenizer, CFG.sampling())
    env = make_env(CFG.env_id, CFG.env_options())
    obs, info = env.reset(seed=0)
    probs = action_probabilities(policy, policy.template.first(obs), info["legal_actions"])
    assert len(probs) == 3 and all(0.0 < p < 1.0 for p in probs)
    assert 0.5 < sum(probs) <= 1.0 + 1e-6


def test_exact_success_matches_monte_carlo_of_the_same_quantity(model):
    one = [(0, {"target": 5})]
    full = exact_success(model, CFG, resets=one, min_path_prob=0.0)
    assert full["paths"] == 11 ** 3  # every vocabulary action at each of the 3 turns
    pruned = exact_success(model, CFG, resets=one)  # default min_path_prob 1e-6: far fewer paths, same figures
    assert pruned["paths"] < full["paths"] / 4
    assert pruned["success"] == pytest.approx(full["success"], abs=1e-3)
    assert pruned["coverage"] == pytest.approx(full["coverage"], abs=1e-3)
    exact = exact_success(model, CFG)
    assert 0.0 < exact["success"] <= exact["coverage"] <= 1.0 + 1e-9
    eps = _episodes(model, 1200, seed=2)
    mc_success = sum(r for r, c, _ in eps if c) / len(eps)
    mc_coverage = sum(c for _, c, _ in eps) / len(eps)
    se_s = math.sqrt(max(exact["success"] * (1 - exact["success"]), 1e-4) / len(eps))
    se_c = math.sqrt(max(exact["coverage"] * (1 - exact["coverage"]), 1e-4) / len(eps))
    assert abs(mc_success - exact["success"]) < 4 * se_s
    assert abs(mc_coverage - exact["coverage"]) < 4 * se_c


def test_unsupported_settings_and_runaway_trees_raise(model):
    from dataclasses import replace

    with pytest.raises(ValueError, match="top_p"):
        exact_success(model, replace(CFG, top_p=0.9))
    with pytest.raises(ValueError, match="max_paths"):
        exact_success(model, CFG, max_paths=10)


def test_eval_lm_command_reads_a_checkpoint_file(model, tmp_path, capsys):
    import json

    from trainer.cli import main
    from trainer.text.checkpoints import save_checkpoint

    path = tmp_path / "model.pt"
    save_checkpoint(model, str(path), tokenizer=model.tokenizer)
    assert main(["eval-lm", str(path), "--max-turns", "3", "--samples", "16", "--exact"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["exact_success"] == pytest.approx(exact_success(model, CFG)["success"], rel=1e-5)
    assert row["exact_paths"] > 8 * 3 * 3 and 0.0 <= row["sampled_accuracy"] <= 1.0


def test_exact_policy_gradient_matches_a_central_finite_difference(model):
    """d/d eps of exact_success(theta + eps * u) at 0 equals <grad, u> for the unit direction u of the gradient
    and for the gradient of the largest weight matrix alone (central difference, eps 1e-3)."""
    resets = [(0, {"target": c}) for c in (0, 3, 6)]
    model.zero_grad(set_to_none=True)
    total, grads = exact_policy_gradient(model, CFG, resets, min_path_prob=1e-4)
    assert total["success"] == pytest.approx(exact_success(model, CFG, resets, min_path_prob=1e-4)["success"], abs=1e-9)
    params = list(model.parameters())
    assert all(p.grad is None for p in params)  # the model's .grad is left alone
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    assert norm > 1e-3
    # second direction: one parameter tensor's part of the gradient alone (checks that tensor's own entries)
    k = max(range(len(grads)), key=lambda i: grads[i].numel() if grads[i].dim() == 2 else 0)
    part = [g / float(g.norm()) if i == k else torch.zeros_like(g) for i, g in enumerate(grads)]
    for direction in ([g / norm for g in grads], part):
        expected = sum(float((g.double() * d.double()).sum()) for g, d in zip(grads, direction, strict=True))
        eps, values = 1e-3, []
        for sign in (1, -1):
            with torch.no_grad():
                for p, d in zip(params, direction, strict=True):
                    p.add_(sign * eps * d)
            values.append(exact_success(model, CFG, resets, min_path_prob=1e-4)["success"])
            with torch.no_grad():
                for p, d in zip(params, direction, strict=True):
                    p.sub_(sign * eps * d)
        assert (values[0] - values[1]) / (2 * eps) == pytest.approx(expected, rel=0.05, abs=1e-4)
