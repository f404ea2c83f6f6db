"""Tree-fork rollouts sampled by vLLM's server against forkyard's batched torch sampler, through the one wave driver.

Run: ``make vllm`` once, then ``.venv/bin/python benchmarks/bench_vllm_rollout.py [--trees 16] [--branches 4]
[--sft-steps 150] [--repeats 3]``. ``--trees`` ClueProbe trees (3 turns, uniform fork turn) of ``--branches``
episodes each, on the tiny Qwen3 of ``tests/integrations/test_trl.py`` (hidden 64, 2 layers, float32, untied output
layer; SFT'd on scripted tool calls for ``--sft-steps`` steps), up to 48 tokens a reply, played by
``trainer.waves.WaveDriver`` over ``trainer.trl_engine.HFChatSampler`` (the baseline, in this process) and over
``trainer.vllm_sampler.VLLMSampler`` (``scripts/vllm-serve.sh`` on loopback, started here). Prints medians of sampled
tokens per second of the rollout (env steps included), the ratio against the baseline, and the share of vLLM's
prompt tokens its prefix cache served (``vllm:prefix_cache_hits_total`` / ``..._queries_total`` over the vLLM runs).
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import torch  # noqa: E402
from trl.chat_template_utils import get_training_chat_template  # noqa: E402

from envs.clueprobe import ClueProbeEnv  # noqa: E402
from envs.trl import env_tools  # noqa: E402
from tests.docker_support import free_port, wait_http_ok  # noqa: E402
from tests.integrations.test_trl import CLUE, PROMPT, demo_chats, tiny_policy  # noqa: E402
from trainer.trl_engine import HFChatSampler  # noqa: E402
from trainer.trl_rollout import ChatPolicy  # noqa: E402
from trainer.vllm_sampler import VLLMSampler  # noqa: E402
from trainer.waves import Tree, WaveDriver  # noqa: E402


def sampled_tokens(rollouts) -> int:
    """The model's tokens the rollouts sampled: a base's replies, and each branch's from its fork turn on."""
    total = 0
    for ro in rollouts:
        base, *branches = ro.episodes
        trunk = base.steps[-1].data
        total += sum(trunk.mask)
        if branches and base.fork_turn is not None:
            starts = [i for i, m in enumerate(trunk.mask) if m and (i == 0 or not trunk.mask[i - 1])]
            k = starts[base.fork_turn]
            total += sum(sum(b.steps[-1].data.mask[k:]) for b in branches if b.steps)
    return total


def cache_counts(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text

    def value(name: str) -> float:
        m = re.search(rf"^vllm:{name}\S* ([0-9.e+]+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    return value("prefix_cache_hits_total"), value("prefix_cache_queries_total")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=16)
    ap.add_argument("--branches", type=int, default=4)
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server-log", default=None, help="where the vLLM server writes its log (default: a temporary "
                                                           "folder, printed on a failure)")
    args = ap.parse_args()
    chats, tools = demo_chats(CLUE, {"max_turns": 2}, 48)
    model, tok = tiny_policy(chats, tools, steps=max(1, args.sft_steps), max_loss=float("inf"))
    template = get_training_chat_template(tok)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = Path(args.server_log or Path(tmp) / "vllm.log")
        with open(log, "w") as out:
            proc = subprocess.Popen(["./scripts/vllm-serve.sh", tmp, str(port)], cwd=ROOT, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if not wait_http_ok(f"{url}/v1/models", timeout_s=600, proc=proc, log=log):
                print(log.read_text()[-3000:])
                return 1
            vllm = VLLMSampler(url, tmp)
            samplers = {"torch batched": HFChatSampler(), "vLLM server": vllm}
            rates: dict[str, list[float]] = {k: [] for k in samplers}
            hits = queries = 0.0
            for rep in range(args.repeats):
                for name, sampler in samplers.items():
                    envs_ = [ClueProbeEnv(max_turns=3) for _ in range(args.trees)]
                    trees = [Tree(env, ChatPolicy(model, tok, [{"role": "user", "content": PROMPT}],
                                                  env_tools(env, CLUE, s), 1.0, 48, template),
                                  args.branches, [s], random.Random(1000 * rep + s)) for s, env in enumerate(envs_)]
                    before = cache_counts(url) if sampler is vllm else (0.0, 0.0)
                    t0 = time.perf_counter()
                    rollouts = WaveDriver(sampler).trees(trees, "uniform")
                    seconds = time.perf_counter() - t0
                    if sampler is vllm:
                        after = cache_counts(url)
                        hits, queries = hits + after[0] - before[0], queries + after[1] - before[1]
                    n = sampled_tokens(rollouts)
                    rates[name].append(n / seconds)
                    print(f"repeat {rep} {name:14s} {n:6d} tokens in {seconds:6.2f} s: {n / seconds:8.1f} tokens/s",
                          flush=True)
            vllm.close()
        except Exception:
            print("vLLM server log (last 4,000 characters):\n" + log.read_text()[-4000:])
            raise
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(60)
    base = statistics.median(rates["torch batched"])
    print(f"\n{args.trees} trees x {args.branches} episodes, median of {args.repeats}, torch threads "
          f"{torch.get_num_threads()}")
    for name, r in rates.items():
        tag = "(baseline)" if name == "torch batched" else f"x{statistics.median(r) / base:.2f}"
        print(f"{name:14s} {statistics.median(r):8.1f} tokens/s {tag}")
    print(f"vLLM prefix cache: {hits:.0f} of {queries:.0f} prompt tokens served from it "
          f"({100 * hits / max(queries, 1):.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
