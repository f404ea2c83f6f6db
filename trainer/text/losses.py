"""Token-level policy losses: loss mask, PPO clipped surrogate with asymmetric clip, entropy bonus, KL,
and the reduction modes. Pure functions over [B, L] tensors.

Every per-token term (surrogate, entropy, KL) is multiplied by the same loss mask, which is 1 only on
tokens the policy generated (the end-of-turn token it wrote included) and 0 on prompt, role headers,
observations / tool outputs and padding. Masked positions are selected with ``torch.where`` before any
arithmetic, so whatever the model computes there (even inf or NaN logits) contributes exactly 0 to the
loss and to every gradient (the S7 field case).

Objective per token (PPO, Schulman et al. 2017, arXiv:1707.06347; asymmetric "clip-higher" of DAPO,
arXiv:2503.14476, used by StarPO-S, arXiv:2504.20073)::

    r      = exp(logp - old_logp)                          importance ratio vs the behavior log-prob
    pg     = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)
    token  = pg - entropy_coef * H + kl_coef * KL(pi || pi_ref)

with ``KL`` the non-negative "k3" estimator ``exp(ref - logp) - (ref - logp) - 1`` (as GRPO uses).
Defaults: clip_low 0.2, clip_high 0.28, entropy_coef 0 (StarPO-S uses 0.001), kl_coef 0 (off).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Reduction modes (see :func:`reduce_tokens`).
REDUCTIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "group-mean")


def reduce_tokens(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                  group: torch.Tensor | None = None, norm_len: float | None = None) -> torch.Tensor:
    """Reduce per-token values [B, L] to a scalar over the masked tokens.

    Rows are sequences (in the multi-turn trainer one row is one episode or branch: all its turns).

    * ``token-mean``: ``sum(v * m) / sum(m)``; every trained token in the batch weighs the same, so
      long responses weigh more in total (DAPO's token-level loss).
    * ``seq-mean-token-mean``: mean over rows of each row's token mean; every sequence weighs the same
      and tokens share their sequence's weight (GRPO's original sample-level loss). In the multi-turn
      trainer this is the episode mean.
    * ``seq-mean-token-sum``: ``sum(v * m) / (B * norm_len)``: every token weighs the same and every
      sequence counts once in the denominator (Dr. GRPO divides by a constant ``norm_len``; by default
      ``norm_len = 1``, i.e. the mean over sequences of token sums).
    * ``group-mean``: mean over groups (``group`` [B] int ids) of the mean over the group's rows of
      each row's token mean; every group weighs the same, then every sequence within its group.

    Rows with no masked token count as absent (they add nothing and are not in any denominator).

    Args:
        values: [B, L] float.
        mask: [B, L] float or bool, 1 on the tokens to include.
        mode: one of :data:`REDUCTIONS`.
        group: [B] int64 group ids (``group-mean`` only).
        norm_len: ``seq-mean-token-sum`` constant length divisor (default 1).

    Returns:
        A scalar tensor (0.0 when no token is masked in).

    Raises:
        ValueError: on an unknown mode, mismatched shapes, or ``group-mean`` without ``group``.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ")
    m = mask.to(values.dtype) if mask.dtype != torch.bool else mask.to(values.dtype)
    v = torch.where(m > 0, values, torch.zeros_like(values)) * m
    n_tok = m.sum(-1)  # [B]
    present = n_tok > 0
    if mode == "token-mean":
        return v.sum() / m.sum().clamp_min(1.0)
    row_sum = v.sum(-1)
    if mode == "seq-mean-token-sum":
        return row_sum[present].sum() / (present.sum().clamp_min(1) * (norm_len or 1.0))
    row_mean = row_sum / n_tok.clamp_min(1.0)
    if mode == "seq-mean-token-mean":
        return row_mean[present].sum() / present.sum().clamp_min(1)
    if mode == "group-mean":
        if group is None or group.shape != (values.shape[0],):
            raise ValueError("group-mean needs group ids of shape [B]")
        groups = group[present].unique()
        if groups.numel() == 0:
            return values.new_zeros(())
        total = values.new_zeros(())
        for g in groups:
            sel = present & (group == g)
            total = total + row_mean[sel].mean()
        return total / groups.numel()
    raise ValueError(f"reduction must be one of {REDUCTIONS}, got {mode!r}")


