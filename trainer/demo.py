"""A short demonstration of the fork API on ClueProbe, for newcomers (``forkyard demo``)."""

from __future__ import annotations

import random

import gymnasium as gym

import envs  # noqa: F401  (registers the forkyard ids)


def run_demo(max_turns: int = 4, seed: int = 0, branches: int = 4, episodes: int = 2000) -> None:
    """Play one ClueProbe episode to a fork point, fork it into ``branches`` siblings, finish each
    sibling with a different action, and compare random play with the oracle over ``episodes`` episodes.
    Prints to stdout; takes well under a second."""
    env = gym.make("forkyard/ClueProbe-v0", max_turns=max_turns).unwrapped
    obs, info = env.reset(seed=seed)
    print("== One episode of forkyard/ClueProbe-v0 (max_turns=%d) ==" % max_turns)
    print(obs)
    action = "probe(0)"
    obs, reward, terminated, truncated, info = env.step(action)
    print(f"\n> {action}\n{obs}")
    print(f"\nanchor_key={info['anchor_key']}  legal_actions={info['legal_actions']}")

    print(f"\n== fork({branches}) at turn {info['turn']}: {branches} independent copies, same hidden target ==")
    rng = random.Random(seed)
    for i, child in enumerate(env.fork(branches)):
        steps = []
        while not child.done:
            a = child.oracle_action() if i % 2 == 0 else rng.choice(child.current_info()["legal_actions"])
            o, r, te, tr, inf = child.step(a)
            steps.append(a)
        who = "oracle" if i % 2 == 0 else "random"
        print(f"branch {i} ({who:6s}): {' -> '.join(steps):60s} reward={r:.0f}  ({o.splitlines()[0]})")
    print(f"parent is untouched: still at turn {env.turn} with history {[a for a, _ in env.history]}")

    snap = env.snapshot()
    restored = gym.make("forkyard/ClueProbe-v0", max_turns=max_turns).unwrapped
    restored.restore(snap.to_bytes())
    print(f"\nsnapshot: {len(snap.to_bytes())} bytes of JSON; restored env at turn {restored.turn}, "
          f"same anchor: {restored.current_info()['anchor_key'] == info['anchor_key']}")

    optimum = min(1.0, 2 ** (max_turns - 1) / 8)
    print(f"\n== {episodes} seeded episodes per policy (optimum at T={max_turns}: {optimum:.2f}) ==")
    for name in ("random", "oracle"):
        wins = 0.0
        for ep in range(episodes):
            env.reset(seed=ep)
            while not env.done:
                legal = env.current_info()["legal_actions"]
                a = env.oracle_action() if name == "oracle" else rng.choice(legal)
                _, r, _, _, _ = env.step(a)
            wins += r
        print(f"{name:6s} policy: success rate {wins / episodes:.3f}")
