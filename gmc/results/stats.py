"""Statistics of a sweep (method.md section 7): mean ± 95% interval over seeds with the
evaluation noise folded in (:func:`mean_interval`), paired differences at equal seed with the
interval of their spread over seeds alone (:func:`paired_difference`), their p-values (:func:`p_value`) adjusted over a family of
comparisons (:func:`holm`), equivalence within a margin by two one-sided tests
(:func:`equivalence_p`), the smallest difference a family can detect (:func:`detectable`), and
power-law exponents with intervals (:func:`fit_power_law`, the theory lab's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize as _scipy_optimize
from scipy import stats as _scipy_stats

LEVEL = 0.95
"""Coverage of every interval this module returns."""


def t_quantile(df: float, level: float = LEVEL) -> float:
    """Two-sided Student-t quantile ``t_{(1+level)/2, df}`` (the normal one for ``df = inf``)."""
    if not df > 0:
        raise ValueError(f"t quantile needs df > 0, got {df}")
    return float(_scipy_stats.t.ppf(0.5 + level / 2, df))


@dataclass(frozen=True)
class Interval:
    """A mean over seeds with its interval; ``lo``, ``hi``, ``half`` are NaN below two seeds."""

    mean: float
    lo: float
    hi: float
    half: float
    n: int
    sd: float
    """Standard deviation over seeds (ddof 1)."""
    se_eval: float
    """Root mean square of the per-seed evaluation standard errors (0 when none are given)."""

    @property
    def excludes_zero(self) -> bool:
        return bool(self.lo > 0 or self.hi < 0)

    @property
    def se(self) -> float:
        """The mean's standard error, ``sqrt((sd² + se_eval²) / n)`` (NaN below two seeds)."""
        return math.sqrt((self.sd**2 + self.se_eval**2) / self.n) if self.n >= 2 else math.nan


def mean_interval(values, eval_se=None, level: float = LEVEL) -> Interval:
    """Mean of ``values`` (one per seed ``s``, NaNs dropped) with its t-interval.

    Each ``x_s`` carries an evaluation standard error ``se_s`` (Pass@1: across problems, as
    :mod:`gmc.run.evaluate` reports it), added in quadrature as a variance of the mean::

        x̄ ± t_{0.975, n-1} · sqrt(s² / n + mean(se_s²) / n)

    Why t and not a bootstrap: with three seeds a bootstrap has ten distinct resamples and its
    percentile interval is far too narrow; the t-interval is exact for normal seed effects and
    its ``n - 1`` degrees of freedom carry the uncertainty of ``s`` itself. Why add the
    evaluation term although ``s²`` already holds the noise of independent evaluations: three
    seeds can agree by chance (``s²`` below a third of its expectation with probability 0.28 at
    ``n = 3``), and the interval should never be narrower than the evaluation can resolve. It
    counts the evaluation noise twice at most: conservative by up to sqrt(2) in width when
    evaluation noise dominates, not at all when seed-to-seed variation does. One seed: no
    interval (NaN)."""
    x = np.asarray(values, dtype=float)
    se = np.zeros_like(x) if eval_se is None else np.asarray(eval_se, dtype=float)
    if se.shape != x.shape:
        raise ValueError(f"eval_se has shape {se.shape}, values {x.shape}")
    keep = np.isfinite(x)
    x, se = x[keep], np.nan_to_num(se[keep])
    n = len(x)
    if n == 0:
        return Interval(*(math.nan,) * 4, 0, math.nan, math.nan)
    mean = float(x.mean())
    se_eval = float(np.sqrt(np.mean(se**2)))
    if n < 2:
        return Interval(mean, math.nan, math.nan, math.nan, 1, math.nan, se_eval)
    sd = float(x.std(ddof=1))
    half = t_quantile(n - 1, level) * math.sqrt((sd**2 + se_eval**2) / n)
    return Interval(mean, mean - half, mean + half, half, n, sd, se_eval)


@dataclass(frozen=True)
class PairedDifference:
    """``a - b`` over the seeds where both ran: the interval and the sign count."""

    interval: Interval
    n_sign: int
    """Seeds where ``a - b`` has the sign of the mean difference (0 when the mean is 0)."""
    se_eval: float
    """Root mean square of the per-seed evaluation standard errors of the difference (0 when none
    are given): how much of the spread over seeds the evaluation alone would make. Reported, not
    added to the interval."""

    @property
    def excludes_zero(self) -> bool:
        return self.interval.excludes_zero


