"""Statistics of a sweep (method.md section 7): mean ± 95% interval over seeds with the
evaluation noise folded in (:func:`mean_interval`), paired differences at equal seed
(:func:`paired_difference`) and power-law exponents with intervals (:func:`fit_power_law`,
the theory lab's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
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

    @property
    def excludes_zero(self) -> bool:
        return self.interval.excludes_zero


def paired_difference(a, b, se_a=None, se_b=None, level: float = LEVEL) -> PairedDifference:
    """Per-seed differences ``a[s] - b[s]`` (aligned arrays, NaN pairs dropped) and their interval.

    Estimators run at the same (delay, G, seed) share the seed's data order and starting point,
    so the difference is taken per seed and gets :func:`mean_interval` with ``se_a² + se_b²`` as
    its evaluation variance; :attr:`PairedDifference.n_sign` counts the seeds whose difference has
    the mean's sign."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values need equal shapes, got {a.shape} and {b.shape}")
    zero = np.zeros_like(a)
    se_a = zero if se_a is None else np.nan_to_num(np.asarray(se_a, dtype=float))
    se_b = zero if se_b is None else np.nan_to_num(np.asarray(se_b, dtype=float))
    d = a - b
    interval = mean_interval(d, np.sqrt(se_a**2 + se_b**2), level)
    d = d[np.isfinite(d)]
    n_sign = int((np.sign(d) == np.sign(interval.mean)).sum()) if interval.mean != 0 else 0
    return PairedDifference(interval, n_sign)


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
    if n < 3 or np.ptp(lx) == 0:
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
    return PowerLaw(k, k - half, k + half, se_k, float(np.exp(beta[0])), n,
                    math.nan if y_se is None else chi2_dof)
