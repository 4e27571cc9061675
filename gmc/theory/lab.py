"""Theory lab (method.md section 1): an exactly solvable world in which the paper's claims are
checked numerically. A tabular autoregressive softmax policy over every sequence of ``T``
tokens from a vocabulary of ``V``, rewarded when the last token is the sum of the others mod
``V``: expected reward and its gradient are exact sums (``grad log pi(y_t | prefix)`` is
``onehot(y_t) - softmax(logits)``). Two experiments: estimators at fixed behaviour and current
policies (:func:`fixed_policy_experiment`, claims 1-3) and delayed gradient ascent
(:func:`delayed_run`); figures are :mod:`gmc.theory.figures`.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from gmc.io import write_csv, write_json
from gmc.results.stats import fit_power_law, mean_interval

# ---------------------------------------------------------------------------------------------
# the world


@dataclass
class TabularWorld:
    """Every sequence of a tabular autoregressive softmax policy, with its prefix nodes."""

    V: int = 4
    T: int = 4

    def __post_init__(self) -> None:
        V, T = self.V, self.T
        self.seqs = np.array(list(itertools.product(range(V), repeat=T)), dtype=np.int64)  # [N, T]
        self.N = len(self.seqs)
        # node index of the prefix y_<t: level offset + base-V code of the prefix
        offsets = np.cumsum([0] + [V**t for t in range(T)])
        self.n_nodes = int(offsets[-1])
        self.nodes = np.zeros((self.N, T), dtype=np.int64)
        code = np.zeros(self.N, dtype=np.int64)
        for t in range(T):
            self.nodes[:, t] = offsets[t] + code
            code = code * V + self.seqs[:, t]
        self.reward = (self.seqs[:, -1] == self.seqs[:, :-1].sum(1) % V).astype(np.float64)
        self.n_params = self.n_nodes * V

    def token_log_probs(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``log pi(y_t | y_<t)`` for every sequence ``[N, T]`` and the node softmaxes ``[n_nodes, V]``."""
        z = theta - theta.max(axis=1, keepdims=True)
        logp_nodes = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return logp_nodes[self.nodes, self.seqs], np.exp(logp_nodes)

    def seq_probs(self, theta: np.ndarray) -> np.ndarray:
        lp, _ = self.token_log_probs(theta)
        return np.exp(lp.sum(1))

    def expected_reward(self, theta: np.ndarray) -> float:
        return float(self.seq_probs(theta) @ self.reward)

    def token_grad(self, probs_nodes: np.ndarray, coef: np.ndarray) -> np.ndarray:
        """``sum_{y,t} coef[y,t] grad log pi(y_t | y_<t)`` as a ``[n_nodes, V]`` array."""
        grad = np.zeros((self.n_nodes, self.V))
        flat_nodes = self.nodes.ravel()
        c = coef.ravel()
        np.add.at(grad, (flat_nodes, self.seqs.ravel()), c)
        np.add.at(grad, flat_nodes, -c[:, None] * probs_nodes[flat_nodes])
        return grad

    def score_matrix(self, theta: np.ndarray) -> np.ndarray:
        """``S[y] = grad log pi(y)`` flattened, ``[N, n_params]``."""
        _, probs_nodes = self.token_log_probs(theta)
        S = np.zeros((self.N, self.n_nodes, self.V))
        rows = np.arange(self.N)
        for t in range(self.T):
            node = self.nodes[:, t]
            S[rows, node, :] -= probs_nodes[node]
            S[rows, node, self.seqs[:, t]] += 1.0
        return S.reshape(self.N, -1)

    def exact_gradient(self, theta: np.ndarray) -> np.ndarray:
        p = self.seq_probs(theta)
        return self.score_matrix(theta).T @ (p * (self.reward - p @ self.reward))


# ---------------------------------------------------------------------------------------------
# experiment 1: fixed behaviour and current policies


