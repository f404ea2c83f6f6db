"""The PPO update on a tree as a tree (``--update tree``, trainer/text/tree_update.py) against the flat padded update.

Run: ``.venv/bin/python benchmarks/bench_tree_update.py [--env forkyard/ClueProbe-v0] [--turns 5] [--trees 8]
[--branches 4] [--group 32] [--d-model 128] [--layers 4] [--tools json] [--repeats 5]``.

For each architecture (forkyard's ``tiny`` transformer and a ``transformers`` Llama of the same size, built from a
config, BPE tokenizer, warm-started for ``--sft-steps`` steps on the env's demonstrations) it samples one real
rollout of each kind with the batched engine: a tree-fork rollout of ``--trees`` bases x ``--branches`` branches
(fork turn uniform) and a group rollout of ``--group`` independent episodes of one seed (a GRPO group), then times
one PPO epoch (forward, loss, backward, Adam step) of the same rows both ways from the same weights, alternating,
``--repeats`` times. Prints the token slots each forward computes (flat: rows x longest row; tree: the prefix trees'
nodes), the median seconds and the speed-up (flat / tree). The baseline is the flat update measured in the same run.
Nothing is asserted; the equality of the two updates is tested in tests/trainer/test_tree_update.py.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.estimators import Assigned  # noqa: E402
from trainer.loop import collect, make_env  # noqa: E402
from trainer.text.text_config import TextTrainConfig  # noqa: E402
from trainer.text.text_sft import sft  # noqa: E402
from trainer.text.text_train import PPOTextPolicy  # noqa: E402


def rollout(cfg: TextTrainConfig, policy: PPOTextPolicy):
    env = make_env(cfg.env_id, cfg.env_options())
    try:
        ro, assigned = collect(cfg, env, policy, random.Random(cfg.seed), 0)
    finally:
        env.close()
    # alternating signs train every step (a group whose rewards are equal would train none)
    return ro, Assigned(assigned.steps, [(-1.0) ** i for i in range(len(assigned.steps))], assigned.n_episodes,
                        assigned.stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="forkyard/ClueProbe-v0")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--trees", type=int, default=8)
    ap.add_argument("--branches", type=int, default=4)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--tools", default="json", choices=("none", "text", "json"),
                    help="the env's tool schemas in the first prompt (json: as TRL's tool loop renders them)")
    ap.add_argument("--sft-steps", type=int, default=100,
                    help="warm start on the env's demonstrations (forkyard sft), so rows look like a trained policy's")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    base = dict(env_id=args.env, max_turns=args.turns, max_new_tokens=args.max_new_tokens, ppo_epochs=1,
                device="cpu", seed=0, tools=args.tools, d_model=args.d_model, n_layers=args.layers, n_heads=4,
                context=1024, sft_steps=args.sft_steps)
    shapes = {
        "tree": dict(n_base=args.trees, branches=args.branches),
        "group": dict(group_size=args.group, rollout="group", estimator="traj"),
    }
    print(f"{args.env} T={args.turns}, d_model {args.d_model}, {args.layers} layers, one PPO epoch, "
          f"median of {args.repeats}, torch threads {torch.get_num_threads()}")
    print(f"{'arch':6} {'rollout':6} {'rows':>5} {'flat slots':>10} {'tree nodes':>10} {'slots ratio':>11} "
          f"{'flat s':>8} {'tree s':>8} {'speed-up':>8}")
    for arch in ("tiny", "llama"):
        model, _ = sft(TextTrainConfig(**base, arch=arch))
        for kind, shape in shapes.items():
            cfg = TextTrainConfig(**base, **shape, arch=arch)
            flat = PPOTextPolicy.from_config(copy.deepcopy(model), cfg)
            tree = PPOTextPolicy.from_config(copy.deepcopy(model), TextTrainConfig(**base, **shape, arch=arch,
                                                                                   update="tree"))
            ro, assigned = rollout(cfg, flat)
            times: dict[str, list[float]] = {"flat": [], "tree": []}
            out = {}
            for _ in range(args.repeats):
                for name, policy in (("flat", flat), ("tree", tree)):
                    t0 = time.perf_counter()
                    out[name] = policy.update(ro, assigned)
                    times[name].append(time.perf_counter() - t0)
            f, t = statistics.median(times["flat"]), statistics.median(times["tree"])
            slots, nodes = out["flat"]["forward_tokens"], out["tree"]["forward_tokens"]
            rows = len(ro.episodes)
            print(f"{arch:6} {kind:6} {rows:5d} {slots:10.0f} {nodes:10.0f} {slots / nodes:10.2f}x "
                  f"{f:8.3f} {t:8.3f} {f / t:7.2f}x")


if __name__ == "__main__":
    main()
