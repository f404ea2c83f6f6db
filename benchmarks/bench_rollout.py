"""Rollout sampling speed: the serial loops of trainer/rollout.py (the baseline) against the batched engine
(trainer/text/engine.py), measured in the same run, with where each path's time goes.

Run: ``.venv/bin/python benchmarks/bench_rollout.py [--episodes 16 64] [--big] [--env clueprobe|fileqa]
[--arch tiny|llama] [--threads 1] [--device cpu] [--max-batch 64] [--max-kv-tokens N] [--max-live N] [--env-threads 16]
[--window-step 1] [--repeats 3] [--max-obs-tokens N] [--profile] [--collect N]``.

Setting: ClueProbe (T=4, in-process) or FileQA (4 turns, local sandbox backend, in-process), a fresh model of
``forkyard train --policy lm``'s default size (width 96, 2 layers, 4 heads, context 512, float32; ``--arch
llama``: transformers' Llama of that size) with the BPE tokenizer trained on ClueProbe demonstrations, up to 16
tokens per action, temperature 1, ``torch.set_num_threads(threads)``. For each episode count K: a group rollout
of K episodes and a tree rollout of K/4 bases x 4 branches (uniform fork turns), serial then batched, same
seeds (the engine samples the same episodes: the sampled token counts match). Printed per row: sampled tokens
(the actions' ids), sampled tokens/s and episodes/s of each path (medians of ``--repeats`` interleaved runs),
the ratio batched / serial, and where the median run of each path spent its time, in seconds: ``prefill``
(bringing KV caches up to date: the serial sessions' ``_prefill``, the engine's batched prefill), ``decode``
(sampling the action tokens), ``env`` (env copies, resets, steps, closes) and ``other`` (the rest: the loops'
bookkeeping, fork-turn choices). ``--collect N`` instead times the rollouts of ``forkyard train --policy lm
--n-base 16 --branches 4 --estimator tree --threads 1`` (:func:`trainer.loop.collect`, N iterations, a fresh
model), serial and batched, twice. ``--big`` adds K = 256 (about a minute a row on one thread); ``--profile``
prints the batched path's top 15 functions by own time (cProfile). FileQA: the engine holds one sandbox per
live episode (the serial loop one at a time), so the sandbox pool is raised to 2K + 16
(``FORKYARD_MAX_TOTAL``, unless set). Nothing is asserted; docs/performance.md holds the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.text.engine import ENV_THREADS, RolloutEngine  # noqa: E402
from trainer.loop import make_env  # noqa: E402
from trainer.waves import group_rollout, tree_rollout  # noqa: E402
from trainer.text.text_config import TextTrainConfig  # noqa: E402
from trainer.text.text_policy import SamplingConfig, TextPolicy, TextSession  # noqa: E402
from trainer.text.text_sft import new_model  # noqa: E402

PHASES = ("prefill", "decode", "env", "other")
ENVS = {"clueprobe": ("forkyard/ClueProbe-v0", {"turns": 4}),
        "fileqa": ("forkyard/FileQA-v0", {"max_turns": 4, "backend": "local"})}


def sampled_tokens(ro) -> int:
    """Ids the policy sampled in a rollout (every action's ``action_ids``)."""
    return sum(len(s.data.action_ids) for s in ro.steps)


@contextmanager
def serial_phases(env_cls, seconds: dict[str, float]):
    """Time the serial path's phases into ``seconds`` (wrapping ``TextSession._prefill`` / ``act`` and the env
    class's ``fork`` / ``reset`` / ``step`` / ``close``; decode = ``act`` less the prefill inside it)."""
    saved = {(TextSession, "_prefill"): TextSession._prefill, (TextSession, "act"): TextSession.act}
    saved.update({(env_cls, m): getattr(env_cls, m) for m in ("fork", "reset", "step", "close")})
    inside_act = [0.0]

    def timed(fn, phase):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                seconds[phase] += dt
                if phase == "prefill":
                    inside_act[0] += dt
        return wrapper

    def act(self, rng):
        inside_act[0] = 0.0
        t0 = time.perf_counter()
        try:
            return saved[(TextSession, "act")](self, rng)
        finally:
            seconds["decode"] += time.perf_counter() - t0 - inside_act[0]

    TextSession._prefill = timed(TextSession._prefill, "prefill")
    TextSession.act = act
    for m in ("fork", "reset", "step", "close"):
        setattr(env_cls, m, timed(getattr(env_cls, m), "env"))
    try:
        yield
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)


