"""Batched rollouts for the text policy: forkyard's torch engine as a sampler of the one wave driver.

:class:`TorchSampler` is the :class:`trainer.waves.Sampler` of :class:`trainer.text.text_policy.TextPolicy`
sessions, and :class:`RolloutEngine` the :class:`trainer.waves.WaveDriver` over it with the serial loops'
signatures (group, tree, evaluation episodes; waves, ``max_batch``, ``max_kv_tokens``, ``env_threads`` and
``max_live`` are the driver's). A wave brings its rows' KV caches up to date in batched prefills (each row's new
context: the end of its last action and the observation since; rows bucketed by its length, right-padded, with a
slot mask and per-row positions, :meth:`trainer.text.lm.TinyCausalLM.forward` /
:meth:`trainer.text.hf.HFCausalLM.forward`), then samples the next action of every row with one batched decode step
per token, rows leaving the batch as they stop (a stop id of the policy, :func:`trainer.stops.stop_ids`; stop
string; ``max_new_tokens``). Decoding is what batching makes cheaper; the prefill is the same work as the serial
loop's (docs/performance.md: what bounds the speed-up; ``benchmarks/bench_rollout.py``).

Same episodes as the serial loops: each row samples from its own episode stream
(:func:`trainer.rollout.stream`) with the arithmetic of :meth:`trainer.text.text_policy.TextSession.act` (tempered,
suppressed log-softmax, inverse-CDF draw from one ``rng.random()`` per token, top-p nucleus), the window
(left truncation) and the prefill chunks are the serial session's, and turns are closed by
:meth:`~trainer.text.text_policy.TextSession.finish`. So the same seeds give the same episodes batched or one at a
time; what padding changes is the reduction order of float sums (tested on CPU in float32: sampled ids
equal, behavior log-probs within 1e-5).

Tree rollouts: entropy fork selection reads the prefilled logits; at its fork turn a base's session is snapshotted
with its KV cache after the prefill (:meth:`~trainer.text.text_policy.TextSession.fork`: the cache tensors are
shared, never mutated), and the branches of every base then run together from those snapshots: the common prefix
is never recomputed.

Why one file: the batched prefill and the decode loop hold one invariant together (each row's cache slots,
positions, window and sampling stream are its serial session's); split, a change to one could break the
token-for-token equality unseen by the other.
"""

from __future__ import annotations

import time

import torch

from trainer.rollout import Step
from trainer.text.text_policy import TextSession, _sample_index, policy_log_softmax
from trainer.waves import ENV_THREADS, MAX_BATCH, BeforeDraw, Row, WaveDriver
#: Most tokens one batched prefill forward takes (rows x padded length; a row longer than it runs alone). On a
#: CPU, a 64 x 500-token forward of the tiny model ran 1.5x slower than the same rows in forwards of about
#: 2,000 tokens (activations past the caches; docs/performance.md).
PREFILL_TOKENS = 2048
def _row_cache(cache, r: int, mask_row: torch.Tensor):
    """Row ``r`` of a batched cache (its first ``len(mask_row)`` slots), its real slots only, copied:
    [(k [1, H, L, dh], v), ...] per layer."""
    n = mask_row.numel()
    idx = mask_row.nonzero().squeeze(1)
    if idx.numel() == n:
        return [(k[r:r + 1, :, :n].clone(), v[r:r + 1, :, :n].clone()) for k, v in cache]
    return [(k[r:r + 1, :, idx], v[r:r + 1, :, idx]) for k, v in cache]


def _batch_cache(sessions: list[TextSession], device, room: int = 0):
    """The sessions' caches right-padded into one, with ``room`` free slots after them: ``(cache or None,
    mask [B, L] bool)``."""
    lens = [s._cached if s._past is not None else 0 for s in sessions]
    width = max(lens)
    mask = torch.arange(width, device=device)[None] < torch.tensor(lens, device=device)[:, None]
    if width == 0:
        return None, mask
    ref = next(s._past for s in sessions if s._past is not None)
    cache = []
    for layer, (k0, v0) in enumerate(ref):
        k = k0.new_zeros(len(sessions), k0.shape[1], width + room, k0.shape[3])
        v = v0.new_zeros(len(sessions), v0.shape[1], width + room, v0.shape[3])
        for r, s in enumerate(sessions):
            if lens[r]:
                k[r, :, :lens[r]] = s._past[layer][0][0]
                v[r, :, :lens[r]] = s._past[layer][1][0]
        cache.append((k, v))
    return cache, mask


