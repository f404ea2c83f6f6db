"""TRL's tree-fork ``rollout_func`` (``trainer.trl_rollout.TreeForkRollout``): batched sampling against serial.

Run: ``.venv/bin/python benchmarks/bench_trl_rollout.py [--groups 4] [--sft-steps 150] [--repeats 3]``.
One GRPO step's ``rollout_func`` call (``--groups`` prompts x G=4 rows, ClueProbe with 3 turns, up to 48 tokens a
reply) on the tiny Qwen3 of ``tests/integrations/test_trl.py`` (hidden 64, 2 layers, float32, its BPE trained here;
SFT'd on scripted tool calls for ``--sft-steps`` steps; with 1, nearly untrained, replies run to the token cap),
through a real ``GRPOTrainer``. Both samplers run with the same seeds in one process, interleaved; the rows are checked
equal. Prints medians of the model's tokens (``env_mask`` 1) per second of the call, and the ratio against
the serial sampler (the baseline). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.integrations.test_trl import CLUE, PROMPT, demo_chats, grpo_trainer, tiny_policy  # noqa: E402
from trainer.trl_rollout import TreeForkRollout  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=4, help="groups of 4 rows in the step")
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fork-turn", default="uniform", choices=["uniform", "entropy", "none"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    chats, tools = demo_chats(CLUE, {"max_turns": 2}, 48)
    model, tok = tiny_policy(chats, tools, steps=max(1, args.sft_steps), max_loss=float("inf"))
    n = 4 * args.groups
    with tempfile.TemporaryDirectory() as tmp:
        trainer = grpo_trainer(Path(tmp), model, tok, None, list(range(n)), batch=n,
                               reward_funcs=[lambda completions, **kwargs: [0.0] * len(completions)])
        prompts = [[{"role": "user", "content": PROMPT + " " * (j // 4)}] for j in range(n)]
        rates: dict[str, list[float]] = {"serial": [], "batched": []}
        rows: dict[str, dict] = {}
        for rep in range(args.repeats):
            trainer.state.global_step = rep
            for sampler in rates:
                rollout = TreeForkRollout(CLUE, max_turns=3, fork_turn=args.fork_turn, max_new_tokens=48,
                                          sampler=sampler)
                t0 = time.perf_counter()
                rows[sampler] = rollout(prompts, trainer)
                seconds = time.perf_counter() - t0
                tokens = sum(sum(m) for m in rows[sampler]["env_mask"])
                rates[sampler].append(tokens / seconds)
                print(f"repeat {rep} {sampler:8s} {tokens:6d} model tokens in {seconds:6.2f} s: "
                      f"{tokens / seconds:8.1f} tokens/s", flush=True)
            same = rows["serial"]["completion_ids"] == rows["batched"]["completion_ids"]
            print(f"repeat {rep}: rows equal token for token: {same}")
    serial, batched = statistics.median(rates["serial"]), statistics.median(rates["batched"])
    print(f"\n{n} rows ({args.groups} groups x 4, fork_turn={args.fork_turn}), median of {args.repeats}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"serial  {serial:8.1f} tokens/s (baseline)")
    print(f"batched {batched:8.1f} tokens/s  x{batched / serial:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
