"""Rollout sampling speed: the serial loops of trainer/rollout.py (the baseline) against the batched engine
(trainer/engine.py), measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_rollout.py [--episodes 16 64] [--big] [--arch tiny|llama]
[--threads 1] [--device cpu] [--max-batch 64] [--repeats 3] [--max-obs-tokens N] [--profile]``.

Setting: ClueProbe (T=4, in-process), a fresh model of ``forkyard train --policy lm``'s default size (width 96,
2 layers, 4 heads, context 512, float32) with the BPE tokenizer trained on ClueProbe demonstrations, up to 16
tokens per action, temperature 1, ``torch.set_num_threads(threads)``. For each episode count K: a group rollout
of K episodes and a tree rollout of K/4 bases x 4 branches (uniform fork turns), serial then batched, same
seeds (the engine samples the same episodes: the sampled token counts match). Printed per row: sampled tokens
(the actions' ids), sampled tokens/s and episodes/s of each path (medians of ``--repeats`` interleaved runs),
and the ratio batched / serial. ``--big``
adds K = 256; ``--profile`` prints where the batched path's time goes (cProfile, top 15 by own time).
Nothing is asserted; docs/performance.md holds the figures.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.engine import RolloutEngine  # noqa: E402
from trainer.loop import make_env  # noqa: E402
from trainer.rollout import group_rollout, tree_rollout  # noqa: E402
from trainer.text_config import TextTrainConfig  # noqa: E402
from trainer.text_policy import SamplingConfig, TextPolicy  # noqa: E402
from trainer.text_sft import new_model  # noqa: E402


def sampled_tokens(ro) -> int:
    """Ids the policy sampled in a rollout (every action's ``action_ids``)."""
    return sum(len(s.data.action_ids) for s in ro.steps)


def run(kind: str, k: int, env, policy, engine, batched: bool) -> tuple[float, int, int]:
    """One rollout; returns ``(seconds, sampled tokens, episodes)``."""
    seeds = list(range(k if kind == "group" else k // 4))
    rng = random.Random(7)
    t0 = time.perf_counter()
    if kind == "group":
        ro = (engine.group_rollout if batched else group_rollout)(env, policy, k, seeds, rng)
    else:
        ro = (engine.tree_rollout if batched else tree_rollout)(env, policy, k // 4, 4, seeds, rng)
    return time.perf_counter() - t0, sampled_tokens(ro), len(ro.episodes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--big", action="store_true", help="add 256 episodes")
    ap.add_argument("--arch", default="tiny", choices=("tiny", "llama"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of each path; medians are printed")
    ap.add_argument("--max-obs-tokens", type=int, default=None,
                    help="cut observations to this many tokens (less prefill per turn)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TextTrainConfig(turns=4, arch=args.arch, device=args.device)
    model = new_model(cfg).eval()
    policy = TextPolicy(model, model.tokenizer, SamplingConfig(max_new_tokens=16, max_obs_tokens=args.max_obs_tokens))
    env = make_env("forkyard/ClueProbe-v0", {"turns": 4})
    engine = RolloutEngine(args.max_batch)
    run("tree", 8, env, policy, engine, False)  # warm-up
    run("tree", 8, env, policy, engine, True)
    counts = args.episodes + ([256] if args.big else [])
    print(f"arch {args.arch}, device {args.device}, threads {args.threads}, max_batch {args.max_batch}, "
          f"max_obs_tokens {args.max_obs_tokens}, medians of {args.repeats}")
    print(f"{'rollout':<6} {'K':>4} {'tokens':>7} {'serial tok/s':>13} {'batched tok/s':>14} "
          f"{'serial ep/s':>12} {'batched ep/s':>13} {'ratio':>6}")
    for k in counts:
        for kind in ("group", "tree"):
            serial, batched = [], []
            for _ in range(args.repeats):  # interleaved, medians: a shared machine's load hits both alike
                serial.append(run(kind, k, env, policy, engine, False))
                if args.profile:
                    import cProfile
                    import pstats

                    prof = cProfile.Profile()
                    prof.enable()
                batched.append(run(kind, k, env, policy, engine, True))
                if args.profile:
                    prof.disable()
                    pstats.Stats(prof).sort_stats("tottime").print_stats(15)
            ts, ns, es = sorted(serial)[len(serial) // 2]
            tb, nb, eb = sorted(batched)[len(batched) // 2]
            note = "" if ns == nb else f"  (token counts differ: {ns} vs {nb})"
            print(f"{kind:<6} {k:>4} {nb:>7} {ns / ts:>13.0f} {nb / tb:>14.0f} {es / ts:>12.1f} {eb / tb:>13.1f} "
                  f"{ts / tb:>5.1f}x{note}", flush=True)
    env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
