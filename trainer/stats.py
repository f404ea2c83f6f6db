"""The statistics of forkyard's experiments, in one place.

Used by ``forkyard compare`` (:mod:`trainer.compare`: mean greedy accuracy ± 95% interval per (T, variant)),
``experiments/text_policy/stats.py`` (the pre-registered paired tests of docs/results/text_policy.md and the
±1 s.e. bands of its curves), the other studies under ``experiments/`` (paired differences by seed) and
``benchmarks/bench_gradient_alignment.py`` (± s.e. of mean cosines).

* :func:`sample_sd`, :func:`standard_error`: the sample standard deviation (``ddof=1``) and the standard
  error of the mean, ``sd / sqrt(n)``;
* :func:`mean_ci`: the mean and the half-width of its Student-t confidence interval;
* :func:`paired_comparison`: ``a - b`` over paired observations: mean difference, t-interval, one-sided
  paired t-test and one-sided sign test (:class:`Paired`).
* :func:`paired_p_two_sided`: the two-sided paired t-test's p-value; :func:`holm`: Holm's step-down adjustment
  of a family of p-values (family-wise error control, any dependence between the tests).

Everything is float64 numpy; scipy (a dependency of the ``train`` extra) is imported only by the functions
that need a t or binomial distribution, and torch never. Inputs are 1-D sequences of numbers (lists,
tuples, numpy arrays); nothing here drops NaNs, a NaN in the input gives NaN results.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Paired", "holm", "mean_ci", "paired_comparison", "paired_p_two_sided", "sample_sd", "standard_error"]


def sample_sd(values: Sequence[float] | np.ndarray, axis: int | None = None) -> float | np.ndarray:
    """Sample standard deviation with Bessel's correction (``numpy.std(..., ddof=1)``).

    ``axis=None`` (default) takes all values and returns a float (NaN if fewer than 2); with an ``axis``
    the result is an array over the other axes (for example the s.d. across seeds at each grid point).
    """
    x = np.asarray(values, dtype=float)
    if axis is None:
        return float(x.std(ddof=1)) if x.size >= 2 else math.nan
    return np.std(x, axis=axis, ddof=1)


def standard_error(values: Sequence[float] | np.ndarray, axis: int | None = None) -> float | np.ndarray:
    """Standard error of the mean, ``sample_sd / sqrt(n)`` (``n``: the number of values along ``axis``).

    No distributional assumption beyond independent observations; as the scale of a normal-approximation
    band (mean ± 1 s.e.) it assumes a sample large enough for the mean to be roughly normal. A float (NaN
    if n < 2) when ``axis`` is None, else an array as in :func:`sample_sd`.
    """
    x = np.asarray(values, dtype=float)
    if axis is None:
        return float(x.std(ddof=1) / np.sqrt(x.size)) if x.size >= 2 else math.nan
    return np.std(x, axis=axis, ddof=1) / np.sqrt(x.shape[axis])


def _t_quantile(confidence: float, n: int) -> float:
    """The two-sided Student-t critical value: the ``(1 + confidence) / 2`` quantile with ``n - 1`` d.f."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    from scipy import stats

    return float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1))