def _buckets(rows: list, size, budget: int | None = None) -> list[list]:
    """``rows`` sorted by ``size`` and cut into runs whose largest size is at most 1.25x the smallest + 8 (the
    padding of one batched forward stays bounded) and, with ``budget``, whose rows x largest size is at most
    ``budget`` tokens (at least one row a run)."""
    out: list[list] = []
    for r in sorted(rows, key=size):
        if out and size(r) <= 1.25 * size(out[-1][0]) + 8 and (
                budget is None or (len(out[-1]) + 1) * size(r) <= budget):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def prefill(sessions: list[TextSession]) -> None:
    """Bring every session's KV cache up to the end of its history in batched forwards (sessions with logits
    already computed are left alone): sets ``_past``, ``_cached`` and ``_next_logits`` [V] as
    :meth:`TextSession._prefill` would. Rows are bucketed by the length of their new context; rows without a
    cache (a new episode, or a window that moved) run without a mask (right padding: a real token never sees a
    padding slot), the others with a slot mask over their right-padded caches."""
    todo = [(s, s._pending()) for s in sessions if s._next_logits is None]
    fresh = [x for x in todo if x[0]._past is None]
    for part in (fresh, [x for x in todo if x[0]._past is not None]):
        for bucket in _buckets(part, lambda x: len(x[1]), PREFILL_TOKENS):
            _prefill_rows([x[0] for x in bucket], [x[1] for x in bucket])


def _prefill_rows(todo: list[TextSession], news: list[list[int]]) -> None:
    policy = todo[0].policy
    device, pad, ctx = policy.device, policy.tok.pad_id, policy.model.config.context
    width = max(len(n) for n in news)
    ids = torch.tensor([n + [pad] * (width - len(n)) for n in news], dtype=torch.long, device=device)
    past, mask = _batch_cache(todo, device)
    real = torch.arange(width, device=device)[None] < torch.tensor([len(n) for n in news], device=device)[:, None]
    mask = torch.cat([mask, real], 1)
    last = torch.tensor([len(n) - 1 for n in news], device=device)
    at = {"logits_at": last} if getattr(policy.model, "in_place_cache", False) else {}  # TinyCausalLM's
    with torch.no_grad():
        if past is None:  # causal attention over right padding: the real tokens never see a padding slot
            out, cache = policy.model(ids, **at)
        else:
            base = torch.tensor([s._cached for s in todo], device=device)[:, None]
            positions = (base + torch.arange(width, device=device)[None]).clamp(max=ctx - 1)
            out, cache = policy.model(ids, past, mask=mask, positions=positions, **at)
    out = out[:, 0] if at else out[torch.arange(len(todo), device=device), last]
    if cache is None:
        raise RuntimeError("the model returned no KV cache (a Hugging Face model in training mode): sample in "
                           "eval mode, model.eval()")
    for r, (s, n) in enumerate(zip(todo, news, strict=True)):
        s._past = _row_cache(cache, r, mask[r])
        s._cached += len(n)
        s._next_logits = out[r]


def _draw(logp: torch.Tensor, rows: list[Row], temperature: float, top_p: float) -> list[int]:
    """One token per row of ``logp`` [B, V], as :meth:`TextSession.act` draws it (one ``rng.random()`` per
    sampled token from the row's stream; argmax at temperature 0)."""
    if temperature == 0:
        return logp.argmax(-1).tolist()
    probs = logp.exp()
    us = [r.rng.random() for r in rows]
    if top_p < 1.0:
        return [_sample_index(probs[b], top_p, u) for b, u in enumerate(us)]
    cdf = probs.cumsum(-1)
    u = torch.tensor(us, dtype=torch.float64, device=cdf.device)
    target = (u * cdf[:, -1].double()).to(cdf.dtype)
    j = torch.searchsorted(cdf, target[:, None]).squeeze(1)
    return j.clamp(max=probs.shape[1] - 1).tolist()