@dataclass
class PPOConfig:
    """Loss hyperparameters (defaults: DAPO / StarPO-S clip 0.2 / 0.28, no KL)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    reduction: str = "token-mean"


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             cfg: PPOConfig | None = None, entropy: torch.Tensor | None = None,
             ref_logp: torch.Tensor | None = None, group: torch.Tensor | None = None,
             is_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-surrogate loss (module docstring) reduced with ``cfg.reduction``.

    Args:
        logp: [B, L] float log-probs of the tokens under the current policy (with grad).
        old_logp: [B, L] behavior log-probs recorded at sampling time (no grad).
        advantages: [B, L] per-token advantages (a turn's advantage broadcast over its tokens).
        mask: [B, L] loss mask (1 on policy-generated tokens).
        cfg: a :class:`PPOConfig`.
        entropy: [B, L] per-token entropy (nats) with grad, needed when ``entropy_coef != 0``.
        ref_logp: [B, L] reference-policy log-probs, needed when ``kl_coef != 0``.
        group: [B] group ids for the ``group-mean`` reduction.
        is_weight: [B, L] per-token weights (no grad) multiplying the clipped surrogate: the truncated importance
            weight ``min(pi_old / pi_behavior, C)`` that corrects for a sampler whose distribution differs from the
            trainer's (vLLM's kernels: the token-level truncated importance sampling of verl's
            ``verl/trainer/ppo/rollout_corr_helper.py`` and of TRL's
            ``GRPOConfig.vllm_importance_sampling_correction``),
            with ``old_logp`` then the trainer's own recompute. None: 1.

    Returns:
        ``(loss, stats)``: a scalar tensor and floats over the masked tokens: ``clip_frac`` (share of
        tokens whose gradient the clip removes), ``clip_low_frac``, ``clip_high_frac``, ``ratio_mean``,
        ``ratio_min``, ``ratio_max``, ``entropy`` (token mean, if given), ``kl`` (token mean, if used),
        ``tokens`` (mask sum), ``pg_loss``.

    Raises:
        ValueError: on mismatched shapes or a missing entropy / reference when its coefficient is set.
    """
    cfg = cfg or PPOConfig()
    for name, t in (("old_logp", old_logp), ("advantages", advantages), ("mask", mask)):
        if t.shape != logp.shape:
            raise ValueError(f"{name} {tuple(t.shape)} differs from logp {tuple(logp.shape)}")
    on = mask > 0
    zero = torch.zeros_like(logp)
    diff = torch.where(on, logp - old_logp.detach(), zero)
    ratio = torch.exp(diff)
    a = torch.where(on, advantages.detach().to(logp.dtype), zero)
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    pg = -torch.minimum(ratio * a, clipped * a)
    if is_weight is not None:
        if is_weight.shape != logp.shape:
            raise ValueError(f"is_weight {tuple(is_weight.shape)} differs from logp {tuple(logp.shape)}")
        pg = pg * torch.where(on, is_weight.detach().to(logp.dtype), zero)
    token = pg
    stats: dict[str, float] = {}
    if cfg.entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef is set but no entropy was given")
        token = token - cfg.entropy_coef * torch.where(on, entropy, zero)
    if cfg.kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef is set but no ref_logp was given")
        d = torch.where(on, ref_logp.detach() - logp, zero)
        kl = torch.exp(d) - d - 1.0
        token = token + cfg.kl_coef * kl
        stats["kl"] = float(reduce_tokens(kl.detach(), mask, "token-mean"))
    loss = reduce_tokens(token, mask, cfg.reduction, group)
    with torch.no_grad():
        n = on.sum().clamp_min(1)
        low = on & (ratio < 1.0 - cfg.clip_low) & (a < 0)
        high = on & (ratio > 1.0 + cfg.clip_high) & (a > 0)
        r_on = ratio[on]
        stats.update(
            tokens=float(on.sum()),
            clip_low_frac=float(low.sum() / n),
            clip_high_frac=float(high.sum() / n),
            clip_frac=float((low | high).sum() / n),
            ratio_mean=float(r_on.mean()) if r_on.numel() else 1.0,
            ratio_min=float(r_on.min()) if r_on.numel() else 1.0,
            ratio_max=float(r_on.max()) if r_on.numel() else 1.0,
            pg_loss=float(reduce_tokens(pg.detach(), mask, cfg.reduction, group)),
        )
        if entropy is not None:
            stats["entropy"] = float(reduce_tokens(entropy.detach(), mask, "token-mean"))
    return loss, stats
