"""The serial rollout loops forkyard had before its one wave driver (trainer/waves.py), kept here as the tests' oracle:
one env reused, one episode after another, one action at a time, written without the driver's waves, cohorts, env
copies or samplers. tests/trainer/test_waves.py holds the driver (every sampler, batch size, cap, with and without
copies) to these episodes."""

from __future__ import annotations

import random

from trainer.rollout import (FORK_SELECTIONS, Actor, Episode, ForkTurn, PolicySession, Rollout, _Counter,
                             given_streams, record_outcome, spread_branches, stream)
from envs.core import EnvInfraError


def _step(env, session: PolicySession, ep: Episode, rng: random.Random, counter: _Counter) -> bool:
    """Take one action. Returns True when the episode has ended."""
    step = session.act(rng)
    ep.steps.append(step)
    counter.env_calls += 1
    try:
        obs, reward, terminated, truncated, info = env.step(step.action)
    except EnvInfraError:
        ep.infra_failure, ep.reason = True, "infra_error"
        return True
    if record_outcome(ep, reward, terminated, truncated, info):
        return True
    session.observe(obs, info)
    return False


def _start(env, policy: Actor, ep: Episode) -> PolicySession | None:
    """Reset ``env`` with the episode's seed and open a policy session; None (and ``ep`` marked lost)
    when the reset failed through the infrastructure."""
    try:
        obs, info = env.reset(seed=ep.seed)
    except EnvInfraError:
        ep.infra_failure, ep.reason = True, "infra_error"
        return None
    return policy.session(obs, info)


def serial_group_rollout(env, policy: Actor, group_size: int, seeds: list[int], rng: random.Random | None,
                  stream_seeds: list[int] | None = None) -> Rollout:
    """G independent episodes of one env configuration, episode i reset with ``seeds[i]``.

    Args:
        env: a forkyard env (reused: reset before each episode).
        policy: the sampling policy.
        group_size: G >= 1.
        seeds: [G] reset seeds (each episode its own hidden state).
        rng: the rollout's RNG: one stream seed per episode is drawn from it (module docstring).
        stream_seeds: [G] 64-bit stream seeds used instead of drawing them from ``rng`` (:func:`given_streams`).

    Raises:
        ValueError: if ``len(seeds) != group_size`` or ``stream_seeds`` is given without G seeds.
    """
    if len(seeds) != group_size:
        raise ValueError(f"{len(seeds)} seeds for a group of {group_size}")
    counter = _Counter()
    episodes = []
    for seed, stream_seed in zip(seeds, given_streams(rng, group_size, stream_seeds), strict=True):
        ep = Episode(seed=seed)
        episodes.append(ep)
        session = _start(env, policy, ep)
        ep_rng = stream(stream_seed)
        while session is not None and not _step(env, session, ep, ep_rng, counter):
            pass
    return Rollout("group", episodes, counter.env_calls, counter.forks, counter.forks_failed)


def serial_tree_rollout(
    env,
    policy: Actor,
    n_base: int,
    branches: int,
    seeds: list[int],
    rng: random.Random | None,
    fork_selection: str = "uniform",
    stream_seeds: list[int] | None = None,
) -> Rollout:
    """Tree-fork rollout: ``n_base`` base episodes, each forked once into ``branches`` branches in total.

    For each base: run the episode; at the chosen fork turn t, fork the env (and the policy session)
    and run ``branches - 1`` new branches from that state to the end, each sampling its own action at
    turn t. The base's own continuation is branch 0. Fork-turn selection:

    * ``uniform``: t uniform over the turns the base actually took (reservoir sampling: at turn t a
      fork replaces the kept one with probability 1/(t+1)), so episodes of unknown length work;
    * ``entropy``: t is the turn where the policy's action entropy was highest on the base's path
      (earliest on ties), as ARPO (arXiv:2507.19849) branches where the policy is uncertain; a fork
      is kept at each new maximum.

    Episodes are returned in order: base 0, its branches 1..m-1, base 1, ... Each branch's
    ``steps`` start at the fork turn; its ``reward`` includes the base's prefix rewards. Base b samples (and
    draws its uniform fork turn) from ``stream(s_b)``, its branch j from ``stream(s_b, j)``, ``s_b`` the b-th of
    :func:`episode_seeds` of ``rng``, or ``stream_seeds[b]`` when given (:func:`given_streams`).

    A fork that raises :class:`~envs.core.EnvInfraError` loses only the branches it would have started;
    the base and every other fork run on. Such branches are returned as episodes with no steps,
    ``infra_failure=True``, ``reason="infra_error"`` and the ``fork_turn`` of the failed fork, and are
    counted in :attr:`Rollout.forks_failed` / :attr:`Rollout.branches_lost`. If the checkpoint fork of
    a base failed (all its new branches lost), the base keeps ``fork_turn=None``: nothing branched from
    it, so its whole episode trains as a prefix. If only the fork that spreads the checkpoint into
    branches 2..m-1 failed, branch 1 still runs.

    Raises:
        ValueError: on bad sizes (``stream_seeds`` included) or an unknown ``fork_selection``.
    """
    if fork_selection not in FORK_SELECTIONS:
        raise ValueError(f"fork_selection must be one of {FORK_SELECTIONS}, got {fork_selection!r}")
    if n_base < 1 or branches < 1 or len(seeds) != n_base:
        raise ValueError(f"need n_base >= 1, branches >= 1 and n_base seeds; got {n_base}, {branches}, {len(seeds)}")
    counter = _Counter()
    episodes: list[Episode] = []
    lost = 0
    stream_seeds = given_streams(rng, n_base, stream_seeds)
    for b, seed in enumerate(seeds):
        base_rng = stream(stream_seeds[b])
        base = Episode(seed=seed, base=b, branch=0)
        session = _start(env, policy, base)
        if session is None:
            episodes.append(base)
            continue
        choice = ForkTurn(fork_selection, branches)
        turn = 0
        done = False
        while not done:
            choice.consider(turn, base_rng, session.entropy, env, session, base.reward, counter)
            done = _step(env, session, base, base_rng, counter)
            turn += 1
        episodes.append(base)
        branch_eps, starts, n_lost = spread_branches(base, choice.checkpoint, branches, stream_seeds[b], counter)
        episodes += branch_eps
        lost += n_lost
        for start in starts:
            while not _step(start.env, start.session, start.episode, start.rng, counter):
                pass
            start.env.close()
    return Rollout("tree", episodes, counter.env_calls, counter.forks, counter.forks_failed, lost)