def generate(rows: list[Row]) -> list[Step]:
    """Sample the next action of every row (their caches prefilled, :func:`prefill`) with one batched decode
    step per token; returns one :class:`Step` per row, each session's turn closed as
    :meth:`TextSession.act` closes it. With a model that writes its cache in place (``in_place_cache``:
    :class:`trainer.text.lm.TinyCausalLM`) the batch cache is allocated once and rows that stopped stay in the batch
    (fed padding) until a quarter of it has stopped; otherwise the cache grows by concatenation and stopped
    rows leave at once."""
    sessions = [r.session for r in rows]
    policy = sessions[0].policy
    sc, tok, model, device = policy.sampling, policy.tok, policy.model, policy.device
    suppress, ctx = tok.suppressed_ids, model.config.context
    in_place = getattr(model, "in_place_cache", False)
    contexts = [list(s.ids) for s in sessions]
    wss = [s._ws for s in sessions]
    gens: list[list[int]] = [[] for _ in rows]
    logps: list[list[float]] = [[] for _ in rows]
    ents: list[list[float]] = [[] for _ in rows]
    stops = ["max_tokens"] * len(rows)
    batch = list(range(len(rows)))  # the session of each batch row
    live = [True] * len(rows)  # per batch row: still sampling
    logits = torch.stack([s._next_logits for s in sessions])
    past, mask = _batch_cache(sessions, device, sc.max_new_tokens if in_place else 0)
    fill = mask.shape[1]
    if in_place:
        mask = torch.cat([mask, mask.new_zeros(len(rows), sc.max_new_tokens)], 1)
    with torch.no_grad():
        for n in range(sc.max_new_tokens):
            on = [b for b in range(len(batch)) if live[b]]
            logp = policy_log_softmax(logits if len(on) == len(batch) else logits[on], sc.temperature, suppress)
            picks = _draw(logp, [rows[batch[b]] for b in on], sc.temperature, sc.top_p)
            lp = logp.gather(1, torch.tensor(picks, device=device)[:, None]).squeeze(1).tolist()
            ent = (-(logp.exp() * logp).sum(-1)).tolist()
            feed = [tok.pad_id] * len(batch)
            for j, b in enumerate(on):
                a, i = batch[b], picks[j]
                gens[a].append(i)
                logps[a].append(lp[j])
                ents[a].append(ent[j])
                if i in policy.stops:  # the policy's stop set (field case S50)
                    stops[a] = "eot"
                elif sc.stop_strings and any(tok.decode(gens[a]).endswith(s) for s in sc.stop_strings):
                    stops[a] = "stop_string"
                elif n + 1 < sc.max_new_tokens:
                    feed[b] = i
                    continue
                live[b] = False  # the row stops: its cache as the serial session holds it
                sessions[a]._past = _row_cache(past, b, mask[b, :fill])
            keep = [b for b in range(len(batch)) if live[b]]
            if not keep:
                break
            if not in_place or len(keep) <= 0.75 * len(batch):  # stopped rows leave the batch
                sel = torch.tensor(keep, device=device)
                past = [(k[sel], v[sel]) for k, v in past]
                mask = mask[sel]
                batch, live, feed = [batch[b] for b in keep], [True] * len(keep), [feed[b] for b in keep]
            positions = torch.tensor([min(sessions[a]._cached, ctx - 1) for a in batch], device=device)[:, None]
            ids = torch.tensor(feed, device=device)[:, None]
            if in_place:
                mask[:, fill] = True
                out, past = model(ids, past, mask=mask[:, :fill + 1], positions=positions, fill=fill)
            else:
                mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=torch.bool, device=device)], 1)
                out, past = model(ids, past, mask=mask, positions=positions)
            fill += 1
            for b, a in enumerate(batch):
                if live[b]:
                    sessions[a]._cached += 1
            logits = out[:, -1]
    return [s.finish(contexts[a], wss[a], gens[a], logps[a], ents[a], stops[a]) for a, s in enumerate(sessions)]


