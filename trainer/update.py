"""Torch helpers shared by every policy: the REINFORCE surrogate, the gradient norm, the device choice, and
the dropout-free mode of the RL forward passes (:func:`dropout_off`)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

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


#: Names of the dropout rates a module may hold as plain numbers (read as ``F.dropout(x, p, self.training)``).
_RATE_WORDS = ("dropout", "pdrop", "layerdrop")


@contextmanager
def dropout_off(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Forward passes with every dropout off and gradients on, for the RL update (the S37 field case): the
    importance ratio of the first on-policy epoch is then 1 up to float rounding for any checkpoint, since
    sampling and update evaluate the same function.

    Inside, ``model`` is in eval mode (torch computes gradients in eval mode alike; only dropout and
    batch-norm statistics read the mode), whatever dropout its config declares (GPT-2's ``resid_pdrop``,
    Llama's ``attention_dropout``, ...). One exception: transformers' ``GradientCheckpointingLayer`` s with
    checkpointing on recompute only in training mode, so those layers (not their sub-modules) stay in
    training mode and the dropout rates they hold as plain numbers are 0 inside. On exit every module's
    mode and every rate changed are restored.

    Args:
        model: any ``torch.nn.Module`` (a :class:`trainer.text.lm.TinyCausalLM`, :class:`trainer.text.hf.HFCausalLM`).

    Yields:
        ``model``.
    """
    modes = [(m, m.training) for m in model.modules()]
    rates: list[tuple[torch.nn.Module, str, float]] = []
    model.eval()
    for m in model.modules():
        checkpointed = getattr(m, "gradient_checkpointing", False) is True and any(
            c.__name__ == "GradientCheckpointingLayer" for c in type(m).__mro__)
        if not checkpointed:
            continue
        m.training = True
        for name, value in list(vars(m).items()):
            if isinstance(value, float) and value and any(w in name.lower() for w in _RATE_WORDS):
                rates.append((m, name, value))
                setattr(m, name, 0.0)
    try:
        yield model
    finally:
        for m, name, value in rates:
            setattr(m, name, value)
        for m, mode in modes:
            m.training = mode
