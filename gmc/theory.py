"""Theory lab: an exactly solvable world in which the paper's claims can be checked numerically.

The world is a tabular autoregressive softmax policy over sequences of ``T`` tokens from a
vocabulary of ``V`` (every sequence enumerable), one logit vector per prefix. The reward is
1 when the last token equals the sum of the previous ones modulo ``V`` (a "compute, then
answer" task; 1/V under the uniform policy). Expected reward and its gradient are exact sums.

Two experiments (method.md section 1):

* **Fixed policies (claim 2).** The behaviour policy ``mu`` is the current policy ``pi`` moved
  by a random logit drift. For each group size ``G`` and cap ``eps`` we estimate, by Monte
  Carlo with confidence intervals, the bias norm ``||E g_hat - grad J||``, the second moment
  ``E||g_hat||^2`` and the shortfall ``E[(1/G) sum_i (rho_i - w_i)]`` of the ``tic``
  (truncate) and ``gmc`` estimators. Variant ``exact_baseline`` uses ``A = r - J(pi)``, so
  the only bias is the weights' (estimated with the uncapped IS estimator, exactly unbiased
  there, as a control variate); variant ``group_norm`` uses group-normalised advantages and
  measures the bias against the on-policy expectation of the same estimator.
* **Delayed optimisation (claims 1 and 3).** Gradient ascent where every update uses samples
  from the policy ``d`` steps ago (prefill warm-up: ``theta_0`` for the first ``d`` steps),
  with group-normalised advantages, for ``grpo`` (token clip), ``tic``, ``gmc``, ``is`` and
  ``none``: final expected reward, divergence, iterations to a target reward.

Gradients are analytic: ``grad log pi(y_t | prefix)`` with respect to that prefix's logits is
``onehot(y_t) - softmax(logits)``.
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


def _bias_norm(samples: np.ndarray, target: np.ndarray, target_tr_cov_over_n: float = 0.0):
    """Debiased Monte Carlo estimate of ``||E x - target||`` with a 95% interval.

    ``||mean - target||^2`` overestimates the squared bias by ``tr(Cov)/n`` (plus the target's
    own Monte Carlo noise when it is estimated); we subtract it and use the delta-method
    variance ``4 d'Cd/n + 2 tr(C^2)/n^2`` for the interval.
    """
    n = len(samples)
    mean = samples.mean(0)
    d = mean - target
    centred = samples - mean
    tr_c = float((centred**2).sum() / (n - 1))
    b2 = float(d @ d) - tr_c / n - target_tr_cov_over_n
    proj = centred @ d
    gram_n = min(n, 2000)  # tr(C^2) from a subsample: it only widens the interval slightly
    sub = centred[:gram_n]
    tr_c2 = float(((sub @ sub.T) ** 2).sum()) / gram_n**2
    var_b2 = 4 * float(proj @ proj) / (n - 1) / n + 2 * tr_c2 / n**2
    half = 1.96 * math.sqrt(max(var_b2, 0.0))
    return (
        math.sqrt(max(b2, 0.0)),
        math.sqrt(max(b2 - half, 0.0)),
        math.sqrt(max(b2 + half, 0.0)),
    )


def _group_norm_estimate(counts, w, r, S, rbar, sd):
    """``(1/G) sum_i w(y_i) (r_i - rbar) / sd * S(y_i)`` per Monte Carlo group, from counts."""
    G = counts[0].sum()
    num = counts @ ((w * r)[:, None] * S) - rbar[:, None] * (counts @ (w[:, None] * S))
    return num / (sd[:, None] * G)


def fixed_policy_experiment(
    world: TabularWorld,
    group_sizes: list[int],
    eps_values: list[float],
    drifts: list[float],
    n_rep: int,
    seed: int = 0,
    progress: bool = True,
) -> pd.DataFrame:
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
        kl = float(p_mu @ -log_rho)
        second_rho = float(p_mu @ rho**2)
        counts = rng.multinomial(G, p_mu, size=n_rep).astype(np.float64)  # [n, N]
        counts_on = rng.multinomial(G, p_pi, size=n_rep).astype(np.float64)
        m = counts @ rho / G
        g_is = counts @ ((rho * (r - J))[:, None] * S) / G  # unbiased: E[g_is] = grad J
        # group-normalised advantages from the counts
        rbar, rbar_on = counts @ r / G, counts_on @ r / G
        sd = np.sqrt(np.maximum(counts @ r**2 / G - rbar**2, 0.0)) + 1e-6
        sd_on = np.sqrt(np.maximum(counts_on @ r**2 / G - rbar_on**2, 0.0)) + 1e-6
        on_policy = _group_norm_estimate(counts_on, np.ones_like(r), r, S, rbar_on, sd_on)
        on_mean = on_policy.mean(0)
        on_tr = float(((on_policy - on_mean) ** 2).sum() / (n_rep - 1)) / n_rep

        for eps in eps_values:
            cap = 1.0 + eps
            w_tic = np.minimum(rho, cap)
            c_gmc = np.minimum(1.0, cap / m)
            short = {
                "tic": counts @ (rho - w_tic) / G,
                "gmc": m - c_gmc * m,
            }
            A_exact = r - J
            est_exact = {
                "tic": counts @ ((w_tic * A_exact)[:, None] * S) / G,
                "gmc": c_gmc[:, None] * g_is,
            }

            est_norm = {
                "tic": _group_norm_estimate(counts, w_tic, r, S, rbar, sd),
                "gmc": c_gmc[:, None] * _group_norm_estimate(counts, rho, r, S, rbar, sd),
            }
            exact_tic_bias = float(np.linalg.norm(S.T @ (p_mu * w_tic * A_exact) - g_true))
            for method in ("tic", "gmc"):
                for variant, est, target, target_tr in (
                    ("exact_baseline", est_exact[method], g_true, 0.0),
                    ("group_norm", est_norm[method], on_mean, on_tr),
                ):
                    if variant == "exact_baseline":
                        # control variate: E[g_is] = grad J exactly, so the bias is E[g - g_is],
                        # which is 0 on every group the cap leaves alone
                        bias, lo, hi = _bias_norm(est - g_is, np.zeros_like(g_true))
                    else:
                        bias, lo, hi = _bias_norm(est, target, target_tr)
                    sf = short[method]
                    rows.append(
                        dict(
                            variant=variant,
                            drift=drift,
                            kl_mu_pi=kl,
                            rho_second_moment=second_rho,
                            G=G,
                            eps=eps,
                            method=method,
                            bias=bias,
                            bias_lo=lo,
                            bias_hi=hi,
                            rel_bias=bias / float(np.linalg.norm(target)),
                            second_moment=float((est**2).sum(1).mean()),
                            shortfall=float(sf.mean()),
                            shortfall_se=float(sf.std(ddof=1) / math.sqrt(n_rep)),
                            frac_capped=float((m > cap).mean() if method == "gmc" else (counts @ (rho > cap)).mean() / G),
                            exact_bias=exact_tic_bias if (method == "tic" and variant == "exact_baseline") else float("nan"),
                            n_rep=n_rep,
                        )
                    )
    return pd.DataFrame(rows)


def bias_slopes(fixed: pd.DataFrame) -> pd.DataFrame:
    """Least-squares slope of log(bias) on log(G) per (variant, drift, eps, method), over the
    group sizes where the bias is resolved (its interval excludes zero)."""
    rows = []
    for key, grp in fixed.groupby(["variant", "drift", "eps", "method"]):
        ok = grp[grp["bias_lo"] > 0]
        slope = float(np.polyfit(np.log(ok["G"]), np.log(ok["bias"]), 1)[0]) if len(ok) >= 3 else float("nan")
        rows.append(dict(zip(["variant", "drift", "eps", "method"], key), slope=slope, n_points=len(ok),
                         bias_at_min_G=float(grp["bias"].iloc[0]), bias_at_max_G=float(grp["bias"].iloc[-1])))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# experiment 2: delayed optimisation

DELAYED_METHODS = ("grpo", "tic", "gmc", "is", "none")


def delayed_run(
    world: TabularWorld,
    method: str,
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
        if method == "grpo":
            ratio = np.exp(np.minimum(l_tok, 50.0))[None]  # [1, N, T]
            Ab = A[:, :, None]
            clipped = ((Ab > 0) & (ratio > 1 + eps)) | ((Ab < 0) & (ratio < 1 - eps))
            coef = np.where(clipped, 0.0, ratio * Ab) * counts[:, :, None]
            coef_tok = coef.sum(0)
        else:
            if method == "tic":
                w = np.broadcast_to(np.exp(np.minimum(L, math.log1p(eps))), counts.shape)
            elif method == "gmc":
                log_m = np.log(counts @ np.exp(L - L.max()) / G) + L.max()
                c = np.exp(np.minimum(0.0, math.log1p(eps) - log_m))
                w = c[:, None] * np.exp(np.minimum(L, 50.0))[None]
            elif method == "is":
                w = np.broadcast_to(np.exp(np.minimum(L, is_clamp)), counts.shape)
            elif method == "none":
                w = np.ones_like(counts)
            else:
                raise ValueError(f"unknown method {method!r}; expected one of {DELAYED_METHODS}")
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
    tail = rewards[-max(1, iters // 10):]
    return dict(
        method=method, delay=delay, eps=eps, G=G, seed=seed, iters=iters, lr=lr,
        initial_reward=rewards[0], final_reward=final,
        tail_mean_reward=float("nan") if diverged else float(np.mean(tail)),
        max_reward=float(np.max(rewards)),
        diverged=bool(diverged or final < rewards[0] - 0.05),
        iters_to_target=float("nan") if hit is None else float(hit),
    )


def delayed_experiment(world, methods, delays, eps_values, group_sizes, seeds, iters, lr,
                       groups_per_step, target, progress=True) -> pd.DataFrame:
    combos = list(itertools.product(methods, delays, eps_values, group_sizes, seeds))
    rows = [
        delayed_run(world, m, d, e, g, iters, lr, groups_per_step, s, target)
        for m, d, e, g, s in tqdm(combos, desc="theory: delayed ascent", disable=not progress)
    ]
    return pd.DataFrame(rows)


def summarise_delayed(runs: pd.DataFrame) -> pd.DataFrame:
    return (
        runs.groupby(["method", "delay", "eps", "G"])
        .agg(final_reward=("tail_mean_reward", "mean"), final_reward_std=("tail_mean_reward", "std"),
             diverged=("diverged", "mean"), iters_to_target=("iters_to_target", "median"),
             seeds=("seed", "count"))
        .reset_index()
    )


# ---------------------------------------------------------------------------------------------
# entry point


@dataclass(frozen=True)
class TheoryConfig:
    """Sizes of the theory lab; ``quick`` fits in about a minute on 2 cores."""

    V: int = 4
    """Vocabulary size of the tabular world."""
    T: int = 4
    """Sequence length (V**T sequences are enumerated)."""
    group_sizes: tuple[int, ...] = tuple(2**k for k in range(1, 11))
    """Group sizes G for the fixed-policy experiment (2 ... 1024)."""
    eps_values: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5)
    """Caps 1+eps."""
    drifts: tuple[float, ...] = (0.25, 0.5, 1.0)
    """Scale of the random logit drift from current to behaviour policy."""
    n_rep: int = 20000
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
        return cls(group_sizes=(2, 8, 32, 128, 512), eps_values=(0.1, 0.5), drifts=(0.5,),
                   n_rep=3000, delays=(0, 16, 64), delayed_eps=(0.2,), delayed_group_sizes=(8,),
                   seeds=(0,), iters=200)


def run_theory(out: str | Path, cfg: TheoryConfig, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Run both experiments, write tidy CSVs and the figures under ``out``."""
    from gmc import plots

    out = Path(out)
    start = time.time()
    world = TabularWorld(cfg.V, cfg.T)
    fixed = fixed_policy_experiment(world, list(cfg.group_sizes), list(cfg.eps_values),
                                    list(cfg.drifts), cfg.n_rep, cfg.seed, progress)
    slopes = bias_slopes(fixed)
    runs = delayed_experiment(world, DELAYED_METHODS, list(cfg.delays), list(cfg.delayed_eps),
                              list(cfg.delayed_group_sizes), list(cfg.seeds), cfg.iters, cfg.lr,
                              cfg.groups_per_step, cfg.target_reward, progress)
    summary = summarise_delayed(runs)
    tables = {"fixed_policy": fixed, "bias_slopes": slopes, "delayed_runs": runs, "delayed_summary": summary}
    for name, frame in tables.items():
        write_csv(frame, out / f"{name}.csv")
    plots.theory_figures(tables, out)
    write_json(out / "theory_config.json", {**asdict(cfg), "seconds": round(time.time() - start, 1)})
    return tables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output folder for CSVs and figures")
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute on 2 cores)")
    parser.add_argument("--seed", type=int, default=0)


def run_from_args(args: argparse.Namespace) -> None:
    cfg = TheoryConfig.quick() if args.quick else TheoryConfig()
    cfg = TheoryConfig(**{**asdict(cfg), "seed": args.seed})
    tables = run_theory(args.out, cfg)
    print(tables["bias_slopes"].query("variant == 'exact_baseline'").to_string(index=False))
    print(tables["delayed_summary"].to_string(index=False))
