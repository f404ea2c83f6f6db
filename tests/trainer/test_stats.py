"""trainer/stats.py against textbook values, scipy's own results, and properties (hypothesis)."""

import math
import statistics
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from trainer.stats import mean_ci, paired_comparison, sample_sd, standard_error

# Student's sleep data (Cushny & Peebles 1905; R's `sleep`): extra hours of sleep of 10 patients under
# drug 1 and drug 2. R: t.test(drug2, drug1, paired = TRUE) gives t = 4.0621, df = 9, two-sided
# p = 0.002833, mean difference 1.58, 95% CI (0.7001142, 2.4598858).
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_mean_ci_by_hand():
    mean, half = mean_ci([0.5, 0.75, 1.0])
    # sd = 0.25, t(0.975, 2) = 4.302653 (textbook table: 4.303)
    assert mean == pytest.approx(0.75)
    assert half == pytest.approx(4.302653 * 0.25 / math.sqrt(3), rel=1e-5)


@pytest.mark.parametrize("n, t975", [(2, 12.706), (10, 2.262), (30, 2.045)])
def test_mean_ci_uses_the_student_t_table(n, t975):
    # n values with standard error 1 around mean 3: the half-width is the table's t(0.975, n - 1)
    x = np.array([-1.0, 1.0] * (n // 2))
    x = 3 + x / standard_error(x)
    mean, half = mean_ci(x)
    assert mean == pytest.approx(3)
    assert half == pytest.approx(t975, abs=5e-4)


def test_mean_ci_other_confidence_and_edges():
    x = [1.0, 2.0, 4.0, 7.0]
    _, half90 = mean_ci(x, confidence=0.90)
    assert half90 == pytest.approx(sps.t.ppf(0.95, 3) * statistics.stdev(x) / 2, rel=1e-12)
    assert mean_ci(x, 0.99)[1] > mean_ci(x)[1] > half90
    assert mean_ci([0.5])[0] == 0.5 and math.isnan(mean_ci([0.5])[1])
    assert mean_ci([2.0, 2.0, 2.0]) == (2.0, 0.0)
    with pytest.raises(ValueError):
        mean_ci([])
    with pytest.raises(ValueError):
        mean_ci(x, confidence=95)


def test_mean_ci_matches_scipy_interval():
    x = [0.375, 0.5, 0.25, 0.625, 0.5]
    lo, hi = sps.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=sps.sem(x))
    mean, half = mean_ci(x)
    assert (mean - half, mean + half) == pytest.approx((lo, hi), rel=1e-12)


def test_standard_error_and_sd():
    x = [2, 4, 4, 4, 5, 5, 7, 9]  # sample variance 32/7
    assert sample_sd(x) == pytest.approx(math.sqrt(32 / 7), rel=1e-12)
    assert standard_error(x) == pytest.approx(math.sqrt(32 / 7) / math.sqrt(8), rel=1e-12)
    assert standard_error(x) == pytest.approx(sps.sem(x), rel=1e-12)
    assert standard_error(x) == pytest.approx(statistics.stdev(x) / math.sqrt(len(x)), rel=1e-12)
    assert math.isnan(standard_error([1.0])) and math.isnan(sample_sd([1.0]))


def test_standard_error_along_an_axis():
    series = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 5.0], [4.0, 2.0, 4.0]])  # 3 runs x 3 grid points
    se = standard_error(series, axis=0)
    assert se.shape == (3,)
    assert list(se) == pytest.approx([standard_error(series[:, j]) for j in range(3)], rel=1e-12)
    assert se[1] == 0.0
    assert list(sample_sd(series, axis=1)) == pytest.approx([sample_sd(row) for row in series], rel=1e-12)


