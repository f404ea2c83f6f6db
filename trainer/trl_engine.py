"""Batched sampling for TRL's tree-fork ``rollout_func``: every live session of a wave advances together.

:func:`sample_rows` samples one reply for each of B token contexts with a Hugging Face causal LM: one
batched prefill of the left-padded contexts (attention mask, per-row position ids), then one batched forward
per token over the rows still generating (their KV caches in the model's own cache object; a row that stops,
at a stop id, :func:`trainer.stops.stop_ids`, or after ``max_new_tokens``, leaves the batch). Each row draws
its tokens from its own ``random.Random`` stream, one ``rng.random()`` per token, by the inverse CDF of the
tempered softmax (no top-k, no top-p), so a row's tokens depend on its context and its stream alone, not on
the rows beside it: one row at a time (:meth:`trainer.trl_rollout.ChatPolicy.sample`, the serial path) and a
batch give the same token ids for the same seeds; padding changes only the reduction order of float sums
(tested on CPU in float32, ``tests/integrations/test_trl.py``: ids equal, log-probs within 5e-5; measured 3e-6
to 1.2e-5 on the tiny test model, whose logits of size ~10 differ by about 1e-6 relative under SDPA attention).

:func:`group_rollouts` and :func:`tree_rollouts` run the group and tree rollouts of
:mod:`trainer.rollout` (one :class:`~trainer.rollout.Rollout` per group or tree, equal to what
:func:`~trainer.rollout.group_rollout` / :func:`~trainer.rollout.tree_rollout` with one base return for the
same seeds) for many groups at once, in waves of at most ``max_batch`` sessions: each wave samples its
actions with :func:`sample_rows`, then its env steps run. Every episode samples from its stream
(:func:`trainer.rollout.stream`), a tree's fork-turn draws come from its base's stream before the action's
draws, and entropy fork selection reads the prefill's first-token distribution, as the serial loop's
``session.entropy()`` does. A group's episodes run on copies of its env (``env.fork(G)``, each reset with
its seed; not counted in :attr:`Rollout.forks`, which counts the tree's forks as the serial loop does); a
tree's base runs on the env itself.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Any, Callable, Collection

import torch

from envs.core import INFRA_FAILURE_REASONS, EnvInfraError
from trainer.rollout import (EPISODE_METRICS, FORK_SELECTIONS, Episode, ForkTurn, Rollout, Step, _Counter,
                             episode_seeds, spread_branches, stream)

#: Default cap on the sessions sampled in one batched forward.
MAX_BATCH = 64

#: ``(new token ids up to and including the stop id, their log-probs, first-token entropy in nats)`` of one reply.
Reply = tuple[list[int], list[float], float]


def draw(logp: torch.Tensor, rngs: list[random.Random]) -> list[int]:
    """One token per row of ``logp`` [B, V] (float log-probs of the sampling distribution), row b by the
    inverse CDF at ``rngs[b].random()``: the first index whose cumulative probability exceeds u times the
    total. One draw from each stream, in row order."""
    cdf = logp.exp().cumsum(-1)
    u = torch.tensor([r.random() for r in rngs], dtype=torch.float64, device=cdf.device)
    target = (u * cdf[:, -1].double()).to(cdf.dtype)
    j = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
    return j.clamp(max=logp.shape[1] - 1).tolist()


def _cache(out: Any) -> Any:
    """The KV cache of a forward's output (``cache``, or ``past_key_values`` before transformers 5)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.no_grad()