def _bias_norm(samples: np.ndarray, target_samples: np.ndarray | None = None, gram_n: int = 500):
    """Debiased Monte Carlo estimate of ``||E x - E y||`` (``y``: target samples, or 0) with a
    95% interval and a standard error.

    ``||x̄ - ȳ||^2`` overestimates the squared norm by ``tr(Σ)``, ``Σ = C_x/n + C_y/m`` (the
    target's own Monte Carlo noise included when it is estimated); we subtract it and use the
    delta-method variance ``4 d'Σd + 2 tr(Σ^2)`` of the squared norm for the interval.
    ``tr(Σ^2)`` comes from ``gram_n``-row subsamples: it only matters where the bias is near 0.
    Returns ``(bias, lo, hi, se)``, ``se`` the standard error of the bias (NaN at 0).
    """
    parts = [(samples, 1.0)] + ([] if target_samples is None else [(target_samples, -1.0)])
    means = [x.mean(0) for x, _ in parts]
    d = sum(sign * mu for (_, sign), mu in zip(parts, means))
    tr_sigma, var_proj, subs = 0.0, 0.0, []
    for (x, _), mu in zip(parts, means):  # no centred copy of x: sums of squares and projections
        n = len(x)
        tr_sigma += (float(np.einsum("ij,ij->", x, x)) - n * float(mu @ mu)) / (n - 1) / n
        proj = x @ d - float(mu @ d)
        var_proj += float(proj @ proj) / (n - 1) / n
        subs.append((x[:gram_n] - mu, n))
    tr_sigma2 = 0.0  # tr((sum_k C_k / n_k)^2) = sum_{k,l} ||X_k X_l'||_F^2 / (a_k a_l n_k n_l)
    for xa, na in subs:
        for xb, nb in subs:
            tr_sigma2 += float(((xa @ xb.T) ** 2).sum()) / (len(xa) * len(xb) * na * nb)
    b2 = float(d @ d) - tr_sigma
    var_b2 = 4 * var_proj + 2 * tr_sigma2
    half = 1.96 * math.sqrt(max(var_b2, 0.0))
    bias = math.sqrt(max(b2, 0.0))
    se = math.sqrt(max(var_b2, 0.0)) / (2 * bias) if bias > 0 else float("nan")
    return bias, math.sqrt(max(b2 - half, 0.0)), math.sqrt(max(b2 + half, 0.0)), se


def _group_norm_estimate(counts, w, r, S, rbar, sd, G):
    """``(1/G) sum_i w(y_i) (r_i - rbar) / sd * S(y_i)`` per Monte Carlo group, from counts
    (``counts`` may hold a subset of the sequences, with ``w``, ``r``, ``S`` restricted alike)."""
    num = counts @ ((w * r)[:, None] * S) - rbar[:, None] * (counts @ (w[:, None] * S))
    return num / (sd[:, None] * G)


FIXED_ALGORITHMS = ("tic", "gmc", "is")
"""Estimators of the fixed-policy experiment; ``is`` (uncapped) is the reference, in the
``group_norm`` variant only (with the exact baseline it is unbiased by construction)."""