def test_paired_on_students_sleep_data():
    r = paired_comparison(DRUG2, DRUG1)
    assert r.n == 10
    assert r.mean == pytest.approx(1.58)
    assert r.t == pytest.approx(4.0621, abs=1e-4)
    assert r.p_t == pytest.approx(0.002833 / 2, rel=1e-3)  # one-sided: half R's two-sided p
    assert (r.lo, r.hi) == pytest.approx((0.7001142, 2.4598858), abs=1e-7)
    # differences: 9 positive, one tie (patient 5) -> sign test p = P(Bin(9, 1/2) >= 9) = 1/512
    assert (r.wins, r.ties) == (9, 1)
    assert r.p_sign == pytest.approx(1 / 512, rel=1e-12)
    # the other direction: the t-test's p is the complement, the sign test finds nothing
    s = paired_comparison(DRUG1, DRUG2)
    assert s.p_t == pytest.approx(1 - r.p_t, rel=1e-12)
    assert s.wins == 0 and s.p_sign == 1.0


def test_paired_matches_scipy():
    a = [0.297, 0.284, 0.282, 0.193, 0.313, 0.298, 0.309]
    b = [0.258, 0.249, 0.289, 0.237, 0.239, 0.275, 0.304]
    r = paired_comparison(a, b)
    rel = sps.ttest_rel(a, b, alternative="greater")
    assert (r.t, r.p_t) == pytest.approx((rel.statistic, rel.pvalue), rel=1e-9)
    d = np.subtract(a, b)
    assert r.wins == 5 and r.ties == 0
    assert r.p_sign == pytest.approx(sps.binomtest(5, 7, 0.5, alternative="greater").pvalue, rel=1e-12)
    assert r.sd == pytest.approx(np.std(d, ddof=1), rel=1e-12)
    assert (r.hi - r.lo) / 2 == pytest.approx(mean_ci(d)[1], rel=1e-12)


def test_paired_rejects_bad_input():
    with pytest.raises(ValueError):
        paired_comparison([1.0], [0.0])
    with pytest.raises(ValueError):
        paired_comparison([1.0, 2.0], [0.0, 1.0, 2.0])


def test_paired_constant_differences_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = paired_comparison([0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
        up = paired_comparison([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
        down = paired_comparison([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    assert same.mean == 0 and same.lo == same.hi == 0 and math.isnan(same.t) and math.isnan(same.p_t)
    assert same.ties == 3 and same.p_sign == 1.0
    assert up.t == math.inf and up.p_t == 0.0 and up.p_sign == pytest.approx(1 / 8, rel=1e-12)
    assert down.t == -math.inf and down.p_t == 1.0


def test_stats_does_not_import_torch():
    code = "import sys, trainer.stats; assert 'torch' not in sys.modules; assert 'scipy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# accuracies and rewards: multiples of 1/1000 in [-1, 1] (no catastrophic cancellation in the moments)
value = st.integers(-1000, 1000).map(lambda k: k / 1000)
samples = st.lists(value, min_size=2, max_size=30)


@settings(max_examples=200, deadline=None)
@given(samples, st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_interval_contains_the_mean(xs, confidence):
    mean, half = mean_ci(xs, confidence)
    assert half >= 0
    assert mean - half <= mean <= mean + half
    assert min(xs) - 1e-12 <= mean <= max(xs) + 1e-12
    assert half == pytest.approx(sps.t.ppf((1 + confidence) / 2, len(xs) - 1) * standard_error(xs), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(samples)
def test_paired_difference_of_identical_arms_is_zero(xs):
    r = paired_comparison(xs, list(xs))
    assert (r.mean, r.sd, r.lo, r.hi) == (0.0, 0.0, 0.0, 0.0)
    assert r.wins == 0 and r.ties == r.n == len(xs) and r.p_sign == 1.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(value, value), min_size=3, max_size=30))
def test_paired_is_antisymmetric(pairs):
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    r, s = paired_comparison(a, b), paired_comparison(b, a)
    assert s.mean == pytest.approx(-r.mean, abs=1e-12)
    assert (s.lo, s.hi) == pytest.approx((-r.hi, -r.lo), abs=1e-12)
    assert r.lo <= r.mean <= r.hi
    assert r.wins + s.wins + r.ties == r.n and r.ties == s.ties
    assert 0 <= r.p_sign <= 1 and 0 <= s.p_sign <= 1
    if len({x - y for x, y in pairs}) > 1:  # spread in the differences: the one-sided p-values add up to 1
        assert r.p_t + s.p_t == pytest.approx(1.0, abs=1e-9)
