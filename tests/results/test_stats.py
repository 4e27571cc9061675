"""Intervals over seeds, paired differences, tests over a family of comparisons (Holm, two one-sided
tests, the smallest detectable difference) and power-law fits against hand-computed cases,
scipy's tests, numpy's weighted polyfit and simulations with known truth."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from gmc.results.stats import (
    detectable,
    equivalence_p,
    fit_power_law,
    holm,
    mean_interval,
    p_value,
    paired_difference,
    problem_paired_se,
    t_quantile,
    t_test_power,
)

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
    # the evaluation noise is reported (both runs': sqrt(0.03^2 + 0.04^2)), not added to the seeds' spread
    q = paired_difference(a, b, [0.03] * 3, [0.04] * 3)
    assert q.se_eval == pytest.approx(0.05) and q.interval == p.interval
    # by hand: d = (0.1, -0.05, 0.2), mean 0.25/3, s_d^2 = ((1/60)^2 + (2/15)^2 + (7/60)^2) / 2 = 0.01583
    assert q.interval.half == pytest.approx(T975[2] * math.sqrt(0.0158333333 / 3), rel=1e-8)
    r = paired_difference([0.8, 0.9, 0.85], [0.5, 0.55, 0.5])
    assert r.excludes_zero and r.n_sign == 3


def test_paired_interval_covers_the_true_difference_95_percent_of_the_time_whatever_the_noise():
    """Simulated seeds with known truth: each seed's difference is a seed effect plus the
    evaluation noise of both runs, paired per problem. The interval of the differences alone
    covers the true difference in 95% of experiments (not more: adding the evaluation noise on
    top of the spread it is already part of over-covers), at three and at seven seeds."""
    rng = np.random.default_rng(4)
    true = 0.03
    for n, tau, se in ((3, 0.02, 0.03), (7, 0.0, 0.04), (7, 0.04, 0.01)):
        covered = folded = 0
        for _ in range(4000):
            a = 0.5 + rng.normal(0, tau, n) + rng.normal(0, se, n)
            b = 0.5 - true + rng.normal(0, se, n)
            p = paired_difference(a, b, [se] * n, [se] * n)
            covered += p.interval.lo <= true <= p.interval.hi
            wide = mean_interval(a - b, [math.sqrt(2) * se] * n)  # evaluation noise on top
            folded += wide.lo <= true <= wide.hi
        assert 0.935 <= covered / 4000 <= 0.965, (n, tau, se, covered / 4000)
        if tau < se:
            assert folded / 4000 > 0.975  # the evaluation counted twice: too wide


def test_paired_tests_keep_the_family_wise_error_at_its_level():
    """A family of eight true-null paired differences over five seeds (seed and evaluation noise
    both), 2,000 families: after Holm's adjustment some difference is called resolved in about 5%
    of them, no more (and near it: a family of independent tests at one true null each)."""
    rng = np.random.default_rng(8)
    hits = 0
    for _ in range(2000):
        ps = []
        for _ in range(8):
            a, b = rng.normal(0.5, 0.03, 5) + rng.normal(0, 0.02, 5), rng.normal(0.5, 0.03, 5)
            ps.append(p_value(paired_difference(a, b, [0.02] * 5, [0.02] * 5).interval))
        hits += bool((holm(ps) < 0.05).any())
    assert 0.035 <= hits / 2000 <= 0.065


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


# ---------------------------------------------------------------------------------------------
# tests over a family


def test_holm_hand_computed_and_nans_left_out():
    # sorted 0.01, 0.03, 0.04: 3 x 0.01 = 0.03, max(0.03, 2 x 0.03) = 0.06, max(0.06, 0.04) = 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    out = holm([0.2, float("nan"), 0.01, 0.6])
    assert math.isnan(out[1]) and out[[0, 2, 3]] == pytest.approx([0.4, 0.03, 0.6])  # m = 3
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]).size == 0


def test_p_value_is_scipys_one_sample_t_test_and_folds_evaluation_noise_in():
    d = np.array([0.05, 0.09, 0.02, 0.07, 0.04])
    assert p_value(mean_interval(d)) == pytest.approx(scipy_stats.ttest_1samp(d, 0).pvalue, rel=1e-10)
    noisy = p_value(mean_interval(d, [0.03] * 5))  # the evaluation's noise widens it
    t = d.mean() / math.sqrt((d.var(ddof=1) + 0.03**2) / 5)
    assert noisy == pytest.approx(2 * scipy_stats.t.sf(t, 4)) and noisy > p_value(mean_interval(d))
    assert math.isnan(p_value(mean_interval([0.1])))


def test_two_one_sided_tests_hand_computed_and_equivalent_to_the_90_percent_interval():
    iv = mean_interval(np.array([0.01, 0.02, 0.0, 0.015, 0.005, 0.01]))
    se = iv.se
    lower, upper = scipy_stats.t.sf((iv.mean + 0.05) / se, 5), scipy_stats.t.cdf((iv.mean - 0.05) / se, 5)
    assert equivalence_p(iv, 0.05) == pytest.approx(max(lower, upper)) and equivalence_p(iv, 0.05) < 0.05
    rng = np.random.default_rng(3)
    for _ in range(200):  # p < 0.05 exactly when the 90% interval lies inside the margin
        iv = mean_interval(rng.normal(rng.uniform(-0.08, 0.08), 0.03, 5))
        inside = abs(iv.mean) + t_quantile(4, 0.90) * iv.se < 0.05
        assert (equivalence_p(iv, 0.05) < 0.05) == inside


def test_holm_keeps_the_family_wise_error_where_unadjusted_tests_do_not():
    """Ten true-null differences over five seeds, 2,000 families: the chance that any is called
    resolved is at most 5% after Holm's adjustment (and about 40% without it)."""
    rng = np.random.default_rng(7)
    adjusted = unadjusted = 0
    for _ in range(2000):
        ps = [p_value(mean_interval(rng.normal(0, 0.04, 5), [0.01] * 5)) for _ in range(10)]
        adjusted += bool((holm(ps) < 0.05).any())
        unadjusted += min(ps) < 0.05
    assert adjusted / 2000 <= 0.06 and unadjusted / 2000 > 0.25