def fixed_policy_experiment(
    world: TabularWorld,
    group_sizes: list[int],
    eps_values: list[float],
    drifts: list[float],
    n_rep: int,
    seed: int = 0,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (variant, drift, G, eps, algorithm): bias against the target with its interval,
    the excess over uncapped IS ``||E g - E g_is||`` (the bias the cap adds), second moment,
    shortfall and fraction capped.

    The behaviour policy ``mu`` is the current policy moved by a random logit drift; per group
    size and cap, Monte Carlo estimates (with intervals) of ``||E g_hat - grad J||``,
    ``E||g_hat||^2`` and the shortfall ``E[(1/G) sum_i (rho_i - w_i)]`` of ``tic`` (truncate) and
    ``gmc``. Variant ``exact_baseline`` uses ``A = r - J(pi)``: the only bias is the weights',
    estimated with uncapped IS (exactly unbiased there) as a control variate. Variant
    ``group_norm`` uses group-normalised advantages and measures the bias against the on-policy
    expectation of the same estimator (itself a Monte Carlo mean, whose noise the interval
    includes); there even uncapped IS (``is`` rows) keeps a bias floor, since the advantages use
    the behaviour group's mean and std, and ``excess`` is the bias the cap adds over it.
    :func:`claim_fits` fits the exponent of the excess in eps (claim 1) and in G (claims 2-3)."""
    rng = np.random.default_rng(seed)
    theta_pi = 0.5 * rng.standard_normal((world.n_nodes, world.V))
    direction = rng.standard_normal((world.n_nodes, world.V))
    p_pi = world.seq_probs(theta_pi)
    S = world.score_matrix(theta_pi)
    r = world.reward
    J = float(p_pi @ r)
    g_true = S.T @ (p_pi * (r - J))
    rows = []
    combos = list(itertools.product(drifts, group_sizes))
    for drift, G in tqdm(combos, desc="theory: fixed policies", disable=not progress):
        p_mu = world.seq_probs(theta_pi + drift * direction)
        log_rho = np.log(p_pi) - np.log(p_mu)
        rho = np.exp(log_rho)
        point = dict(
            drift=drift,
            kl_mu_pi=float(p_mu @ -log_rho),
            rho_second_moment=float(p_mu @ rho**2),
            rho_max_dev=float(np.abs(rho - 1).max()),
            G=G,
            n_rep=n_rep,
        )
        counts = rng.multinomial(G, p_mu, size=n_rep).astype(np.float64)  # [n, N]
        counts_on = rng.multinomial(G, p_pi, size=n_rep).astype(np.float64)
        m = counts @ rho / G
        g_is = counts @ ((rho * (r - J))[:, None] * S) / G  # unbiased: E[g_is] = grad J
        # group-normalised advantages from the counts
        rbar, rbar_on = counts @ r / G, counts_on @ r / G
        sd = np.sqrt(np.maximum(counts @ r**2 / G - rbar**2, 0.0)) + 1e-6
        sd_on = np.sqrt(np.maximum(counts_on @ r**2 / G - rbar_on**2, 0.0)) + 1e-6
        on_policy = _group_norm_estimate(counts_on, np.ones_like(r), r, S, rbar_on, sd_on, G)
        norm_is = _group_norm_estimate(counts, rho, r, S, rbar, sd, G)
        is_bias = _bias_norm(norm_is, on_policy)
        is_row = dict(
            variant="group_norm",
            algorithm="is",
            bias=is_bias[0],
            bias_lo=is_bias[1],
            bias_hi=is_bias[2],
            bias_se=is_bias[3],
            excess=0.0,
            excess_lo=0.0,
            excess_hi=0.0,
            excess_se=float("nan"),
            rel_bias=is_bias[0] / float(np.linalg.norm(on_policy.mean(0))),
            second_moment=float((norm_is**2).sum(1).mean()),
            shortfall=0.0,
            shortfall_se=0.0,
            frac_capped=0.0,
            exact_bias=float("nan"),
        )

        for eps in eps_values:
            cap = 1.0 + eps
            w_tic = np.minimum(rho, cap)
            c_gmc = np.minimum(1.0, cap / m)
            cut = rho - w_tic  # what truncation removes: nonzero only where rho > 1 + eps
            short = {"tic": counts @ cut / G, "gmc": m - c_gmc * m}
            A_exact = r - J
            big = cut > 0  # the cap's share of each estimate, over those sequences only
            removed_exact = counts[:, big] @ ((cut * A_exact)[big, None] * S[big]) / G
            removed_norm = _group_norm_estimate(counts[:, big], cut[big], r[big], S[big], rbar, sd, G)
            est_exact = {"tic": g_is - removed_exact, "gmc": c_gmc[:, None] * g_is}
            est_norm = {"tic": norm_is - removed_norm, "gmc": c_gmc[:, None] * norm_is}
            exact_tic_bias = float(np.linalg.norm(S.T @ (p_mu * w_tic * A_exact) - g_true))
            for algorithm in ("tic", "gmc"):
                frac = float((m > cap).mean() if algorithm == "gmc" else (counts @ (rho > cap)).mean() / G)
                for variant, est, reference in (
                    ("exact_baseline", est_exact[algorithm], g_is),
                    ("group_norm", est_norm[algorithm], norm_is),
                ):
                    # the cap's own bias E[g - g_is], by control variate: 0 on every group the cap
                    # leaves alone. With the exact baseline E[g_is] = grad J, so it is the bias.
                    excess = _bias_norm(est - reference)
                    bias = excess if variant == "exact_baseline" else _bias_norm(est, on_policy)
                    target = g_true if variant == "exact_baseline" else on_policy.mean(0)
                    sf = short[algorithm]
                    rows.append(
                        dict(
                            point,
                            eps=eps,
                            variant=variant,
                            algorithm=algorithm,
                            bias=bias[0],
                            bias_lo=bias[1],
                            bias_hi=bias[2],
                            bias_se=bias[3],
                            excess=excess[0],
                            excess_lo=excess[1],
                            excess_hi=excess[2],
                            excess_se=excess[3],
                            rel_bias=bias[0] / float(np.linalg.norm(target)),
                            second_moment=float((est**2).sum(1).mean()),
                            shortfall=float(sf.mean()),
                            shortfall_se=float(sf.std(ddof=1) / math.sqrt(n_rep)),
                            frac_capped=frac,
                            exact_bias=exact_tic_bias
                            if (algorithm == "tic" and variant == "exact_baseline")
                            else float("nan"),
                        )
                    )
            rows.append(dict(point, eps=eps, **is_row))
    columns = ["variant", "drift", "kl_mu_pi", "rho_second_moment", "rho_max_dev", "G", "eps", "algorithm"]
    frame = pd.DataFrame(rows)
    return frame[columns + [c for c in frame.columns if c not in columns]]


def _fit(grp: pd.DataFrame, x: str, y: str):
    """Power law of ``y`` in ``x`` over the points where ``y`` is resolved (interval excludes 0)."""
    ok = grp[grp[f"{y}_lo"] > 0]
    return fit_power_law(ok[x], ok[y], ok[f"{y}_se"])


def bias_slopes(fixed: pd.DataFrame) -> pd.DataFrame:
    """Exponent of the bias and of the excess over IS in G per (variant, drift, eps, algorithm),
    over the group sizes where each is resolved (:func:`gmc.results.stats.fit_power_law`, 95% intervals)."""
    rows = []
    capped = fixed[fixed["algorithm"] != "is"]
    for key, grp in capped.groupby(["variant", "drift", "eps", "algorithm"]):
        grp = grp.sort_values("G")
        b, e = _fit(grp, "G", "bias"), _fit(grp, "G", "excess")
        rows.append(
            dict(
                zip(["variant", "drift", "eps", "algorithm"], key),
                slope=b.exponent,
                slope_lo=b.lo,
                slope_hi=b.hi,
                n_points=b.n,
                excess_slope=e.exponent,
                excess_lo=e.lo,
                excess_hi=e.hi,
                excess_points=e.n,
                bias_at_min_G=float(grp["bias"].iloc[0]),
                bias_at_max_G=float(grp["bias"].iloc[-1]),
                excess_at_min_G=float(grp["excess"].iloc[0]),
                excess_at_max_G=float(grp["excess"].iloc[-1]),
            )
        )
    return pd.DataFrame(rows)


CLAIM_EXPONENTS = {("1", "tic"): -4.0, ("1", "gmc"): -2.0, ("2/3", "tic"): 0.0, ("2/3", "gmc"): -0.4}
"""The exponents the paper's claims state (method.md section 1). Claim 1: the delay term's
dependence on the cap, eps^-4 for tic against eps^-2 for gmc. Claim 2: tic's bias does not
fall with G (exponent 0); gmc's does. Claim 3: gmc's delay-dependent term falls like G^(-2/5)."""


def claim_fits(fixed: pd.DataFrame, pair: str = "drift", claims: tuple[str, ...] = ("1", "2/3")) -> pd.DataFrame:
    """Fitted exponents of the cap's bias (the excess over uncapped IS; with the exact baseline,
    the bias itself) in eps per G (claim 1) and in G per eps (claims 2-3), per variant, pair of
    policies (column ``pair``: the tabular drift, or the gradient lab's delay) and algorithm, with
    95% intervals and whether they cover the claim's exponent."""
    rows = []
    capped = fixed[fixed["algorithm"] != "is"]
    for claim, x, fixed_axis in (("1", "eps", "G"), ("2/3", "G", "eps")):
        if claim not in claims:
            continue
        for (variant, at_pair, at, algorithm), grp in capped.groupby(["variant", pair, fixed_axis, "algorithm"]):
            fit = _fit(grp.sort_values(x), x, "excess")
            ref = CLAIM_EXPONENTS[(claim, algorithm)]
            rows.append(
                {
                    "claim": claim,
                    "x": x,
                    "variant": variant,
                    pair: at_pair,
                    "rho_max_dev": float(grp["rho_max_dev"].iloc[0]),
                    "at": f"{fixed_axis}={at:g}",
                    "algorithm": algorithm,
                    "exponent": fit.exponent,
                    "lo": fit.lo,
                    "hi": fit.hi,
                    "n_points": fit.n,
                    "chi2_dof": fit.chi2_dof,
                    "x_min": float(grp[x].min()),
                    "x_max": float(grp[x].max()),
                    "reference": ref,
                    "covers_reference": fit.covers(ref),
                    "excludes_zero": bool(fit.lo > 0 or fit.hi < 0),
                }
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# experiment 2: delayed optimisation

DELAYED_ALGORITHMS = ("grpo", "tic", "gmc", "is", "none")


def delayed_run(
    world: TabularWorld,
    algorithm: str,
    delay: int,
    eps: float,
    G: int,
    iters: int,
    lr: float,
    groups_per_step: int,
    seed: int,
    target: float,
    is_clamp: float = 20.0,
) -> dict:
    """Gradient ascent where step ``t`` learns from samples of ``theta_{max(t-d, 0)}``."""
    rng = np.random.default_rng(seed)
    theta = np.zeros((world.n_nodes, world.V))
    history = [theta.copy()]
    r = world.reward
    B = groups_per_step
    rewards, hit = [], None
    diverged = False
    for t in range(iters):
        lp_cur, probs_nodes = world.token_log_probs(theta)
        J = float(np.exp(lp_cur.sum(1)) @ r)
        rewards.append(J)
        if hit is None and J >= target:
            hit = t
        behaviour = history[max(len(history) - 1 - delay, 0)]
        lp_mu, _ = world.token_log_probs(behaviour)
        p_mu = np.exp(lp_mu.sum(1))
        counts = rng.multinomial(G, p_mu / p_mu.sum(), size=B).astype(np.float64)  # [B, N]
        rbar = counts @ r / G
        sd = np.sqrt(np.maximum(counts @ r**2 / G - rbar**2, 0.0)) + 1e-6
        A = (r[None, :] - rbar[:, None]) / sd[:, None]  # [B, N]
        l_tok = lp_cur - lp_mu  # [N, T]
        L = l_tok.sum(1)
        if algorithm == "grpo":
            ratio = np.exp(np.minimum(l_tok, 50.0))[None]  # [1, N, T]
            Ab = A[:, :, None]
            clipped = ((Ab > 0) & (ratio > 1 + eps)) | ((Ab < 0) & (ratio < 1 - eps))
            coef = np.where(clipped, 0.0, ratio * Ab) * counts[:, :, None]
            coef_tok = coef.sum(0)
        else:
            if algorithm == "tic":
                w = np.broadcast_to(np.exp(np.minimum(L, math.log1p(eps))), counts.shape)
            elif algorithm == "gmc":
                log_m = np.log(counts @ np.exp(L - L.max()) / G) + L.max()
                c = np.exp(np.minimum(0.0, math.log1p(eps) - log_m))
                w = c[:, None] * np.exp(np.minimum(L, 50.0))[None]
            elif algorithm == "is":
                w = np.broadcast_to(np.exp(np.minimum(L, is_clamp)), counts.shape)
            elif algorithm == "none":
                w = np.ones_like(counts)
            else:
                raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {DELAYED_ALGORITHMS}")
            coef_seq = (counts * w * A).sum(0)  # [N]
            coef_tok = np.repeat(coef_seq[:, None], world.T, axis=1)
        grad = world.token_grad(probs_nodes, coef_tok) / (B * G * world.T)
        theta = theta + lr * grad
        if not np.all(np.isfinite(theta)) or np.abs(theta).max() > 1e4:
            diverged = True
            break
        history.append(theta.copy())
        if len(history) > delay + 1:
            history.pop(0)
    final = float("nan") if diverged else world.expected_reward(theta)
    tail = rewards[-max(1, iters // 10) :]
    return dict(
        algorithm=algorithm,
        delay=delay,
        eps=eps,
        G=G,
        seed=seed,
        iters=iters,
        lr=lr,
        initial_reward=rewards[0],
        final_reward=final,
        tail_mean_reward=float("nan") if diverged else float(np.mean(tail)),
        max_reward=float(np.max(rewards)),
        diverged=bool(diverged or final < rewards[0] - 0.05),
        iters_to_target=float("nan") if hit is None else float(hit),
    )


def delayed_experiment(
    world, algorithms, delays, eps_values, group_sizes, seeds, iters, lr, groups_per_step, target, progress=True
) -> pd.DataFrame:
    combos = list(itertools.product(algorithms, delays, eps_values, group_sizes, seeds))
    rows = [
        delayed_run(world, m, d, e, g, iters, lr, groups_per_step, s, target)
        for m, d, e, g, s in tqdm(combos, desc="theory: delayed ascent", disable=not progress)
    ]
    return pd.DataFrame(rows)


def summarise_delayed(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean final reward over seeds with its 95% t-interval (:func:`gmc.results.stats.mean_interval`)."""
    rows = []
    for key, grp in runs.groupby(["algorithm", "delay", "eps", "G"]):
        iv = mean_interval(grp["tail_mean_reward"])
        rows.append(
            dict(
                zip(["algorithm", "delay", "eps", "G"], key),
                final_reward=iv.mean,
                final_reward_std=iv.sd,
                final_reward_lo=iv.lo,
                final_reward_hi=iv.hi,
                diverged=float(grp["diverged"].mean()),
                iters_to_target=float(grp["iters_to_target"].median()),
                seeds=len(grp),
            )
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# entry point


@dataclass(frozen=True)
class TheoryConfig:
    """Sizes of the theory lab; ``quick`` takes seconds, the full run a few minutes on one core."""

    V: int = 4
    """Vocabulary size of the tabular world."""
    T: int = 4
    """Sequence length (V**T sequences are enumerated)."""
    group_sizes: tuple[int, ...] = tuple(2**k for k in range(1, 13))
    """Group sizes G for the fixed-policy experiment (2 ... 4096: the range of the G exponents)."""
    eps_values: tuple[float, ...] = (0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
    """Caps 1+eps (six octaves: the range of the eps exponents)."""
    drifts: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0)
    """Scale of the random logit drift from current to behaviour policy."""
    n_rep: int = 8000
    """Monte Carlo groups per (drift, G)."""
    delays: tuple[int, ...] = (0, 4, 16, 64)
    """Fixed delays d of the delayed-ascent experiment."""
    delayed_eps: tuple[float, ...] = (0.1, 0.2, 0.5)
    delayed_group_sizes: tuple[int, ...] = (4, 16)
    seeds: tuple[int, ...] = (0, 1, 2)
    iters: int = 400
    """Gradient-ascent iterations per delayed run."""
    lr: float = 4.0
    """Step size of the delayed ascent (the gradient is small in this world)."""
    groups_per_step: int = 8
    target_reward: float = 0.9
    seed: int = 0

    @classmethod
    def quick(cls) -> TheoryConfig:
        return cls(
            group_sizes=(2, 8, 32, 128, 512),
            eps_values=(0.1, 0.4, 1.6),
            drifts=(0.5,),
            n_rep=1000,
            delays=(0, 16, 64),
            delayed_eps=(0.2,),
            delayed_group_sizes=(8,),
            seeds=(0,),
            iters=200,
        )


def run_theory(out: str | Path, cfg: TheoryConfig, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Run both experiments, write tidy CSVs and the figures under ``out``."""
    from gmc.theory.figures import theory_figures

    out = Path(out)
    start = time.time()
    world = TabularWorld(cfg.V, cfg.T)
    fixed = fixed_policy_experiment(
        world, list(cfg.group_sizes), list(cfg.eps_values), list(cfg.drifts), cfg.n_rep, cfg.seed, progress
    )
    slopes = bias_slopes(fixed)
    claims = claim_fits(fixed)
    runs = delayed_experiment(
        world,
        DELAYED_ALGORITHMS,
        list(cfg.delays),
        list(cfg.delayed_eps),
        list(cfg.delayed_group_sizes),
        list(cfg.seeds),
        cfg.iters,
        cfg.lr,
        cfg.groups_per_step,
        cfg.target_reward,
        progress,
    )
    summary = summarise_delayed(runs)
    tables = {
        "fixed_policy": fixed,
        "bias_slopes": slopes,
        "claims": claims,
        "delayed_runs": runs,
        "delayed_summary": summary,
    }
    for name, frame in tables.items():
        write_csv(frame, out / f"{name}.csv")
    theory_figures(tables, out)
    write_json(out / "theory_config.json", {**asdict(cfg), "seconds": round(time.time() - start, 1)})
    return tables


def run_from_args(args: argparse.Namespace) -> None:
    cfg = TheoryConfig.quick() if args.quick else TheoryConfig()
    cfg = TheoryConfig(**{**asdict(cfg), "seed": args.seed})
    tables = run_theory(args.out, cfg)
    cols = ["claim", "variant", "drift", "at", "algorithm", "exponent", "lo", "hi", "n_points", "chi2_dof", "reference"]
    print(tables["claims"][cols].to_string(index=False))
    print(tables["delayed_summary"].to_string(index=False))
