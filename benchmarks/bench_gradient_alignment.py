"""How well does one iteration of each advantage estimator point up the true gradient? (text policy, ClueProbe)

At a fixed policy (an SFT checkpoint), the exact gradient of the expected success,
``trainer.text.text_eval.exact_policy_gradient``, is the reference direction. Each variant then samples
``--samples`` independent iterations exactly as ``forkyard train-lm`` does (same rollout shape, estimator,
token batch and PPO loss at its first epoch, where the ratio is 1), without updating the model, and each
iteration's ascent direction ``-grad(loss)`` is compared with the reference:

* ``cos``: mean cosine of one iteration's gradient with the exact gradient (± s.e. over iterations,
  :func:`trainer.stats.standard_error`);
  a plain SGD step improves the objective to first order in proportion to it;
* ``cos(mean)``: cosine of the mean of all sampled gradients (high when the estimator is unbiased
  up to scale; low when it is biased);
* ``cos(adam)``: the same as ``cos`` for ``sign(g)``, the direction of Adam's first steps (the trainer's
  optimiser), since Adam rescales each coordinate;
* ``calls``: env calls per iteration (the budget), and each figure's ratio to ``traj`` measured in the
  same run.

Run (about 5 minutes on 2 cores with a checkpoint; without one, a skill-1 SFT model is trained first):

    .venv/bin/python benchmarks/bench_gradient_alignment.py --checkpoint runs/pilot5/sft_skill1/sft.pt
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from trainer.text.checkpoints import load_checkpoint
from trainer.loop import make_env
from trainer.text.losses import PPOConfig, ppo_loss
from trainer.stats import standard_error
from trainer.text.text_config import TextTrainConfig
from trainer.text.text_eval import exact_policy_gradient
from trainer.text.text_policy import TextPolicy, token_logprobs
from trainer.text.text_sft import sft
from trainer.text.text_train import sample_batch
from trainer.text.tokenizer import model_tokenizer

#: the variants: TextTrainConfig fields over the defaults below (the arms of docs/results/text_policy.md)
VARIANTS = {
    "traj": {"estimator": "traj", "group_size": 24},
    "tree": {"estimator": "tree", "n_base": 6, "branches": 6},
    "tree_branchmean": {"estimator": "tree", "n_base": 6, "branches": 6, "tree_prefix": "branch_mean"},
    "tree_anchor": {"estimator": "anchor_fallback", "rollout": "tree", "n_base": 6, "branches": 6},
    "tree_entropy": {"estimator": "tree", "n_base": 6, "branches": 6, "fork_selection": "entropy",
                     "fork_entropy": "greedy_max"},
}


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in tensors])


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-30))


def sampled_gradients(model, cfg: TextTrainConfig, samples: int, seed: int) -> tuple[list[torch.Tensor], list[int]]:
    """``samples`` ascent directions [n_params] float64 of independent iterations of ``cfg``, and their env calls."""
    env = make_env(cfg.env_id, cfg.env_options())
    policy = TextPolicy(model, model_tokenizer(model), cfg.sampling())
    ppo = PPOConfig(cfg.clip_low, cfg.clip_high, cfg.entropy_coef, cfg.kl_coef, cfg.reduction)
    params = list(model.parameters())
    rng = random.Random(seed)
    grads, calls = [], []
    for it in range(samples):
        model.eval()
        ro, assigned, batch = sample_batch(cfg, env, policy, rng, it)
        calls.append(ro.env_calls)
        if batch is None:
            grads.append(torch.zeros(sum(p.numel() for p in params), dtype=torch.float64))
            continue
        logp, ent, _ = token_logprobs(model, batch.ids, cfg.temperature, policy.tok.suppressed_ids)
        loss, _ = ppo_loss(logp, batch.old_logp, batch.advantages, batch.mask, ppo, ent, None, batch.group)
        d = torch.autograd.grad(loss, params, allow_unused=True)
        grads.append(-_flat([g if g is not None else torch.zeros_like(p) for g, p in zip(d, params, strict=True)]))
    env.close()
    return grads, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="SFT weights (default: train a skill-1 SFT model first)")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--samples", type=int, default=40, help="sampled iterations per variant")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = TextTrainConfig(max_turns=args.max_turns, max_new_tokens=8, device="cpu", seed=args.seed)
    t0 = time.perf_counter()
    if args.checkpoint:
        model = load_checkpoint(args.checkpoint, "cpu")
    else:
        base.demo_skill, base.sft_steps, base.sft_lr = 1.0, 1000, 1e-3
        torch.manual_seed(args.seed)
        model, _ = sft(base)
        print(f"SFT (skill 1, 1000 steps): {time.perf_counter() - t0:.0f} s")
    model.eval()
    t1 = time.perf_counter()
    total, exact = exact_policy_gradient(model, base)
    ref = _flat(exact)
    print(f"exact success {total['success']:.4f} (coverage {total['coverage']:.3f}, {total['paths']} paths), "
          f"|grad| {float(ref.norm()):.4f}, {time.perf_counter() - t1:.0f} s")
    rows = {}
    for name in args.variants:
        cfg = TextTrainConfig(**{**base.__dict__, **VARIANTS[name]})
        t1 = time.perf_counter()
        grads, calls = sampled_gradients(model, cfg, args.samples, args.seed)
        cos = [_cos(g, ref) for g in grads]
        adam = [_cos(torch.sign(g), ref) for g in grads]
        rows[name] = {
            "calls": statistics.mean(calls),
            "cos": statistics.mean(cos),
            "cos_se": standard_error(cos),
            "cos_mean": _cos(torch.stack(grads).mean(0), ref),
            "adam": statistics.mean(adam),
            "adam_se": standard_error(adam),
            "positive": sum(c > 0 for c in cos) / len(cos),
            "wall": time.perf_counter() - t1,
        }
    base_row = rows.get("traj")
    print(f"\n{args.samples} sampled iterations per variant, T={args.max_turns}, seed {args.seed}\n")
    print("| variant | env calls / iter | cos ± s.e. | cos(mean) | cos(adam) ± s.e. | share cos > 0 | cos / traj "
          "| wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        ratio = f"{r['cos'] / base_row['cos']:.2f}" if base_row and base_row["cos"] else "-"
        print(f"| {name} | {r['calls']:.1f} | {r['cos']:.4f} ± {r['cos_se']:.4f} | {r['cos_mean']:.3f} | "
              f"{r['adam']:.4f} ± {r['adam_se']:.4f} | {r['positive']:.2f} | {ratio} | {r['wall']:.0f} |")


if __name__ == "__main__":
    main()