def mean_ci(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its two-sided Student-t confidence interval.

    Returns ``(mean, half)``; the interval is ``mean ± half`` with ``half = t_{(1+c)/2, n-1} * sd / sqrt(n)``.
    Assumes independent observations from a normal distribution (or a sample large enough for the mean to
    be roughly normal). ``half`` is NaN when n < 2 (no spread to estimate) and 0 when all values are equal.
    Raises ValueError on an empty input or a confidence outside (0, 1).
    """
    x = np.asarray(values, dtype=float)
    n = x.size
    if n == 0:
        raise ValueError("mean_ci of no values")
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan
    return mean, float(_t_quantile(confidence, n) * (x.std(ddof=1) / np.sqrt(n)))


@dataclass(frozen=True)
class Paired:
    """The result of :func:`paired_comparison` of ``a - b`` over ``n`` pairs.

    ``mean``, ``sd``: mean and sample s.d. of the differences; ``lo``, ``hi``: the two-sided Student-t
    interval of the mean difference (``mean ∓ half``); ``t``, ``p_t``: statistic and one-sided p-value of
    the paired t-test (alternative: mean difference > 0); ``wins``, ``ties``: pairs with ``a > b`` and with
    ``a == b``; ``p_sign``: one-sided sign-test p-value (alternative: P(a > b) > 1/2 among untied pairs).
    """

    n: int
    mean: float
    sd: float
    lo: float
    hi: float
    t: float
    p_t: float
    wins: int
    ties: int
    p_sign: float


def paired_comparison(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                      confidence: float = 0.95) -> Paired:
    """Compare two arms on paired observations (``a[i]`` and ``b[i]`` share seed ``i``): is ``a`` better?

    Works on the differences ``d = a - b`` (equal lengths, at least 2 pairs, else ValueError):

    * mean difference with its two-sided Student-t ``confidence`` interval, as :func:`mean_ci`;
    * **one-sided paired t-test** (``scipy.stats.ttest_1samp(d, 0, alternative="greater")``, the same as
      ``ttest_rel(a, b, alternative="greater")``): H0 mean difference = 0 against > 0. Assumes the pairs
      are independent and the differences roughly normal. ``t`` and ``p_t`` are NaN when every difference
      is equal to the same value 0 (no spread), and ``t`` = inf, ``p_t`` = 0 for an equal non-zero value;
    * **one-sided sign test** (``scipy.stats.binomtest(wins, n - ties, 0.5, alternative="greater")``): H0
      ``a > b`` and ``a < b`` are equally likely, against ``a > b`` more likely. Assumes only independent
      pairs (no normality, no symmetry); ties (``d == 0``) are dropped, and with every pair tied
      ``p_sign`` is 1 (no evidence either way).
    """
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.ndim != 1:
        raise ValueError(f"paired_comparison takes 1-D sequences of equal length, got shape {d.shape}")
    n = d.size
    if n < 2:
        raise ValueError(f"paired_comparison needs at least 2 pairs, got {n}")
    mean = d.mean()
    half = _t_quantile(confidence, n) * (d.std(ddof=1) / np.sqrt(n))
    wins = int((d > 0).sum())
    untied = int((d != 0).sum())
    if np.all(d == d[0]):  # no spread: scipy warns of catastrophic cancellation; the limits are exact
        t = math.nan if d[0] == 0 else math.copysign(math.inf, d[0])
        p_t = math.nan if d[0] == 0 else float(d[0] < 0)
    else:
        res = stats.ttest_1samp(d, 0.0, alternative="greater")
        t, p_t = float(res.statistic), float(res.pvalue)
    p_sign = float(stats.binomtest(wins, untied, 0.5, alternative="greater").pvalue) if untied else 1.0
    return Paired(n=n, mean=float(mean), sd=float(d.std(ddof=1)), lo=float(mean - half), hi=float(mean + half),
                  t=t, p_t=p_t, wins=wins, ties=n - untied, p_sign=p_sign)


def paired_p_two_sided(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """The two-sided paired t-test of ``a - b`` (``scipy.stats.ttest_1samp(d, 0)``): H0 mean difference = 0.

    Every difference equal: 1.0 when it is 0 (no evidence either way), 0.0 when it is not (exact limits; scipy
    would warn and give NaN). Raises ValueError on fewer than 2 pairs or unequal lengths.
    """
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.ndim != 1 or d.size < 2:
        raise ValueError(f"paired_p_two_sided needs two 1-D sequences of at least 2 pairs, got shape {d.shape}")
    if np.all(d == d[0]):
        return 1.0 if d[0] == 0 else 0.0
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test
    procedure"): sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``, returned in the
    input's order. Rejecting where the adjusted value is at most alpha keeps the family-wise error rate at alpha.
    NaN inputs are not allowed (ValueError)."""
    p = np.asarray(pvalues, dtype=float)
    if np.isnan(p).any():
        raise ValueError("holm: a p-value is NaN")
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()
