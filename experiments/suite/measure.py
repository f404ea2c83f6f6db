"""The measured columns of docs/envs.md, for every registered forkyard env: random and scripted-demonstrator
success, and the share of singleton anchors under random play at G=16, under two anchor keys.

Run: ``.venv/bin/python experiments/suite/measure.py [--episodes 100] [--tasks 16] [--out experiments/suite/envs.json]
[--only ID ...]``. Writes one JSON record per env (the raw figures) and prints the markdown table that docs/envs.md
holds. Envs run in-process with their registered defaults (sandboxed ones on the local backend).

Definitions (the same as the trainer's, so the figures read like the granularity study's):

* **success**: the share of episodes whose end ``info["episode_metrics"]["success"]`` is 1 where the env reports it,
  else whose summed reward is > 0. 95% Wilson interval over ``--episodes`` held-out seeds (100000 + i).
* **random**: a uniformly random action of ``info["legal_actions"]`` each turn; **demo**: ``env.demo_action(rng,
  skill=1.0)`` (the env's best scripted play from visible state).
* **singleton anchors at G=16**: for each of ``--tasks`` tasks (seed ``200000 + t``), 16 episodes of random play
  from the same seed, as a GRPO group of independent rollouts. Every step is keyed by the state it acted in and
  grouped within its task; the figure is the share of anchor groups that hold one step (the trainer's
  ``degeneration``, :func:`trainer.estimators.anchor_stats`), averaged over tasks. Two keys: ``history``, the
  visible history (forkyard's ``info["anchor_key"]``, the reference article's key) and ``state``, the current
  state alone (``info["state_key"]``: the observation without its turn line, a board game's board; GiGPO's anchor
  state, arXiv 2505.10978). Where states recur (the same observation reached by
  different paths), the ``state`` key groups more than the ``history`` key; a singleton share near 100% under
  both means only forks make siblings there.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import gymnasium as gym

from gymnasium.envs.registration import load_env_creator

import envs
from envs.registry import env_spec, forkyard_specs

G = 16


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial share ``k / n`` (``(0, 1)`` when ``n == 0``)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def _success(total: float, info: dict[str, Any]) -> bool:
    metrics = info.get("episode_metrics") or {}
    if "success" in metrics:
        return bool(metrics["success"])
    return total > 0


def play(env: Any, seed: int, rng: random.Random, demo: bool) -> tuple[bool, list[tuple[str, str]], int]:
    """One episode; returns (success, [(history key, state key) per step], steps)."""
    obs, info = env.reset(seed=seed)
    keys, total, steps = [], 0.0, 0
    while not env.done:
        keys.append((info["anchor_key"], info["state_key"]))
        action = env.demo_action(rng, skill=1.0) if demo else rng.choice(info["legal_actions"])
        obs, r, _te, _tr, info = env.step(action)
        total += r
        steps += 1
    return _success(total, info), keys, steps


def singleton_share(groups: list[list[str]]) -> float:
    """Mean over task groups of the share of keys seen once within the group."""
    shares = []
    for keys in groups:
        sizes = Counter(keys).values()
        shares.append(sum(1 for s in sizes if s == 1) / len(sizes) if sizes else 0.0)
    return sum(shares) / len(shares) if shares else 0.0


def measure(env_id: str, episodes: int, tasks: int) -> dict[str, Any]:
    """Every figure for one env (a JSON-able record)."""
    kwargs = {"backend": "local"} if load_env_creator(env_spec(env_id).entry_point).uses_sandbox else {}
    env = gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped
    try:
        rec: dict[str, Any] = {"env_id": env_id, "episodes": episodes, "tasks": tasks, "group": G}
        t0 = time.perf_counter()
        for name, demo in (("random", False), ("demo", True)):
            if demo and not isinstance(env, envs.Demonstrator):
                continue
            rng = random.Random(f"{env_id}/{name}")
            wins, steps = 0, 0
            for i in range(episodes):
                ok, _, n = play(env, 100_000 + i, rng, demo)
                wins += ok
                steps += n
            lo, hi = wilson(wins, episodes)
            rec[name] = {"success": wins / episodes, "ci95": [lo, hi], "mean_turns": steps / episodes}
        hist, state = [], []
        rng = random.Random(f"{env_id}/groups")
        for t in range(tasks):
            h, s = [], []
            for _ in range(G):
                _, keys, _ = play(env, 200_000 + t, rng, False)
                h += [k[0] for k in keys]
                s += [k[1] for k in keys]
            hist.append(h)
            state.append(s)
        rec["singleton_history"] = singleton_share(hist)
        rec["singleton_state"] = singleton_share(state)
        rec["seconds"] = time.perf_counter() - t0
        return rec
    finally:
        env.close()


def table(records: list[dict[str, Any]]) -> str:
    """The markdown table of docs/envs.md's measured columns."""
    lines = ["| env | random success | demonstrator success | singleton anchors, history key | "
             "singleton anchors, state key |", "|---|---|---|---|---|"]
    def cell(r: dict[str, Any], name: str) -> str:
        if name not in r:
            return "n/a"
        s = r[name]
        return f"{100 * s['success']:.0f}% ({100 * s['ci95'][0]:.0f}-{100 * s['ci95'][1]:.0f})"

    for r in records:
        lines.append(f"| `{r['env_id']}` | {cell(r, 'random')} | {cell(r, 'demo')} | "
                     f"{100 * r['singleton_history']:.0f}% | {100 * r['singleton_state']:.0f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--only", nargs="*", default=None, help="env ids (default: every registered forkyard env)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("envs.json")))
    args = ap.parse_args(argv)
    ids = args.only or list(forkyard_specs())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {r["env_id"]: r for r in json.loads(out.read_text())} if out.exists() else {}
    for env_id in ids:
        print(f"measuring {env_id} ...", file=sys.stderr, flush=True)
        done[env_id] = measure(env_id, args.episodes, args.tasks)
        out.write_text(json.dumps(sorted(done.values(), key=lambda r: r["env_id"]), indent=1) + "\n")  # resumable
    print(table([done[i] for i in ids]))


if __name__ == "__main__":
    main()