def sample_rows(model: Any, contexts: list[list[int]], rngs: list[random.Random], temperature: float,
                max_new_tokens: int, stops: Collection[int], pad_id: int,
                before_draw: Callable[[int, float], None] | None = None) -> list[Reply]:
    """One reply per context, sampled together (module docstring).

    Args:
        model: a ``transformers`` causal LM in eval mode (its parameters' device is used).
        contexts: [B] token ids (each non-empty).
        rngs: [B] each row's stream; row b takes one ``random()`` per sampled token.
        temperature: > 0; the sampling distribution is ``softmax(logits / temperature)`` in float32.
        max_new_tokens: most tokens of a reply (>= 1).
        stops: the ids that end a reply (:func:`trainer.stops.stop_ids`: the tokenizer's EOS and every id of the
            model's generation config, field case S50); the first one sampled is kept in the reply, which ends.
        pad_id: the left padding's token (masked out).
        before_draw: called as ``before_draw(b, entropy)`` for every row after the prefill, before any token
            is drawn (entropy in nats of the first token's distribution): a tree's fork-turn choice, which may
            draw from the row's stream first as the serial loop does.

    Returns:
        [B] ``(ids, logps, entropy)``: the reply's ids (its stop id included when the model ended it), each id's
        log-prob under the sampling distribution (natural log), the first token's entropy.
    """
    device = next(model.parameters()).device
    stops = frozenset(stops)
    lens = [len(c) for c in contexts]
    width = max(lens)
    ids = torch.tensor([[pad_id] * (width - n) + c for n, c in zip(lens, contexts, strict=True)], device=device)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lens], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    # transformers 5 names the cache argument and output ``cache`` (``past_key_values`` before, deprecated since)
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache, logits = _cache(out), out.logits[:, -1].float()
    nxt = torch.tensor(lens, device=device)  # each row's next position
    rows = list(range(len(contexts)))  # the context of each batch row
    gens: list[list[int]] = [[] for _ in contexts]
    logps: list[list[float]] = [[] for _ in contexts]
    entropies = [0.0] * len(contexts)
    for n in range(max_new_tokens):
        logp = torch.log_softmax(logits / temperature, dim=-1)
        if n == 0:
            entropies = (-(logp.exp() * logp).sum(-1)).tolist()
            if before_draw is not None:
                for b in rows:
                    before_draw(b, entropies[b])
        picks = draw(logp, [rngs[a] for a in rows])
        picked = logp.gather(1, torch.tensor(picks, device=device)[:, None]).squeeze(1).tolist()
        keep = []
        for b, a in enumerate(rows):
            gens[a].append(picks[b])
            logps[a].append(picked[b])
            if picks[b] not in stops and n + 1 < max_new_tokens:
                keep.append(b)
        if not keep:
            break
        if len(keep) < len(rows):  # stopped rows leave the batch
            sel = torch.tensor(keep, device=device)
            cache.batch_select_indices(sel)
            mask, nxt = mask[sel], nxt[sel]
            rows, picks = [rows[b] for b in keep], [picks[b] for b in keep]
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], 1)
        out = model(input_ids=torch.tensor(picks, device=device)[:, None], attention_mask=mask,
                    position_ids=nxt[:, None], use_cache=True, **{key: cache})
        cache, logits = _cache(out), out.logits[:, -1].float()
        nxt = nxt + 1
    return [(g, lp, e) for g, lp, e in zip(gens, logps, entropies, strict=True)]


@dataclass
class Group:
    """One group to play: :func:`trainer.rollout.group_rollout`'s arguments."""

    env: Any
    policy: Any
    group_size: int
    seeds: list[int]
    rng: random.Random


@dataclass
class Tree:
    """One tree to play: :func:`trainer.rollout.tree_rollout`'s arguments with one base."""

    env: Any
    policy: Any
    branches: int
    seed: int
    rng: random.Random


@dataclass
class _Row:
    """One live episode branch: its env (closed when it ends unless ``own_env`` is False), session, episode,
    stream and its rollout's counter."""

    env: Any
    session: Any
    ep: Episode
    rng: random.Random
    counter: _Counter
    own_env: bool = True
    done: bool = False
    turn: int = 0
    fork: ForkTurn | None = None  # a tree base's fork-turn choice (its checkpoint)


def _apply_step(row: _Row, step: Step) -> None:
    """``env.step`` of ``step`` for ``row``, recorded as :func:`trainer.rollout._step` records it."""
    ep = row.ep
    ep.steps.append(step)
    row.counter.env_calls += 1
    row.turn += 1
    try:
        obs, reward, terminated, truncated, info = row.env.step(step.action)
    except EnvInfraError:
        ep.infra_failure, ep.reason, row.done = True, "infra_error", True
        return
    ep.reward += reward
    ep.invalid_actions += bool(info.get("invalid_action"))
    if terminated or truncated:
        ep.reason = info.get("termination_reason")
        ep.infra_failure = ep.reason in INFRA_FAILURE_REASONS
        ep.env_metrics = info.get(EPISODE_METRICS)
        row.done = True
        return
    row.session.observe(obs, info)


def _run(rows: list[_Row], max_batch: int, before_draw: Callable[[_Row, float], None] | None = None) -> None:
    """Advance ``rows`` in waves of at most ``max_batch`` until every episode has ended. Every session's
    policy must share one model and its sampling settings (the first row's ``policy.sample_many`` samples the
    whole wave)."""
    live = [r for r in rows if not r.done]
    while live:
        for i in range(0, len(live), max_batch):
            wave = live[i:i + max_batch]
            hook = None if before_draw is None else (lambda b, e, wave=wave: before_draw(wave[b], e))
            replies = wave[0].session.policy.sample_many([r.session.ids for r in wave], [r.rng for r in wave],
                                                         hook)
            for r, reply in zip(wave, replies, strict=True):
                _apply_step(r, r.session.record(*reply))
        for r in live:
            if r.done and r.own_env:
                r.env.close()
        live = [r for r in live if not r.done]


