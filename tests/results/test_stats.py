"""Intervals over seeds, paired differences and power-law fits against hand-computed cases,
scipy's t-tests and numpy's weighted polyfit."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from gmc.results.stats import fit_power_law, mean_interval, paired_difference, t_quantile

T975 = {1: 12.706204736, 2: 4.302652730, 4: 2.776445105}  # printed tables of Student's t


def test_t_quantiles_match_printed_tables():
    for df, q in T975.items():
        assert t_quantile(df) == pytest.approx(q, abs=1e-8)
    assert t_quantile(math.inf) == pytest.approx(1.959963985, abs=1e-8)
    with pytest.raises(ValueError):
        t_quantile(0)


def test_mean_interval_hand_computed():
    iv = mean_interval([1.0, 2.0, 3.0])
    assert (iv.mean, iv.sd, iv.n) == (2.0, 1.0, 3)
    assert iv.half == pytest.approx(T975[2] / math.sqrt(3))
    assert (iv.lo, iv.hi) == pytest.approx((2 - iv.half, 2 + iv.half))
    # evaluation noise in quadrature: mean(se^2) = (0.09 + 0.16 + 0.25) / 3
    iv = mean_interval([1.0, 2.0, 3.0], [0.3, 0.4, 0.5])
    assert iv.se_eval == pytest.approx(math.sqrt(0.5 / 3))
    assert iv.half == pytest.approx(T975[2] * math.sqrt((1 + 0.5 / 3) / 3))
    assert not iv.excludes_zero and mean_interval([10.0, 11.0, 12.0], [0.3, 0.4, 0.5]).excludes_zero


def test_mean_interval_matches_scipy_one_sample_t():
    x = np.random.default_rng(0).normal(0.6, 0.05, size=5)
    ci = scipy_stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    iv = mean_interval(x)
    assert (iv.lo, iv.hi) == pytest.approx((ci.low, ci.high), rel=1e-10)


def test_one_seed_has_no_interval_and_nans_are_dropped():
    iv = mean_interval([0.7, float("nan")], [0.02, 0.5])
    assert iv.n == 1 and iv.mean == 0.7 and math.isnan(iv.half) and not iv.excludes_zero
    assert iv.se_eval == pytest.approx(0.02)
    assert mean_interval([]).n == 0
    with pytest.raises(ValueError, match="shape"):
        mean_interval([1.0, 2.0], [0.1])


def test_paired_difference_matches_scipy_paired_t_and_counts_signs():
    a, b = np.array([0.5, 0.6, 0.7]), np.array([0.4, 0.65, 0.5])
    p = paired_difference(a, b)
    ci = scipy_stats.ttest_rel(a, b).confidence_interval(0.95)
    assert (p.interval.lo, p.interval.hi) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert p.interval.mean == pytest.approx(0.25 / 3) and p.n_sign == 2 and not p.excludes_zero
    # evaluation noise of both runs adds up: var = s_d^2 / n + mean(se_a^2 + se_b^2) / n
    q = paired_difference(a, b, [0.03] * 3, [0.04] * 3)
    assert q.interval.half == pytest.approx(T975[2] * math.sqrt((np.var(a - b, ddof=1) + 0.0025) / 3))
    r = paired_difference([0.8, 0.9, 0.85], [0.5, 0.55, 0.5])
    assert r.excludes_zero and r.n_sign == 3


def test_interval_coverage_with_seed_and_evaluation_noise():
    """95% nominal; conservative (>= 95%) whether seeds or evaluation dominate the spread."""
    rng = np.random.default_rng(1)
    for tau, se in ((0.05, 0.01), (0.0, 0.03), (0.03, 0.03)):
        hits = 0
        for _ in range(4000):
            x = 0.5 + rng.normal(0, tau, 3) + rng.normal(0, se, 3)
            iv = mean_interval(x, [se] * 3)
            hits += iv.lo <= 0.5 <= iv.hi
        assert hits / 4000 >= 0.94, (tau, se, hits / 4000)


def test_power_law_fit_recovers_exact_exponents():
    x = np.geomspace(2, 1024, 10)
    for k in (-0.4, -2.0, -4.0, 1.5):
        fit = fit_power_law(x, 3.0 * x**k)
        assert fit.exponent == pytest.approx(k, abs=1e-10) and fit.prefactor == pytest.approx(3.0)
        assert fit.hi - fit.lo < 1e-8 and fit.n == 10


def test_power_law_fit_matches_numpy_weighted_polyfit_and_covers_truth():
    rng = np.random.default_rng(2)
    x = np.geomspace(0.02, 2.0, 12)
    covered = 0
    for rep in range(400):
        rel = 0.1
        y = 0.5 * x**-2.0 * np.exp(rng.normal(0, rel, x.size))
        fit = fit_power_law(x, y, rel * y)
        covered += fit.covers(-2.0)
        if rep == 0:
            coef, cov = np.polyfit(np.log(x), np.log(y), 1, w=np.full(x.size, 1 / rel), cov=True)
            assert fit.exponent == pytest.approx(coef[0], rel=1e-10)
            if fit.chi2_dof > 1:  # polyfit scales the covariance by chi^2 / dof too
                assert fit.se == pytest.approx(math.sqrt(cov[0, 0]), rel=1e-8)
    assert 0.92 <= covered / 400 <= 0.99


def test_power_law_fit_widens_when_the_curve_is_not_a_power_law_and_skips_zeros():
    x = np.geomspace(1, 1000, 10)
    y = np.exp(-x / 100)  # faster than any power: curvature, not noise
    fit = fit_power_law(x, y, 1e-3 * y)
    assert fit.chi2_dof > 100 and fit.hi - fit.lo > 0.5
    fit = fit_power_law([1, 2, 4, 8], [1.0, 0.5, 0.0, 0.125])
    assert fit.n == 3 and fit.exponent == pytest.approx(-1.0)
    assert math.isnan(fit_power_law([1, 2], [1, 2]).exponent)