def paired_difference(a, b, se_a=None, se_b=None, level: float = LEVEL, se_d=None) -> PairedDifference:
    """Per-seed differences ``d_s = a[s] - b[s]`` (aligned arrays, NaN pairs dropped) and their
    t-interval from the differences alone::

        d̄ ± t_{0.975, n-1} · s_d / sqrt(n)

    Estimators run at the same (delay, G, seed) share the seed's data order and starting point,
    so the difference is taken per seed. Each ``d_s`` is measured with its own evaluation noise,
    and that noise is already part of the spread ``s_d`` of the independent seeds: the interval
    adds nothing for it (the paired t-test, exact for normal ``d_s``). The evaluation standard
    error of each seed's difference, ``se_d`` where given (paired per problem,
    :func:`problem_paired_se`), else ``sqrt(se_a² + se_b²)`` (independent evaluations), is
    reported as :attr:`PairedDifference.se_eval`; :attr:`PairedDifference.n_sign` counts the seeds
    whose difference has the mean's sign."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values need equal shapes, got {a.shape} and {b.shape}")
    zero = np.zeros_like(a)
    se_a = zero if se_a is None else np.nan_to_num(np.asarray(se_a, dtype=float))
    se_b = zero if se_b is None else np.nan_to_num(np.asarray(se_b, dtype=float))
    d = a - b
    se = np.sqrt(se_a**2 + se_b**2) if se_d is None else np.nan_to_num(np.asarray(se_d, dtype=float))
    if se.shape != d.shape:
        raise ValueError(f"se_d has shape {se.shape}, values {d.shape}")
    keep = np.isfinite(d)
    interval = mean_interval(d, level=level)
    d, se = d[keep], se[keep]
    n_sign = int((np.sign(d) == np.sign(interval.mean)).sum()) if interval.mean != 0 else 0
    se_eval = float(np.sqrt(np.mean(se**2))) if len(se) else math.nan
    return PairedDifference(interval, n_sign, se_eval)


def problem_paired_se(a, b) -> float:
    """The standard error of ``mean(a) - mean(b)`` for two evaluations of one checkpoint pair on
    the same problems, paired per problem: ``sd(a_i - b_i) / sqrt(n)`` over problems ``i`` (a
    problem's difficulty is common to both and cancels; with independent errors this is the
    unpaired ``sqrt(se_a² + se_b²)`` up to estimation noise)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or a.shape != b.shape or len(a) < 2:
        raise ValueError(
            f"per-problem scores of equal length (at least two problems) are needed, got {a.shape} and {b.shape}"
        )
    d = a - b
    return float(d.std(ddof=1) / math.sqrt(len(d)))


# ---------------------------------------------------------------------------------------------
# tests over a family of comparisons


ALPHA = 0.05
"""Family-wise error rate of every family's tests (Holm), and the size of each equivalence test."""
POWER = 0.8
"""The power at which :func:`detectable` states a family's smallest detectable difference."""


def p_value(interval: Interval) -> float:
    """Two-sided p-value of ``mean = 0`` for :func:`mean_interval`'s estimate: Student's t with
    ``n - 1`` degrees of freedom and the interval's standard error;
    NaN below two seeds; 1 for a mean of exactly 0 with no spread (a run compared with itself)."""
    if interval.n < 2 or not math.isfinite(interval.se):
        return math.nan
    if interval.se == 0:
        return 1.0 if interval.mean == 0 else 0.0
    return float(2 * _scipy_stats.t.sf(abs(interval.mean) / interval.se, interval.n - 1))


def equivalence_p(interval: Interval, margin: float) -> float:
    """p-value of two one-sided tests (TOST) that the true mean lies within ``±margin``: the larger
    of the p-values of ``mean <= -margin`` and ``mean >= margin``, Student's t with ``n - 1``
    degrees of freedom. Below ``ALPHA`` exactly when the ``1 - 2 ALPHA`` interval lies inside
    ``(-margin, margin)``. NaN below two seeds."""
    if interval.n < 2 or not math.isfinite(interval.se):
        return math.nan
    if interval.se == 0:
        return 0.0 if abs(interval.mean) < margin else 1.0
    df = interval.n - 1
    lower = _scipy_stats.t.sf((interval.mean + margin) / interval.se, df)
    upper = _scipy_stats.t.cdf((interval.mean - margin) / interval.se, df)
    return float(max(lower, upper))


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjustment of a family's p-values (NaNs left out of the family and
    returned as NaN): sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``.
    Rejecting where the adjusted value is below ``alpha`` keeps the family-wise error at ``alpha``
    under any dependence between the tests."""
    p = np.asarray(p_values, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = len(idx)
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


def t_test_power(delta: float, sd: float, n: int, level: float) -> float:
    """Probability that a two-sided one-sample t-test at ``level`` over ``n`` values of standard
    deviation ``sd`` rejects ``mean = 0`` when the true mean is ``delta``: under that truth the
    statistic is noncentral t with ``n - 1`` degrees of freedom and noncentrality
    ``delta sqrt(n) / sd``, so ``P(T > c) + P(T < -c)`` with ``c = t_{1-level/2, n-1}`` (both tails)."""
    df, nc = n - 1, delta * math.sqrt(n) / sd
    c = _scipy_stats.t.ppf(1 - level / 2, df)
    # P(T < -c | nc) = P(T > c | -nc): scipy's cdf far in the lower tail is NaN, its sf is not
    return float(_scipy_stats.nct.sf(c, df, nc) + _scipy_stats.nct.sf(c, df, -nc))


def detectable(sd: float, n: int, m: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true difference a paired t-test over ``n`` seeds with per-seed standard
    deviation ``sd`` detects with probability ``power``, at the level of the first step of Holm's
    adjustment over ``m`` tests (``alpha / m``, two-sided): the root of
    ``t_test_power(delta, sd, n, alpha / m) = power`` (:func:`t_test_power`, the exact noncentral t;
    the shift approximation ``(t_{1-alpha/(2m)} + t_{power}) sd / sqrt(n)`` falls short of it,
    ``2.77 sd`` against ``2.98 sd`` at five seeds and eight tests). 0 where
    ``sd`` is; NaN below two seeds."""
    if n < 2 or not math.isfinite(sd) or m < 1:
        return math.nan
    if sd == 0:
        return 0.0
    level = alpha / m
    shift = (_scipy_stats.t.ppf(1 - level / 2, n - 1) + _scipy_stats.t.ppf(power, n - 1)) * sd / math.sqrt(n)
    hi = shift
    while t_test_power(hi, sd, n, level) < power:  # the shift approximation is a lower bracket
        hi *= 2
    return float(_scipy_optimize.brentq(lambda d: t_test_power(d, sd, n, level) - power, 0.0, hi, xtol=1e-12))