def _reset(env: Any, ep: Episode, policy: Any) -> Any:
    """``env.reset(seed=ep.seed)`` and the policy's session; None (``ep`` marked lost) when the env is None (its
    copy failed) or the reset failed through the infrastructure."""
    if env is not None:
        try:
            obs, info = env.reset(seed=ep.seed)
            return policy.session(obs, info)
        except EnvInfraError:
            pass
    ep.infra_failure, ep.reason = True, "infra_error"
    return None


def group_rollouts(groups: list[Group], max_batch: int = MAX_BATCH) -> list[Rollout]:
    """:func:`trainer.rollout.group_rollout` of every group in ``groups``, their episodes sampled together.

    Returns:
        one :class:`Rollout` per group, in order.

    Raises:
        ValueError: a group whose ``len(seeds) != group_size``.
    """
    rollouts, rows = [], []
    for grp in groups:
        if len(grp.seeds) != grp.group_size:
            raise ValueError(f"{len(grp.seeds)} seeds for a group of {grp.group_size}")
        counter = _Counter()
        episodes = [Episode(seed=s) for s in grp.seeds]
        try:
            copies = grp.env.fork(grp.group_size)
        except EnvInfraError:
            copies = [None] * grp.group_size
        for ep, env, s in zip(episodes, copies, episode_seeds(grp.rng, grp.group_size), strict=True):
            session = _reset(env, ep, grp.policy)
            if session is not None:
                rows.append(_Row(env, session, ep, stream(s), counter))
            elif env is not None:
                env.close()
        rollouts.append((episodes, counter))
    _run(rows, max_batch)
    return [Rollout("group", eps, c.env_calls, c.forks, c.forks_failed) for eps, c in rollouts]


def tree_rollouts(trees: list[Tree], fork_selection: str = "uniform", max_batch: int = MAX_BATCH) -> list[Rollout]:
    """:func:`trainer.rollout.tree_rollout` with one base of every tree in ``trees``: the bases sampled
    together, then every tree's branches together (each from its base's session and env at the fork turn).

    Returns:
        one :class:`Rollout` per tree, in order (episodes: the base, then its branches 1..m-1).

    Raises:
        ValueError: an unknown ``fork_selection`` or ``branches < 1``.
    """
    if fork_selection not in FORK_SELECTIONS:
        raise ValueError(f"fork_selection must be one of {FORK_SELECTIONS}, got {fork_selection!r}")
    if any(t.branches < 1 for t in trees):
        raise ValueError("need branches >= 1")
    counters = [_Counter() for _ in trees]
    seeds = [episode_seeds(t.rng, 1)[0] for t in trees]
    bases = [Episode(seed=t.seed, base=0, branch=0) for t in trees]
    rows: dict[int, _Row] = {}
    for k, (t, base) in enumerate(zip(trees, bases, strict=True)):
        session = _reset(t.env, base, t.policy)
        if session is not None:
            rows[k] = _Row(t.env, session, base, stream(seeds[k]), counters[k], own_env=False)
    branches = {id(r): trees[k].branches for k, r in rows.items()}

    def before_draw(row: _Row, entropy: float) -> None:  # the one fork-turn choice (trainer.rollout.ForkTurn)
        if row.fork is None:
            row.fork = ForkTurn(fork_selection, branches[id(row)])
        row.fork.consider(row.turn, row.rng, lambda: entropy, row.env, row.session, row.ep.reward, row.counter)

    _run(list(rows.values()), max_batch, before_draw)
    episodes: list[list[Episode]] = [[b] for b in bases]
    lost = [0] * len(trees)
    branch_rows = []
    for k, row in rows.items():
        checkpoint = row.fork.checkpoint if row.fork is not None else None
        branch_eps, starts, lost[k] = spread_branches(bases[k], checkpoint, trees[k].branches, seeds[k], counters[k])
        episodes[k] += branch_eps
        branch_rows += [_Row(st.env, st.session, st.episode, st.rng, counters[k], turn=checkpoint.turn)
                        for st in starts if checkpoint is not None]
    _run(branch_rows, max_batch)
    return [Rollout("tree", eps, c.env_calls, c.forks, c.forks_failed, n)
            for eps, c, n in zip(episodes, counters, lost, strict=True)]


__all__ = ["MAX_BATCH", "Group", "Reply", "Tree", "draw", "group_rollouts", "sample_rows", "tree_rollouts"]