class TorchSampler:
    """The batched torch engine as a :class:`trainer.waves.Sampler` of :class:`trainer.text.text_policy.TextPolicy`
    sessions: a wave's caches brought up to date by :func:`prefill`, the fork-turn hook called with each session's
    prefilled entropy, then :func:`generate`. ``slots(row)``: the row's window plus ``max_new_tokens``, at most the
    model context. ``seconds``: ``prefill`` and ``decode`` wall seconds."""

    def __init__(self) -> None:
        self.seconds = {"prefill": 0.0, "decode": 0.0}

    def sample(self, rows: list[Row], before_draw: BeforeDraw | None) -> list[Step]:
        """Each row's next action, the wave prefilled then decoded together (:class:`trainer.waves.Sampler`)."""
        t0 = time.perf_counter()
        prefill([r.session for r in rows])
        t1 = time.perf_counter()
        self.seconds["prefill"] += t1 - t0
        if before_draw is not None:
            for r in rows:
                before_draw(r, r.session.entropy)
        t2 = time.perf_counter()
        steps = generate(rows)
        self.seconds["decode"] += time.perf_counter() - t2
        return steps

    def slots(self, row: Row) -> int:
        """KV-cache slots the row holds at the end of its action: its window plus ``max_new_tokens``, at most the
        model context."""
        policy = row.session.policy
        return min(len(row.session.ids) + policy.sampling.max_new_tokens, policy.model.config.context)


class RolloutEngine(WaveDriver):
    """Batched group and tree rollouts of a :class:`trainer.text.text_policy.TextPolicy` (module docstring): the
    wave driver (:class:`trainer.waves.WaveDriver`) over :class:`TorchSampler`, with the serial loops' signatures.

    Args:
        max_batch: most rows sampled in one batched forward (>= 1); rows past it wait for the next wave.
        max_kv_tokens: most KV-cache slots a wave's batched cache holds (>= 1), or None: no cap besides
            ``max_batch``. A slot is one token's keys and values in every layer; a wave of B rows whose longest
            row will hold L tokens at the end of its action (its window plus ``max_new_tokens``, at most the
            model context) takes B x L slots (the batch is right-padded to L). Bytes = slots x 2 (keys,
            values) x layers x KV width x bytes per element (the tiny model of ``forkyard train``: 2 x 2 x 96
            x 4 = 1,536 bytes a slot, so a 64-row wave at context 512 holds 48 MiB). Rows past the cap wait for
            the next wave (a wave always takes at least one row). Each live session also keeps its own cache
            between turns (at most one window's slots), as the serial loop's sessions do: ``max_live`` bounds
            how many.
        env_threads: worker threads for the env calls of a wave (steps, and the resets of new episodes) when
            the env blocks (:func:`trainer.waves.blocking`: FileQA's sandbox calls); 1: one after another.
            Pure-Python envs always run inline. Results are gathered, then applied in row order, so episodes
            and counters are the serial order's.
        max_live: most episodes live at once, or None: all of a rollout. Each live episode holds an env copy
            (FileQA: a sandbox, of a pool of ``FORKYARD_MAX_TOTAL``) and its session's KV cache between turns;
            episodes past it start when the cohort before them has ended (tree rollouts: ``max_live //
            branches`` bases at a time, then their branches). The episodes do not depend on it.

        sampler: what draws a wave's actions: None, :class:`TorchSampler` (this process's model); or
            :class:`trainer.vllm_sampler.VLLMSampler` (a vLLM server; ``--sampler vllm``).

    Raises:
        ValueError: ``max_batch < 1``, ``max_kv_tokens < 1``, ``env_threads < 1`` or ``max_live < 1``.
    """

    def __init__(self, max_batch: int = MAX_BATCH, max_kv_tokens: int | None = None,
                 env_threads: int = ENV_THREADS, max_live: int | None = None, sampler=None):
        super().__init__(sampler or TorchSampler(), max_batch, max_kv_tokens, env_threads, max_live)

    @classmethod
    def from_config(cls, cfg, sampler=None) -> "RolloutEngine":
        """The engine of a :class:`trainer.text.text_config.TextTrainConfig` (``max_batch``, and ``max_kv_tokens`` /
        ``env_threads`` where the config has them) over ``sampler`` (None: :class:`TorchSampler`)."""
        return cls(cfg.max_batch, getattr(cfg, "max_kv_tokens", None), getattr(cfg, "env_threads", ENV_THREADS),
                   getattr(cfg, "max_live", None), sampler)


__all__ = ["ENV_THREADS", "MAX_BATCH", "PREFILL_TOKENS", "RolloutEngine", "TorchSampler", "generate", "prefill"]
