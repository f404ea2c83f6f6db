"""ClueProbe throughput in-process: env steps/s and fork(4)/s, against ``copy.deepcopy`` of the env.

Run: ``.venv/bin/python benchmarks/bench_envs.py [--seconds S]``. Prints figures and ratios measured
in the same run; nothing is asserted (machines here are noisy).
"""

from __future__ import annotations

import argparse
import copy
import time

import gymnasium as gym

import envs  # noqa: F401


def _rate(fn, seconds: float) -> float:
    """Calls of ``fn`` per second over about ``seconds`` seconds (best of 3 equal slices)."""
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds / 3:
            for _ in range(50):
                fn()
            n += 50
        best = max(best, n / elapsed)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.5, help="time per measurement")
    args = parser.parse_args(argv)

    env = gym.make("forkyard/ClueProbe-v0", max_turns=5).unwrapped
    env.reset(seed=0)

    def one_step():
        if env.done:
            env.reset()
        env.step("probe(0)" if env.turn < 4 else "answer(0)")

    raw = gym.make("forkyard/ClueProbe-v0", max_turns=5)  # with Gymnasium's checker and order wrappers
    raw.reset(seed=0)
    done = {"d": False}

    def wrapped_step():
        if done["d"]:
            raw.reset()
        _, _, te, tr, info = raw.step("probe(0)" if raw.unwrapped.turn < 4 else "answer(0)")
        done["d"] = te or tr

    env.reset(seed=0)
    env.step("probe(1)")
    steps = _rate(one_step, args.seconds)
    wsteps = _rate(wrapped_step, args.seconds)
    env.reset(seed=0)
    env.step("probe(1)")
    forks = _rate(lambda: env.fork(4), args.seconds)
    deep = _rate(lambda: [copy.deepcopy(env) for _ in range(4)], args.seconds)
    snap = _rate(lambda: env.restore(env.snapshot()), args.seconds)

    print("ClueProbe-v0 (max_turns=5, bits=3), in-process, one core")
    print(f"  step (bare env, reset every 5 steps):      {steps:>12,.0f} steps/s")
    print(f"  step (gymnasium.make wrappers):            {wsteps:>12,.0f} steps/s")
    print(f"  fork(4):                                   {forks:>12,.0f} forks/s  ({1e6 / forks:.1f} us each)")
    print(f"  baseline 4 x copy.deepcopy(env):           {deep:>12,.0f} /s        ({1e6 / deep:.1f} us each)")
    print(f"  ratio fork(4) / deepcopy x4:               {forks / deep:>12.1f}x faster")
    print(f"  snapshot() + restore():                    {snap:>12,.0f} /s        ({1e6 / snap:.1f} us each)")


if __name__ == "__main__":
    main()