def seeds_for(
    sd: float, difference: float, m: int, alpha: float = ALPHA, power: float = POWER, most: int = 1000
) -> int:
    """The fewest seeds at which a family of ``m`` tests detects ``difference`` with probability
    ``power`` after Holm's adjustment, given a per-seed standard deviation ``sd``: the smallest
    ``n >= 2`` with :func:`detectable` ``(sd, n, m) <= difference`` (the exact noncentral t at the
    level of Holm's first step). A ValueError where ``most`` seeds do not reach it."""
    if not (difference > 0 and math.isfinite(sd) and sd >= 0):
        raise ValueError(f"seeds_for needs a difference > 0 and a finite sd >= 0, got {difference} and {sd}")
    for n in range(2, most + 1):
        if detectable(sd, n, m, alpha, power) <= difference:
            return n
    raise ValueError(f"{most} seeds do not detect {difference} at sd {sd} over {m} tests")


@dataclass(frozen=True)
class PowerLaw:
    """``y = prefactor * x ** exponent`` fitted in log-log space, with the exponent's interval."""

    exponent: float
    lo: float
    hi: float
    se: float
    prefactor: float
    n: int
    chi2_dof: float
    """Reduced chi-square of the weighted fit (1 when the scatter matches ``se``; NaN unweighted)."""

    def covers(self, value: float) -> bool:
        return bool(self.lo <= value <= self.hi)


MIN_FIT_POINTS = 3
"""Points a power law's fit needs (:func:`fit_power_law`: an interval needs a residual degree of freedom)."""


def fit_power_law(x, y, y_se=None, level: float = LEVEL) -> PowerLaw:
    """Exponent of ``y ~ x**k`` over the points with ``x, y > 0``: weighted least squares of
    ``log y`` on ``log x`` with weights ``1 / se(log y)²`` (delta method: ``se(y) / y``); the
    slope's standard error is scaled by ``sqrt(chi² / (n - 2))`` when that exceeds 1, so a curve
    that is not a power law over the grid gets a wide interval rather than a false precision;
    t-interval with ``n - 2`` degrees of freedom.

    ``y_se`` are the standard errors of ``y``; without them the fit is ordinary least squares
    and the interval comes from the residuals alone.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    se = np.full_like(y, np.nan) if y_se is None else np.asarray(y_se, dtype=float)
    keep = (x > 0) & (y > 0) & np.isfinite(y)
    if y_se is not None:
        keep &= np.isfinite(se) & (se > 0)
    lx, ly = np.log(x[keep]), np.log(y[keep])
    n = len(lx)
    if n < MIN_FIT_POINTS or np.ptp(lx) == 0:
        return PowerLaw(*(math.nan,) * 5, n, math.nan)
    w = np.ones(n) if y_se is None else (y[keep] / se[keep]) ** 2  # 1 / se(log y)^2
    X = np.stack([np.ones(n), lx], axis=1)
    XtW = X.T * w
    cov = np.linalg.inv(XtW @ X)
    beta = cov @ (XtW @ ly)
    resid = ly - X @ beta
    chi2_dof = float((w * resid**2).sum() / (n - 2))
    scale = chi2_dof if y_se is None else max(1.0, chi2_dof)
    se_k = math.sqrt(cov[1, 1] * scale)
    half = t_quantile(n - 2, level) * se_k
    k = float(beta[1])
    return PowerLaw(k, k - half, k + half, se_k, float(np.exp(beta[0])), n, math.nan if y_se is None else chi2_dof)
