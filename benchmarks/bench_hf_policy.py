"""The text policy on forkyard's own transformer against a ``transformers`` Llama of the same size.

Run: ``.venv/bin/python benchmarks/bench_hf_policy.py [--device cpu|cuda] [--rollouts 3] [--threads 1]``.
Both models are built fresh (same width 96, 2 layers, 4 heads, context 512, float32), with the same BPE
tokenizer trained on ClueProbe demonstrations; measured in one run, interleaved, medians:

* **sampling**: tree-fork ClueProbe rollouts (T=4, 6 bases x 4 branches, up to 16 tokens per action, KV cache),
  generated tokens per second;
* **update**: one PPO epoch (forward, backward, Adam step) over the rollout's token batch, trained tokens
  per second.

The baseline is forkyard's ``TinyCausalLM``. Nothing is asserted; docs/results/hf_policy.md holds the figures.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.text.hf import build_llama  # noqa: E402
from trainer.text.lm import build_model  # noqa: E402
from trainer.loop import make_env  # noqa: E402
from trainer.text.losses import PPOConfig  # noqa: E402
from trainer.waves import tree_rollout  # noqa: E402
from trainer.text.text_config import TextTrainConfig  # noqa: E402
from trainer.text.text_policy import SamplingConfig  # noqa: E402
from trainer.text.text_sft import make_tokenizer  # noqa: E402
from trainer.text.text_train import PPOTextPolicy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rollouts", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TextTrainConfig(max_turns=4)
    tok = make_tokenizer(cfg)
    size = cfg.lm_config(tok.vocab_size)
    tiny = build_model(size, args.device, "float32", seed=0)
    tiny.tokenizer = tok
    models = {"forkyard TinyCausalLM (baseline)": tiny,
              "transformers LlamaForCausalLM": build_llama(size, tok, args.device)}
    params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    env = make_env("forkyard/ClueProbe-v0", {"max_turns": 4})
    sampling = SamplingConfig(max_new_tokens=16)
    res: dict[str, dict[str, list[float]]] = {k: {"sample": [], "update": []} for k in models}
    for r in range(args.rollouts + 1):  # the first round warms up
        for name, model in models.items():
            pol = PPOTextPolicy(model, tok, sampling, lr=1e-4, ppo=PPOConfig(), ppo_epochs=1, max_grad_norm=1.0)
            t0 = time.perf_counter()
            ro = tree_rollout(env, pol, 6, 4, [100 + i for i in range(6)], random.Random(r))
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            gen = sum(len(s.data.action_ids) for s in ro.steps)
            from trainer.estimators import Assigned

            steps = ro.steps
            assigned = Assigned(steps, [(-1.0) ** i for i in range(len(steps))], len(ro.episodes), {})
            t0 = time.perf_counter()
            out = pol.update(ro, assigned)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            du = time.perf_counter() - t0
            if r:
                res[name]["sample"].append(gen / dt)
                res[name]["update"].append(out["trained_tokens"] / du)
    base = next(iter(res.values()))
    bs, bu = statistics.median(base["sample"]), statistics.median(base["update"])
    print(f"device {args.device}, {args.threads} CPU thread(s), {args.rollouts} rollouts each (medians)\n")
    print("| model | parameters | sampling tokens/s | vs baseline | PPO update tokens/s | vs baseline |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, v in res.items():
        s, u = statistics.median(v["sample"]), statistics.median(v["update"])
        print(f"| {name} | {params[name]:,} | {s:.0f} | {s / bs:.2f}x | {u:.0f} | {u / bu:.2f}x |")
    if args.device.startswith("cuda"):
        print(f"\npeak GPU memory allocated by torch: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB "
              f"({torch.cuda.get_device_name()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