def test_equivalence_is_called_at_most_5_percent_of_the_time_at_the_margin():
    rng = np.random.default_rng(11)
    called = sum(equivalence_p(mean_interval(rng.normal(0.05, 0.03, 5)), 0.05) < 0.05 for _ in range(4000))
    assert called / 4000 <= 0.06


def test_the_detectable_difference_is_the_noncentral_t_one_and_is_found_with_80_percent_power():
    """At the first step of Holm's adjustment over m tests a true difference of
    ``detectable(sd, n, m)`` is resolved in 80% of the simulated experiments. The default bundle's
    Pass@1 family (8 tests, 5 seeds, spread 0.04435): the shift approximation
    ``(t_{1-0.05/16} + t_{0.8}) sd / sqrt(5)`` gives 0.123, the noncentral t 0.132."""
    sd, n, m = 0.04434604548039767, 5, 8
    shift = (scipy_stats.t.ppf(1 - 0.05 / 16, 4) + scipy_stats.t.ppf(0.8, 4)) * sd / math.sqrt(5)
    delta = detectable(sd, n, m)
    assert round(shift, 3) == 0.123 and round(delta, 3) == 0.132
    nc = delta * math.sqrt(5) / sd  # power by hand: both tails of the noncentral t
    c = scipy_stats.t.ppf(1 - 0.05 / 16, 4)
    assert scipy_stats.nct.sf(c, 4, nc) + scipy_stats.nct.cdf(-c, 4, nc) == pytest.approx(0.8, abs=1e-9)
    assert t_test_power(delta, sd, n, 0.05 / m) == pytest.approx(0.8, abs=1e-9)
    rng = np.random.default_rng(5)
    for spread, seeds, tests in ((0.04, 8, 6), (sd, n, m)):
        delta = detectable(spread, seeds, tests)
        hits = sum(p_value(mean_interval(rng.normal(delta, spread, seeds))) < 0.05 / tests for _ in range(4000))
        assert 0.775 <= hits / 4000 <= 0.825, (spread, seeds, tests, hits / 4000)
    assert detectable(0.0, 5, 8) == 0.0 and math.isnan(detectable(0.04, 1, 8))


def test_pairing_per_problem_removes_the_problems_difficulty():
    """Two evaluations of one difficulty profile: paired per problem, the error of their difference
    is that of the noise alone; unpaired it is that of difficulty and noise."""
    rng = np.random.default_rng(2)
    difficulty = rng.uniform(0, 1, 500)
    a = np.clip(difficulty + rng.normal(0, 0.05, 500), 0, 1)
    b = np.clip(difficulty + rng.normal(0, 0.05, 500), 0, 1)
    paired = problem_paired_se(a, b)
    assert paired == pytest.approx((a - b).std(ddof=1) / math.sqrt(500))
    unpaired = math.sqrt(a.var(ddof=1) / 500 + b.var(ddof=1) / 500)
    assert paired < unpaired / 3
    with pytest.raises(ValueError, match="equal length"):
        problem_paired_se([1.0, 0.0], [1.0])
    diff = paired_difference([0.6, 0.7, 0.65], [0.5, 0.6, 0.58], se_d=[paired] * 3)
    assert diff.se_eval == pytest.approx(paired) and diff.interval.se_eval == 0
