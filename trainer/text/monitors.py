"""Stability monitors for multi-turn RL and the Echo-Trap collapse detector.

RAGEN / StarPO-S (Wang et al. 2025, arXiv:2504.20073) name "Echo Trap" the collapse of multi-turn agent
RL: rollouts become homogeneous, so the in-group **reward std falls** first, then the **token entropy
falls**, then the **gradient norm spikes** (few outlying samples dominate the update). The trainer logs,
per iteration, ``reward_std``, ``entropy``, ``grad_norm``, ``clip_frac``, ``ratio_*``,
``response_length``, ``invalid_share`` and ``zero_variance_groups`` (:data:`MONITORED`);
:class:`EchoTrapDetector` watches the first three for that ordered pattern;
:class:`FormatCollapseDetector` watches ``invalid_share`` for the other collapse seen in practice (the
policy stops writing legal tool calls).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Per-iteration metrics every text-policy run records (``metrics.jsonl``) and ``forkyard plot`` draws.
MONITORED = ("reward_mean", "reward_std", "entropy", "grad_norm", "clip_frac", "ratio_mean", "ratio_max",
             "response_length", "invalid_share", "zero_variance_groups")


@dataclass
class EchoTrapDetector:
    """Detects "reward std falls, then entropy falls, then a gradient-norm spike", in that order.

    A quantity *falls* at iteration t when the mean of its last ``window`` values is below ``drop``
    times the highest such windowed mean seen before (a sustained drop, not one noisy point). A
    *spike* is a gradient norm above ``spike`` times the median of the previous ``window`` norms.
    The detector records the iteration of each event; when all three have happened in order (std
    fall <= entropy fall <= spike) it logs one warning naming the iterations and returns it.

    Args:
        window: iterations per moving window (>= 2).
        drop: fraction of the running peak below which a windowed mean counts as fallen (0 < drop < 1).
        spike: factor over the recent median that counts as a gradient-norm spike (> 1).
    """

    window: int = 5
    drop: float = 0.5
    spike: float = 3.0
    std_fall: int | None = None
    entropy_fall: int | None = None
    grad_spike: int | None = None
    warned: bool = False
    _std: list[float] = field(default_factory=list)
    _ent: list[float] = field(default_factory=list)
    _grad: list[float] = field(default_factory=list)
    _std_peak: float = 0.0
    _ent_peak: float = 0.0

    def _fell(self, series: list[float], peak: float) -> tuple[bool, float]:
        if len(series) < self.window:
            return False, peak
        m = sum(series[-self.window:]) / self.window
        fell = peak > 0 and m < self.drop * peak
        return fell, max(peak, m)

    def update(self, iteration: int, reward_std: float, entropy: float, grad_norm: float) -> str | None:
        """Feed one iteration's values; return the warning text the first time the pattern completes."""
        self._std.append(reward_std)
        self._ent.append(entropy)
        fell, self._std_peak = self._fell(self._std, self._std_peak)
        if fell and self.std_fall is None:
            self.std_fall = iteration
        fell, self._ent_peak = self._fell(self._ent, self._ent_peak)
        if fell and self.entropy_fall is None and self.std_fall is not None:
            self.entropy_fall = iteration
        recent = self._grad[-self.window:]
        if (len(recent) >= self.window and self.entropy_fall is not None and self.grad_spike is None
                and grad_norm > self.spike * max(statistics.median(recent), 1e-12)):
            self.grad_spike = iteration
        self._grad.append(grad_norm)
        if self.grad_spike is not None and not self.warned:
            self.warned = True
            msg = (f"Echo Trap pattern (arXiv:2504.20073): reward std fell at iteration {self.std_fall}, "
                   f"entropy fell at iteration {self.entropy_fall}, gradient-norm spike at iteration "
                   f"{self.grad_spike}; consider StarPO-S filtering (top-p groups by reward std), "
                   f"clip-higher, an entropy bonus, or stopping at the last good checkpoint")
            log.warning(msg)
            return msg
        return None

    #: the metric the training loop sets to 1 at the iteration this monitor fires (:class:`trainer.loop.Monitor`)
    key = "echo_trap_warning"

    def check(self, iteration: int, metrics: dict) -> str | None:
        """:meth:`update` with ``metrics["reward_std"]``, ``["entropy"]`` and ``["grad_norm"]`` (a
        :class:`trainer.loop.Monitor`)."""
        return self.update(iteration, metrics["reward_std"], metrics["entropy"], metrics["grad_norm"])


@dataclass
class FormatCollapseDetector:
    """Detects a sustained rise of the invalid-action share: the policy stops writing legal tool calls.

    This is a different failure from the Echo Trap, and that detector does not see it. In the 15
    BPE runs of docs/results/text_policy.md, two runs collapsed this way and the Echo-Trap detector
    fired on neither. Here the baseline is the mean ``invalid_share`` of the first ``window``
    iterations. The detector warns once, the first time the mean of the last ``window`` iterations
    reaches ``baseline + rise``. A single bad iteration does not trigger it: on those runs, healthy
    windows peaked at +0.15 over the baseline, and the collapses reached +0.65 and +0.75.

    Args:
        window: iterations per moving window (>= 1).
        rise: absolute rise of the windowed invalid share over the baseline that counts (0 < rise <= 1).
    """

    window: int = 5
    rise: float = 0.25
    collapsed_at: int | None = None
    _xs: list[float] = field(default_factory=list)

    def update(self, iteration: int, invalid_share: float) -> str | None:
        """Feed one iteration's invalid-action share (0..1); return the warning text the first time."""
        self._xs.append(invalid_share)
        n = self.window
        if self.collapsed_at is not None or len(self._xs) < n:
            return None
        baseline = sum(self._xs[:n]) / n
        recent = sum(self._xs[-n:]) / n
        if recent < baseline + self.rise:
            return None
        self.collapsed_at = iteration
        msg = (f"format collapse at iteration {iteration}: invalid-action share {recent:.2f} over the last {n} "
               f"iterations against {baseline:.2f} at the start; consider a lower lr, an invalid-action "
               f"penalty (--invalid-penalty), a KL to the SFT policy (--kl-coef), or the last good checkpoint")
        log.warning(msg)
        return msg

    #: the metric the training loop sets to 1 at the iteration this monitor fires (:class:`trainer.loop.Monitor`)
    key = "format_collapse_warning"

    def check(self, iteration: int, metrics: dict) -> str | None:
        """:meth:`update` with ``metrics["invalid_share"]`` (a :class:`trainer.loop.Monitor`)."""
        return self.update(iteration, metrics["invalid_share"])