def run(kind: str, k: int, env, policy, engine, batched: bool) -> tuple[float, int, int, dict[str, float]]:
    """One rollout; returns ``(seconds, sampled tokens, episodes, seconds by phase)``."""
    seeds = list(range(k if kind == "group" else k // 4))
    rng = random.Random(7)
    phases = dict.fromkeys(PHASES, 0.0)
    before = dict(engine.seconds)
    t0 = time.perf_counter()
    if batched:
        if kind == "group":
            ro = engine.group_rollout(env, policy, k, seeds, rng)
        else:
            ro = engine.tree_rollout(env, policy, k // 4, 4, seeds, rng)
        phases.update({p: engine.seconds[p] - before[p] for p in PHASES})
    else:
        with serial_phases(type(env), phases):
            if kind == "group":
                ro = group_rollout(env, policy, k, seeds, rng)
            else:
                ro = tree_rollout(env, policy, k // 4, 4, seeds, rng)
    took = time.perf_counter() - t0
    phases["other"] = took - sum(phases[p] for p in PHASES if p != "other")
    return took, sampled_tokens(ro), len(ro.episodes), phases


def collect_rate(iterations: int) -> None:
    """Sampled tokens/s of the rollouts of ``forkyard train --policy lm --n-base 16 --branches 4 --estimator tree
    --threads 1`` (its config's defaults otherwise: ClueProbe, 4 turns, a fresh model), through
    :func:`trainer.loop.collect` as training calls it, serial then batched, twice, ``iterations`` each."""
    from trainer.loop import collect
    from trainer.text.text_train import PPOTextPolicy

    for sampler in ("serial", "batched", "serial", "batched"):
        cfg = TextTrainConfig(n_base=16, branches=4, estimator="tree", threads=1, sampler=sampler)
        policy = PPOTextPolicy.from_config(new_model(cfg), cfg)
        env = make_env(cfg.env_id, cfg.env_options())
        tokens, seconds = 0, 0.0
        for it in range(iterations):
            t0 = time.perf_counter()
            ro, _ = collect(cfg, env, policy, random.Random(it), it, None)
            seconds += time.perf_counter() - t0
            tokens += sampled_tokens(ro)
        env.close()
        print(f"collect, {sampler}: {tokens / seconds:.0f} sampled tokens/s ({tokens} tokens in {seconds:.2f} s)",
              flush=True)


def split(phases: dict[str, float]) -> str:
    return "/".join(f"{phases[p]:.2f}" for p in PHASES)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--big", action="store_true", help="add 256 episodes")
    ap.add_argument("--env", default="clueprobe", choices=tuple(ENVS))
    ap.add_argument("--arch", default="tiny", choices=("tiny", "llama"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-kv-tokens", type=int, default=None, help="the engine's KV-slot cap of a wave")
    ap.add_argument("--max-live", type=int, default=None, help="the engine's cap on episodes live at once")
    ap.add_argument("--env-threads", type=int, default=ENV_THREADS, help="worker threads of a blocking env's calls")
    ap.add_argument("--window-step", type=int, default=1, help="SamplingConfig.window_step (both paths)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of each path; medians are printed")
    ap.add_argument("--max-obs-tokens", type=int, default=None,
                    help="cut observations to this many tokens (less prefill per turn)")
    ap.add_argument("--collect", type=int, default=0, metavar="ITERATIONS",
                    help="instead: time the train command's rollouts (trainer.loop.collect) over this many iterations")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.collect:
        collect_rate(args.collect)
        return 0
    cfg = TextTrainConfig(arch=args.arch, device=args.device)  # its default env: ClueProbe, 4 turns
    model = new_model(cfg).eval()
    policy = TextPolicy(model, model.tokenizer, SamplingConfig(max_new_tokens=16, max_obs_tokens=args.max_obs_tokens,
                                                               window_step=args.window_step))
    env_id, env_kwargs = ENVS[args.env]
    counts = args.episodes + ([256] if args.big else [])
    if args.env == "fileqa":  # the engine holds a sandbox per live episode (and per tree checkpoint), + the env's
        os.environ.setdefault("FORKYARD_MAX_TOTAL", str(2 * max(counts) + 16))
    env = make_env(env_id, env_kwargs)  # the serial path's; the engine copies its own from a fresh one, as in
    fresh = make_env(env_id, env_kwargs)  # training (a FileQA env that holds a sandbox would have it cloned per copy)
    engine = RolloutEngine(args.max_batch, args.max_kv_tokens, args.env_threads, args.max_live)
    run("tree", 8, env, policy, engine, False)  # warm-up
    run("tree", 8, fresh, policy, engine, True)
    print(f"{args.env}, arch {args.arch}, device {args.device}, threads {args.threads}, max_batch {args.max_batch}, "
          f"max_kv_tokens {args.max_kv_tokens}, max_live {args.max_live}, env_threads {args.env_threads}, "
          f"window_step {args.window_step}, "
          f"max_obs_tokens {args.max_obs_tokens}, medians of {args.repeats}")
    print(f"{'rollout':<6} {'K':>4} {'tokens':>7} {'serial tok/s':>13} {'batched tok/s':>14} "
          f"{'serial ep/s':>12} {'batched ep/s':>13} {'ratio':>6}  seconds prefill/decode/env/other: serial | batched")
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
                batched.append(run(kind, k, fresh, policy, engine, True))
                if args.profile:
                    prof.disable()
                    pstats.Stats(prof).sort_stats("tottime").print_stats(15)
            ts, ns, es, ps = sorted(serial, key=lambda r: r[0])[len(serial) // 2]
            tb, nb, eb, pb = sorted(batched, key=lambda r: r[0])[len(batched) // 2]
            note = "" if ns == nb else f"  (token counts differ: {ns} vs {nb})"
            print(f"{kind:<6} {k:>4} {nb:>7} {ns / ts:>13.0f} {nb / tb:>14.0f} {es / ts:>12.1f} {eb / tb:>13.1f} "
                  f"{ts / tb:>5.1f}x  {split(ps)} | {split(pb)}{note}", flush=True)
    env.close()
    fresh.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
