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

:class:`HFChatSampler` is that sampling as a :class:`trainer.waves.Sampler`; :func:`group_rollouts` and
:func:`tree_rollouts` run the group and tree rollouts of :mod:`trainer.rollout` for many groups at once through the
one wave driver (:class:`trainer.waves.WaveDriver`): one :class:`~trainer.rollout.Rollout` per group or tree, equal
to what :func:`~trainer.waves.group_rollout` / :func:`~trainer.waves.tree_rollout` with one base return for the
same seeds. Entropy fork selection reads the prefill's first-token distribution, as the serial loop's
``session.entropy()`` does.
"""

from __future__ import annotations

import inspect
import random
import time
from typing import Any, Callable, Collection

import torch

from trainer.rollout import Rollout, Step
from trainer.waves import MAX_BATCH, BeforeDraw, Group, Row, Tree, WaveDriver

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


class HFChatSampler:
    """:func:`sample_rows` as a :class:`trainer.waves.Sampler` of :class:`trainer.trl_rollout.ChatSession` rows: a
    wave's replies sampled together by the first row's ``policy.sample_many`` (every row's policy shares one model
    and its sampling settings), each recorded into its session. The fork-turn hook gets the prefill's first-token
    entropy. ``slots(row)``: its context plus ``max_new_tokens``."""

    def __init__(self) -> None:
        self.seconds = {"decode": 0.0}

    def sample(self, rows: list[Row], before_draw: BeforeDraw | None) -> list[Step]:
        """Each row's reply, sampled together by :func:`sample_rows` (:class:`trainer.waves.Sampler`)."""
        t0 = time.perf_counter()
        hook = None if before_draw is None else (lambda b, e: before_draw(rows[b], lambda: e))
        replies = rows[0].session.policy.sample_many([r.session.ids for r in rows], [r.rng for r in rows], hook)
        out = [r.session.record(*reply) for r, reply in zip(rows, replies, strict=True)]
        self.seconds["decode"] += time.perf_counter() - t0
        return out

    def slots(self, row: Row) -> int:
        """KV-cache slots the row holds at the end of its reply: its context plus ``max_new_tokens``."""
        return len(row.session.ids) + row.session.policy.max_new_tokens


def group_rollouts(groups: list[Group], max_batch: int = MAX_BATCH) -> list[Rollout]:
    """:func:`trainer.waves.group_rollout` of every group in ``groups``, their episodes sampled together
    (:meth:`trainer.waves.WaveDriver.groups` over :class:`HFChatSampler`). Returns one :class:`Rollout` per group, in
    order."""
    return WaveDriver(HFChatSampler(), max_batch).groups(groups)


def tree_rollouts(trees: list[Tree], fork_selection: str = "uniform", max_batch: int = MAX_BATCH) -> list[Rollout]:
    """:func:`trainer.waves.tree_rollout` of every tree in ``trees``: the bases sampled together, then every tree's
    branches together, each from its base's session and env at the fork turn (:meth:`trainer.waves.WaveDriver.trees`
    over :class:`HFChatSampler`). Returns one :class:`Rollout` per tree, in order (episodes: each base, then its
    branches 1..m-1).

    Raises:
        ValueError: an unknown ``fork_selection`` or ``branches < 1``.
    """
    return WaveDriver(HFChatSampler(), max_batch).trees(trees, fork_selection)


__all__ = ["MAX_BATCH", "Group", "HFChatSampler", "Reply", "Tree", "draw", "group_rollouts", "sample_rows",
           "tree_rollouts"]
