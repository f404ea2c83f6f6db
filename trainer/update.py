"""Torch helpers shared by every policy: the REINFORCE surrogate, the gradient norm, the device choice."""

from __future__ import annotations

import math

import torch


def reinforce_loss(logp: torch.Tensor, advantages: torch.Tensor, normalizer: float) -> torch.Tensor:
    """REINFORCE surrogate ``-(sum_i A_i * logp_i) / normalizer`` (Williams 1992).

    Args:
        logp: [N] float log-probs of the taken actions under the current policy (with grad).
        advantages: [N] float advantages (no grad), same device.
        normalizer: the number of episodes the N steps came from (> 0), so the loss is the Monte Carlo
            estimate of ``-E[sum_t A_t log pi(a_t|s_t)]`` per episode.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: on mismatched shapes or a non-positive normalizer.
    """
    if logp.shape != advantages.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and advantages {tuple(advantages.shape)} differ")
    if not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    return -(advantages.detach() * logp).sum() / normalizer


def grad_norm(parameters: list[torch.Tensor]) -> float:
    """L2 norm of all gradients (0.0 when none is set)."""
    total = 0.0
    for p in parameters:
        if p.grad is not None:
            total += float(p.grad.detach().pow(2).sum())
    return math.sqrt(total)


def resolve_device(device: str = "auto") -> torch.device:
    """The torch device for a ``--device`` value: ``"auto"`` is CUDA when available, else CPU; any other
    text is ``torch.device(device)`` (which raises RuntimeError on an unknown device string)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
