"""Estimators against naive per-sample loops, plus the properties method.md section 3 lists."""

import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gmc.estimators import (
    AGGREGATIONS,
    DIVERGENCE_METRICS,
    OWN_SETTINGS,
    REGISTRY,
    EstimatorConfig,
    advantages_for,
    get_estimator,
    group_advantages,
    m2po_keep_mask,
    settings_read_by,
    trajectory_log_ratios,
    trajectory_weights,
)
from gmc.settings import ConfigError

DEFAULT_AGG = {
    **dict.fromkeys(["grpo", "gspo", "tis", "gmpo", "sapo", "opsm"], "seq_mean"),
    **dict.fromkeys(["cispo", "icepop", "seq_mask", "m2po", "dppo", "kpop", "dppo_kl", "prime_dppo"], "token_mean"),
}


DEFAULT_DENOMINATOR = {"m2po": "kept"}
"""Every other estimator divides by all valid tokens: the masking ones as their peers, the rest drop nothing."""


MASKING = ["icepop", "seq_mask", "m2po", "dppo", "kpop", "dppo_kl", "prime_dppo", "opsm"]


TOKEN_LIMIT = 512
"""The generation's token limit the tests' ``seq_sum_const`` divides by where a test sets none."""


def call_loss(name, logp, logp_b, mask, adv, cfg=EstimatorConfig(), max_new_tokens=TOKEN_LIMIT, **kw):
    """The loss of ``name`` as the update calls it: with the settings its registry entry resolves
    and the token limit."""
    return get_estimator(name)(
        logp, logp_b, mask, adv, REGISTRY[name].resolved(cfg), max_new_tokens=max_new_tokens, **kw
    )


def random_batch(B=3, G=4, T=6, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp_b = -torch.rand(B, G, T, generator=g, dtype=torch.float64) * 2 - 0.05
    logp = (logp_b + scale * torch.randn(B, G, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    lengths = torch.randint(1, T + 1, (B, G), generator=g)
    mask = torch.arange(T).expand(B, G, T) < lengths.unsqueeze(-1)
    rewards = torch.randint(0, 2, (B, G), generator=g).double()
    return logp.float(), logp_b.float(), mask, rewards


def naive_coefficients(name, logp, logp_b, mask, adv, cfg):
    """coef[b][g][t] such that the gradient is -sum coef * norm * grad logp, and keep[b][g][t]:
    whether the estimator keeps the valid token (a masking estimator's mask)."""
    B, G, T = logp.shape
    lp, lb = logp.double().tolist(), logp_b.double().tolist()
    mk, A = mask.tolist(), adv.double().tolist()
    coef = [[[0.0] * T for _ in range(G)] for _ in range(B)]
    keep = [[[bool(mk[b][g][t]) for t in range(T)] for g in range(G)] for b in range(B)]
    m2po_dropped = naive_m2po_dropped(lp, lb, mk, cfg.m2po_tau)
    for b in range(B):
        Ls = [sum(lp[b][g][t] - lb[b][g][t] for t in range(T) if mk[b][g][t]) for g in range(G)]
        rhos = [math.exp(L) for L in Ls]
        m = sum(rhos) / G
        for g in range(G):
            a, rho = A[b][g], rhos[g]
            n = sum(mk[b][g])
            for t in range(T):
                if not mk[b][g][t]:
                    continue
                r = math.exp(lp[b][g][t] - lb[b][g][t])
                if name in ("grpo", "opsm"):
                    # TRL's two-sided objective -min(min(r, delta) a, clip(r) a): r is frozen where it
                    # is not the minimum of the three (a > 0) or not the maximum of min(r, delta) and clip(r)
                    delta = math.inf if cfg.grpo_delta is None else cfg.grpo_delta
                    if a > 0:
                        clipped = r > min(delta, 1 + cfg.eps_high)
                    else:
                        clipped = a < 0 and (r < 1 - cfg.eps_low or r > max(delta, 1 + cfg.eps_high))
                    c = 0.0 if clipped else r * a
                    if name == "opsm":  # the response dropped whole: negative advantage, mean log(mu/pi) too large
                        keep[b][g][t] = a >= 0 or -Ls[g] / n <= cfg.opsm_threshold
                        c = c if keep[b][g][t] else 0.0
                elif name == "tic":
                    if cfg.tic_mode == "truncate":
                        c = min(rho, 1 + cfg.eps) * a
                    else:
                        c = 0.0 if (a > 0 and rho > 1 + cfg.eps) else rho * a
                elif name == "gmc":
                    c = rho * min(1.0, (1 + cfg.eps) / m) * a
                elif name == "is":
                    c = rho * a
                elif name == "none":
                    c = a
                elif name == "tis":
                    c = min(r, 1 + cfg.eps) * a
                elif name == "gspo":
                    s = math.exp(Ls[g] / n)
                    clipped = (a > 0 and s > 1 + cfg.gspo_eps_high) or (a < 0 and s < 1 - cfg.gspo_eps_low)
                    c = 0.0 if clipped else s * a
                elif name == "cispo":
                    c = min(max(r, 1 - cfg.cispo_eps_low), 1 + cfg.cispo_eps_high) * a
                elif name == "icepop":
                    keep[b][g][t] = cfg.icepop_low <= r <= cfg.icepop_high
                    c = r * a if keep[b][g][t] else 0.0
                elif name == "seq_mask" and cfg.seq_mask_metric in DIVERGENCE_METRICS:
                    keep[b][g][t] = kept = naive_divergence_keeps(lp[b][g], lb[b][g], mk[b][g], t, cfg)
                    c = a if kept else 0.0
                elif name == "seq_mask":
                    metric = rho if cfg.seq_mask_metric == "rho" else math.exp(Ls[g] / n)
                    keep[b][g][t] = kept = cfg.seq_mask_low <= metric <= cfg.seq_mask_high
                    c = (rho if cfg.seq_mask_metric == "rho" else 1.0) * a if kept else 0.0
                elif name == "m2po":
                    keep[b][g][t] = (b, g, t) not in m2po_dropped
                    c = r * a if keep[b][g][t] else 0.0
                elif name == "gmpo":

                    def clipped(u, a=a):
                        return (a > 0 and u > cfg.gmpo_clip_high) or (a < 0 and u < -cfg.gmpo_clip_low)

                    ls = [lp[b][g][u] - lb[b][g][u] for u in range(T) if mk[b][g][u]]
                    s = math.exp(
                        sum(min(max(u, -cfg.gmpo_clip_low), cfg.gmpo_clip_high) if clipped(u) else u for u in ls) / n
                    )
                    c = 0.0 if clipped(lp[b][g][t] - lb[b][g][t]) else s * a
                elif name in ("dppo", "prime_dppo"):
                    dp = math.exp(lp[b][g][t]) - math.exp(lb[b][g][t])
                    keep[b][g][t] = valid = dp <= cfg.dppo_delta_high if a > 0 else dp >= -cfg.dppo_delta_low
                    w = min(r, cfg.dppo_ratio_cap) if name == "dppo" else r  # prime-rl caps nothing
                    c = w * a if valid else 0.0
                elif name == "dppo_kl":
                    p, q = math.exp(lp[b][g][t]), math.exp(lb[b][g][t])
                    D = q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
                    keep[b][g][t] = valid = (
                        (D <= cfg.dppo_kl_high or p <= q) if a > 0 else (D <= cfg.dppo_kl_low or p >= q)
                    )
                    c = min(r, cfg.dppo_ratio_cap) * a if valid else 0.0
                elif name == "kpop":
                    p, q = (min(max(math.exp(x), 1e-8), 1 - 1e-8) for x in (lp[b][g][t], lb[b][g][t]))

                    def kl(u, v):
                        return u * math.log(u / v) + (1 - u) * math.log((1 - u) / (1 - v))

                    keep[b][g][t] = max(kl(p, q), kl(q, p)) <= cfg.kpop_threshold
                    c = r * a if keep[b][g][t] else 0.0
                elif name == "sapo":
                    tau = cfg.sapo_tau_pos if a > 0 else cfg.sapo_tau_neg
                    s = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
                    c = 4.0 * s * (1.0 - s) * r * a  # d/dlogp of the gate sigmoid(tau (r - 1)) 4 / tau
                coef[b][g][t] = c
    return coef, keep


def naive_divergence_keeps(lp, lb, mk, t, cfg):
    """Whether verl's rejection ``rollout_rs=cfg.seq_mask_metric`` keeps token ``t`` of a response."""
    level, k = cfg.seq_mask_metric.rsplit("_", 1)
    div = {"k1": lambda u: -u, "k2": lambda u: 0.5 * u * u, "k3": lambda u: math.exp(u) - 1 - u}[k]
    ks = {u: div(lp[u] - lb[u]) for u in range(len(lp)) if mk[u]}
    stat = {
        "token": lambda: ks[t],
        "seq_sum": lambda: sum(ks.values()),
        "seq_max": lambda: max(ks.values()),
        "seq_mean": lambda: sum(ks.values()) / len(ks),
    }[level]()
    if k == "k1":
        return (cfg.seq_mask_low == 0 or stat >= math.log(cfg.seq_mask_low)) and stat <= math.log(cfg.seq_mask_high)
    return stat <= cfg.seq_mask_high


def naive_m2po_dropped(lp, lb, mk, tau):
    """The (b, g, t) M2PO drops: the largest (log r)^2 first, until the mean of the rest is < tau."""
    tokens = [
        ((lp[b][g][t] - lb[b][g][t]) ** 2, (b, g, t))
        for b in range(len(lp))
        for g in range(len(lp[b]))
        for t in range(len(lp[b][g]))
        if mk[b][g][t]
    ]
    tokens.sort(key=lambda x: -x[0])  # stable: ties keep their order
    for k in range(len(tokens)):
        rest = [v for v, _ in tokens[k:]]
        if sum(rest) / len(rest) < tau:
            break
    else:
        k = len(tokens) - 1
    return {idx for _, idx in tokens[:k]}


def naive_loss_and_grad(name, logp, logp_b, mask, adv, cfg, max_new_tokens):
    """``mask_denominator="kept"``: only the kept tokens count (every row still counts among the rows)."""
    B, G, T = logp.shape
    how = cfg.aggregation or DEFAULT_AGG.get(name, "seq_sum_const")
    coef, keep = naive_coefficients(name, logp, logp_b, mask, adv, cfg)
    kept_only = (cfg.mask_denominator or DEFAULT_DENOMINATOR.get(name, "all")) == "kept"
    mk = keep if kept_only else mask.tolist()
    n_tok = sum(sum(sum(row) for row in grp) for grp in mk)
    rows = B * G
    loss, grad = 0.0, torch.zeros(B, G, T, dtype=torch.float64)
    for b in range(B):
        for g in range(G):
            n = sum(mk[b][g])
            for t in range(T):
                if not mk[b][g][t]:
                    continue
                norm = {
                    "token_mean": 1.0 / n_tok,
                    "seq_mean": 1.0 / (n * rows),
                    "seq_sum_const": 1.0 / (max_new_tokens * rows),
                }[how]
                loss -= coef[b][g][t] * norm
                grad[b, g, t] = -coef[b][g][t] * norm
    if name == "prime_dppo":  # the penalty tau (log r)^2 on every valid token, over every valid token
        loss_pen, grad_pen = naive_ratio_penalty(logp, logp_b, mask, how, max_new_tokens)
        loss += cfg.prime_kl_tau * loss_pen
        grad += cfg.prime_kl_tau * grad_pen
    return loss, grad


def naive_ratio_penalty(logp, logp_b, mask, how, max_new_tokens):
    """``aggregate((log r)^2)`` over every valid token and its gradient ``2 log r x norm``."""
    B, G, T = logp.shape
    lp, lb, mk = logp.double().tolist(), logp_b.double().tolist(), mask.tolist()
    n_tok = sum(sum(sum(row) for row in grp) for grp in mk)
    loss, grad = 0.0, torch.zeros(B, G, T, dtype=torch.float64)
    for b in range(B):
        for g in range(G):
            n = sum(mk[b][g])
            for t in range(T):
                if mk[b][g][t]:
                    norm = {
                        "token_mean": 1.0 / n_tok,
                        "seq_mean": 1.0 / (n * B * G),
                        "seq_sum_const": 1.0 / (max_new_tokens * B * G),
                    }[how]
                    u = lp[b][g][t] - lb[b][g][t]
                    loss += u * u * norm
                    grad[b, g, t] = 2 * u * norm
    return loss, grad


def assert_matches_naive_loop(name, logp, logp_b, mask, adv, cfg, max_new_tokens=TOKEN_LIMIT):
    """The estimator's loss and gradient equal the naive loop's; returns its stats."""
    logp = logp.clone().requires_grad_(True)
    loss, stats = call_loss(name, logp, logp_b, mask, adv, cfg, max_new_tokens=max_new_tokens)
    loss.backward()
    ref_loss, ref_grad = naive_loss_and_grad(name, logp.detach(), logp_b, mask, adv, cfg, max_new_tokens)
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
    torch.testing.assert_close(logp.grad.double(), ref_grad, rtol=1e-4, atol=1e-7)
    return stats


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("aggregation", [None, "token_mean", "seq_mean", "seq_sum_const"])
@pytest.mark.parametrize("seed", [0, 1])
def test_estimator_matches_naive_loop(name, aggregation, seed):
    logp, logp_b, mask, rewards = random_batch(seed=seed, scale=0.3 if seed == 0 else 0.05)
    adv = group_advantages(rewards)
    cfg = EstimatorConfig(aggregation=aggregation, eps=0.2, gspo_eps_high=0.05, gspo_eps_low=0.05)
    stats = assert_matches_naive_loop(name, logp, logp_b, mask, adv, cfg, max_new_tokens=8)
    assert all(isinstance(v, float) and "/" in k for k, v in stats.items())


TIGHT = dict(
    cispo_eps_low=0.1,
    cispo_eps_high=0.1,
    icepop_low=0.9,
    icepop_high=1.1,
    seq_mask_low=0.8,
    seq_mask_high=1.25,
    m2po_tau=0.01,
    gmpo_clip_low=0.1,
    gmpo_clip_high=0.1,
    dppo_delta_low=0.03,
    dppo_delta_high=0.03,
    dppo_ratio_cap=1.2,
    sapo_tau_pos=8.0,
    sapo_tau_neg=10.0,
    kpop_threshold=0.01,
    dppo_kl_low=0.005,
    dppo_kl_high=0.005,
    prime_kl_tau=0.1,
    opsm_threshold=0.05,
    grpo_delta=1.3,
)


DIVERGENCE_BOUNDS = {
    "token_k1": (0.7, 1.4),
    "token_k2": (0, 0.1),
    "token_k3": (0, 0.1),
    "seq_sum_k1": (0.7, 1.4),
    "seq_sum_k2": (0, 0.15),
    "seq_sum_k3": (0, 0.15),
    "seq_mean_k1": (0.85, 1.15),
    "seq_mean_k2": (0, 0.05),
    "seq_mean_k3": (0, 0.05),
    "seq_max_k2": (0, 0.08),
    "seq_max_k3": (0, 0.08),
}
"""``(seq_mask_low, seq_mask_high)`` per divergence metric: each drops part of the naive-loop batches."""


@pytest.mark.parametrize(
    "name,metric",
    [
        ("cispo", "rho"),
        ("icepop", "rho"),
        ("seq_mask", "rho"),
        ("seq_mask", "geo_mean"),
        ("m2po", "rho"),
        ("gmpo", "rho"),
        ("dppo", "rho"),
        ("sapo", "rho"),
        ("kpop", "rho"),
        ("dppo_kl", "rho"),
        ("prime_dppo", "rho"),
        ("opsm", "rho"),
        ("grpo", "rho"),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_corrections_match_naive_loop_where_their_clips_and_masks_fire(name, metric, seed):
    """Bounds tight enough that every correction clips or masks part of the batch, not all of it."""
    logp, logp_b, mask, rewards = random_batch(B=4, G=4, T=8, seed=seed, scale=0.3)
    adv = group_advantages(rewards)
    cfg = EstimatorConfig(**TIGHT, seq_mask_metric=metric)
    stats = assert_matches_naive_loop(name, logp, logp_b, mask, adv, cfg)
    (key,) = REGISTRY[name].diagnostics
    assert 0 < stats[key] < 1, (key, stats[key])


@pytest.mark.parametrize("delta", [1.05, 1.15, 1.2, 1.6])
@pytest.mark.parametrize("name", ["grpo", "opsm"])
def test_the_two_sided_clip_matches_naive_loop_on_both_sides_of_one_plus_eps_high(name, delta):
    logp, logp_b, mask, rewards = random_batch(B=4, G=4, T=8, seed=5, scale=0.3)
    cfg = EstimatorConfig(**{**TIGHT, "grpo_delta": delta})
    stats = assert_matches_naive_loop(name, logp, logp_b, mask, group_advantages(rewards), cfg)
    assert 0 < stats["ratio/frac_tokens_clipped"] < 1


@pytest.mark.parametrize("name", MASKING)
@pytest.mark.parametrize("denominator", ["all", "kept"])
@pytest.mark.parametrize("aggregation", [None, *AGGREGATIONS])
@pytest.mark.parametrize("seed", [0, 1])
def test_masking_estimators_match_naive_loop_under_either_denominator(name, denominator, aggregation, seed):
    """Masks firing on part of the batch: ``all`` divides by every valid token, ``kept`` by the
    kept tokens (each response by its own under ``seq_mean``)."""
    logp, logp_b, mask, rewards = random_batch(B=4, G=4, T=8, seed=seed, scale=0.3)
    adv = group_advantages(rewards)
    cfg = EstimatorConfig(
        **TIGHT, seq_mask_metric="geo_mean" if seed else "rho", mask_denominator=denominator, aggregation=aggregation
    )
    stats = assert_matches_naive_loop(name, logp, logp_b, mask, adv, cfg, max_new_tokens=8)
    (key,) = REGISTRY[name].diagnostics
    assert 0 < stats[key] < 1, (key, stats[key])


def test_the_estimators_that_drop_tokens_declare_a_denominator_and_the_others_ignore_it():
    assert [n for n, e in REGISTRY.items() if e.mask_denominator is not None] == MASKING
    assert {n: REGISTRY[n].mask_denominator for n in MASKING} == {n: DEFAULT_DENOMINATOR.get(n, "all") for n in MASKING}
    logp, logp_b, mask, rewards = random_batch(seed=3, scale=0.4)
    adv = group_advantages(rewards)
    for name in (n for n in REGISTRY if n not in MASKING):
        losses = [
            call_loss(name, logp, logp_b, mask, adv, EstimatorConfig(mask_denominator=d))[0] for d in ("all", "kept")
        ]
        assert torch.equal(*losses), name


def test_m2po_kept_denominator_hand_computed():
    """Two 3-token responses, (log r)^2 = .25, 1e-4, 4e-4 | .09, .0025, 0 with mean .057 > .04:
    dropping the .25 token leaves mean .0186 < .04. AReaL divides by the 5 kept tokens, ``all``
    by the 6 valid ones: AReaL's gradient is exactly 6/5 of it."""
    l_tok = torch.tensor([[[0.5, 0.01, -0.02], [0.3, 0.05, 0.0]]])
    logp_b = torch.full((1, 2, 3), -1.0)
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    adv = torch.tensor([[1.0, -1.0]])
    assert m2po_keep_mask(l_tok, mask, 0.04).tolist() == [[[False, True, True], [True, True, True]]]
    out = {}
    for denominator in (None, "kept", "all"):
        x = (logp_b + l_tok).requires_grad_(True)
        loss, stats = call_loss(
            "m2po", x, logp_b, mask, adv, EstimatorConfig(m2po_tau=0.04, mask_denominator=denominator)
        )
        loss.backward()
        out[denominator] = (float(loss.detach()), x.grad)
        assert stats["ratio/frac_tokens_masked"] == pytest.approx(1 / 6)
    r = torch.exp(l_tok)
    expected_all = torch.tensor([[[0.0, -1.0, -1.0], [1.0, 1.0, 1.0]]]) * r / 6
    torch.testing.assert_close(out["all"][1], expected_all, rtol=1e-6, atol=0)
    torch.testing.assert_close(out["kept"][1], expected_all * 6 / 5, rtol=1e-6, atol=0)
    assert out["kept"][0] == pytest.approx(out["all"][0] * 6 / 5, rel=1e-6)
    assert out[None][0] == out["kept"][0] and torch.equal(out[None][1], out["kept"][1])  # AReaL's is the default


@pytest.mark.parametrize("metric", DIVERGENCE_METRICS)
@pytest.mark.parametrize("denominator", ["all", "kept"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seq_mask_divergence_metrics_match_naive_loop(metric, denominator, seed):
    logp, logp_b, mask, rewards = random_batch(B=4, G=4, T=8, seed=seed, scale=0.3)
    adv = group_advantages(rewards)
    low, high = DIVERGENCE_BOUNDS[metric]
    cfg = EstimatorConfig(seq_mask_metric=metric, seq_mask_low=low, seq_mask_high=high, mask_denominator=denominator)
    stats = assert_matches_naive_loop("seq_mask", logp, logp_b, mask, adv, cfg)
    assert 0 < stats["ratio/frac_seq_masked"] < 1 and 0 < stats["ratio/frac_tokens_masked"] < 1


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_statistics_stay_on_the_device_until_read_once(name):
    """``floats=False``: every statistic a 0-dim tensor, unread; the default reads them as the
    same floats."""
    logp, logp_b, mask, rewards = random_batch(seed=2)
    adv = group_advantages(rewards)
    _, tensors = call_loss(name, logp, logp_b, mask, adv, floats=False)
    _, floats = call_loss(name, logp, logp_b, mask, adv)
    assert tensors.keys() == floats.keys()
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in tensors.values())
    assert all(isinstance(floats[k], float) and floats[k] == float(v) for k, v in tensors.items())


@pytest.mark.parametrize("field", sorted(OWN_SETTINGS))
def test_a_setting_only_its_owners_read_changes_their_loss_and_no_other(field):
    """What lets a history share its weights across tuned caps: every estimator but the field's
    owners gives the same loss and gradient whatever its value; each owner's changes (so the
    declaration is not vacuous)."""
    logp, logp_b, mask, rewards = random_batch(seed=5, scale=0.3)
    logp = logp_b + 0.1 + 0.1 * (logp - logp_b)  # every ratio above 1: the caps fire
    adv = group_advantages(rewards)
    default = EstimatorConfig.__dataclass_fields__[field].default
    other = EstimatorConfig(**{field: default / 10 if default else 0.5})
    for name in REGISTRY:
        grads = []
        for cfg in (EstimatorConfig(), other):
            lp = logp.clone().requires_grad_(True)
            loss = call_loss(name, lp, logp_b, mask, adv, cfg)[0]
            loss.backward()
            grads.append((loss.detach(), lp.grad))
        same = torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
        assert same == (name not in OWN_SETTINGS[field]), name


def test_a_history_reads_the_settings_its_algorithm_reads():
    cfg = EstimatorConfig(eps=0.05, eps_high=0.3)
    assert settings_read_by("grpo", cfg) == EstimatorConfig(eps_high=0.3)
    assert settings_read_by("tic", cfg) == cfg


def test_kpop_keeps_near_certain_tokens():
    """Two tokens of probability 1 (log-prob 0, what the update passes on-policy) or 1 - 1e-9:
    their binary KL is 0, not 0 / 0, so KPop keeps them."""
    logp = torch.tensor([[[0.0, -1e-9]]])
    loss, stats = call_loss("kpop", logp, logp.clone(), torch.ones(1, 1, 2, dtype=torch.bool), torch.tensor([[1.0]]))
    assert stats["ratio/frac_tokens_masked"] == 0 and float(loss) == -1.0


def test_sapo_gate_hand_computed():
    """r = 2, A = 1, tau = 1: the gradient weight is 4 s (1 - s) r with s = sigmoid(1); on the
    negative side tau_neg = 1.05 applies; no token's gradient is ever exactly zero."""
    logp_b = torch.full((1, 2, 1), -1.0)
    logp = logp_b + torch.tensor([math.log(2.0), math.log(0.25)]).view(1, 2, 1)
    mask = torch.ones(1, 2, 1, dtype=torch.bool)
    x = logp.clone().requires_grad_(True)
    loss, stats = call_loss("sapo", x, logp_b, mask, torch.tensor([[1.0, -1.0]]), EstimatorConfig())
    loss.backward()
    s_pos, s_neg = 1 / (1 + math.exp(-1.0)), 1 / (1 + math.exp(1.05 * 0.75))
    expected = torch.tensor([[[-4 * s_pos * (1 - s_pos) * 2.0], [4 * s_neg * (1 - s_neg) * 0.25]]]) / 2
    torch.testing.assert_close(x.grad, expected, rtol=1e-6, atol=0)
    assert stats["ratio/frac_tokens_damped"] == 0.0  # 4 s (1 - s) = 0.79 and 0.86: neither halved
    x = (logp_b + 3.0).requires_grad_(True)  # r = e^3 ~ 20: strongly damped, still nonzero
    _, stats = call_loss("sapo", x, logp_b, mask, torch.tensor([[1.0, -1.0]]), EstimatorConfig())
    assert stats["ratio/frac_tokens_damped"] == 1.0


def test_m2po_mask_reaches_the_threshold_and_keeps_one_token_at_least():
    l_tok = torch.tensor([[[0.5, -0.1, 0.0, 0.3]]])
    mask = torch.tensor([[[True, True, True, False]]])
    # (log r)^2 = 0.25, 0.01, 0: dropping 0.25 leaves mean 0.005 < 0.05
    assert m2po_keep_mask(l_tok, mask, 0.05).tolist() == [[[False, True, True, False]]]
    # nothing meets 1e-9 strictly but the last token (0 < 1e-9): all but it are dropped
    assert m2po_keep_mask(l_tok, mask, 1e-9).tolist() == [[[False, False, True, False]]]
    assert m2po_keep_mask(l_tok.abs() + 1, mask, 1e-9).tolist() == [[[False, False, True, False]]]
    assert m2po_keep_mask(l_tok, mask, 1.0).tolist() == mask.tolist()


def test_tic_ppo_min_matches_naive_loop():
    logp, logp_b, mask, rewards = random_batch(seed=3, scale=0.4)
    adv = group_advantages(rewards)
    cfg = EstimatorConfig(tic_mode="ppo_min", eps=0.1)
    logp = logp.clone().requires_grad_(True)
    loss, stats = call_loss("tic", logp, logp_b, mask, adv, cfg, max_new_tokens=6)
    loss.backward()
    ref_loss, ref_grad = naive_loss_and_grad("tic", logp.detach(), logp_b, mask, adv, cfg, 6)
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-4)
    torch.testing.assert_close(logp.grad.double(), ref_grad, rtol=1e-4, atol=1e-7)
    assert 0.0 < stats["ratio/frac_traj_capped"] < 1.0


def test_tic_ppo_min_gradient_flows_through_rho():
    """ppo_min is min(rho A, min(rho, 1+eps) A) differentiated through rho = exp(sum l)."""
    logp, logp_b, mask, rewards = random_batch(seed=5, scale=0.4)
    adv = group_advantages(rewards)
    cfg = EstimatorConfig(tic_mode="ppo_min", eps=0.1)
    x = logp.clone().double().requires_grad_(True)
    L = ((x - logp_b.double()) * mask).sum(-1)
    rho = torch.exp(L)
    obj = torch.minimum(rho * adv, torch.clamp(rho, max=1 + cfg.eps) * adv)
    (-(obj.sum() / (6 * obj.numel()))).backward()
    y = logp.clone().requires_grad_(True)
    call_loss("tic", y, logp_b, mask, adv, cfg, max_new_tokens=6)[0].backward()
    torch.testing.assert_close(y.grad.double(), x.grad, rtol=1e-4, atol=1e-7)


def test_grpo_gradient_equals_ppo_clip_autograd():
    """The coefficient form equals differentiating the PPO-clip objective itself."""
    logp, logp_b, mask, rewards = random_batch(seed=2, scale=0.3)
    adv = group_advantages(rewards)
    cfg = EstimatorConfig()
    x = logp.clone().double().requires_grad_(True)
    r = torch.exp(x - logp_b.double())
    A = adv.double().unsqueeze(-1)
    obj = torch.minimum(r * A, torch.clamp(r, 1 - cfg.eps_low, 1 + cfg.eps_high) * A) * mask
    (-(obj.sum(-1) / mask.sum(-1)).mean()).backward()
    y = logp.clone().requires_grad_(True)
    call_loss("grpo", y, logp_b, mask, adv, cfg)[0].backward()
    torch.testing.assert_close(y.grad.double(), x.grad, rtol=1e-4, atol=1e-7)


log_ratio_rows = st.lists(
    st.lists(st.floats(-30, 30, allow_nan=False), min_size=2, max_size=16).map(tuple),
    min_size=1,
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 12), st.integers(1, 4), st.floats(0.01, 1.0), st.integers(0, 10_000), st.floats(0.01, 6))
def test_gmc_properties(G, B, eps, seed, spread):
    g = torch.Generator().manual_seed(seed)
    L = torch.randn(B, G, generator=g, dtype=torch.float64).mul(spread).float()
    w = trajectory_weights("gmc", L, eps).double()
    rho = torch.exp(L.double())
    m = rho.mean(-1)
    assert torch.all(w >= 0)
    assert torch.all(w <= rho * (1 + 1e-5) + 1e-30)  # 0 <= w <= rho
    torch.testing.assert_close(
        w.mean(-1), torch.minimum(m, torch.tensor(1 + eps, dtype=torch.float64)), rtol=1e-5, atol=0
    )
    # direction preserved: w proportional to rho within each group
    torch.testing.assert_close(w / w.sum(-1, keepdim=True), rho / rho.sum(-1, keepdim=True), rtol=1e-4, atol=1e-12)
    untouched = m <= 1 + eps
    torch.testing.assert_close(w[untouched], rho[untouched], rtol=1e-5, atol=0)
    # shortfall: GMC's G (m - 1 - eps)_+ never exceeds truncation's sum (rho - 1 - eps)_+
    short_gmc = (rho - w).sum(-1)
    short_tic = (rho - trajectory_weights("tic", L, eps).double()).sum(-1)
    # relative to the mass sum(rho), as ratio/shortfall reports it: float32 weights resolve the
    # difference of two sums of that size to ~1e-7 of it
    mass = rho.sum(-1)
    torch.testing.assert_close(short_gmc / mass, G * torch.clamp(m - 1 - eps, min=0) / mass, rtol=1e-4, atol=1e-6)
    assert torch.all(short_gmc <= short_tic * (1 + 1e-5) + 1e-6)


@pytest.mark.parametrize("G", [2, 8, 64])
@pytest.mark.parametrize("eps", [0.05, 0.2])
def test_gmc_extreme_log_ratio_is_exact(G, eps):
    L = torch.zeros(1, G)
    L[0, 0] = 1e4
    w = trajectory_weights("gmc", L, eps)
    assert torch.isfinite(w).all()
    assert float(w[0, 0]) == pytest.approx(G * (1 + eps), rel=1e-6)
    assert float(w[0, 1:].abs().max()) < 1e-30
    L = torch.full((2, G), -1e4)
    assert torch.isfinite(trajectory_weights("gmc", L, eps)).all()
    assert torch.isfinite(trajectory_weights("tic", -L, eps)).all()
    assert float(trajectory_weights("tic", -L, eps).max()) == pytest.approx(1 + eps)


def test_gmc_autograd_gradient_is_weighted_score_sum():
    """grad = -(1/(T_max B G)) sum_i w_i A_i grad log pi(y_i)."""
    torch.manual_seed(0)
    B, G, T, V = 2, 4, 5, 7
    logits = torch.randn(B, G, T, V, requires_grad=True)
    tokens = torch.randint(0, V, (B, G, T))
    mask = torch.ones(B, G, T, dtype=torch.bool)
    mask[0, 1, 3:] = False
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    logp_b = logp.detach() - 0.4 * torch.rand(B, G, T)  # current policy favours the samples: m > 1+eps
    adv = group_advantages(torch.tensor([[1.0, 0, 0, 1], [0, 1, 1, 1]]))
    cfg = EstimatorConfig(eps=0.2)
    loss, stats = call_loss("gmc", logp, logp_b, mask, adv, cfg, max_new_tokens=T)
    assert stats["ratio/frac_groups_capped"] == 1.0
    (grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
    w = trajectory_weights("gmc", trajectory_log_ratios(logp, logp_b, mask), cfg.eps)
    expected = torch.zeros_like(logits)
    for b in range(B):
        for g in range(G):
            seq_logp = (logp[b, g] * mask[b, g]).sum()
            (score,) = torch.autograd.grad(seq_logp, logits, retain_graph=True)
            expected -= w[b, g] * adv[b, g] * score / (T * B * G)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-8)


def test_on_policy_all_trajectory_methods_agree_and_grpo_is_reinforce():
    logp, _, mask, rewards = random_batch(seed=4)
    adv = group_advantages(rewards)
    grads = {}
    for name in REGISTRY:
        x = logp.clone().requires_grad_(True)
        call_loss(name, x, logp.detach(), mask, adv, max_new_tokens=6)[0].backward()
        grads[name] = x.grad
    for name in ("tic", "gmc", "is", "none"):
        torch.testing.assert_close(grads[name], grads["none"])
    assert grads["none"].abs().sum() > 0
    # grpo at delay 0 = on-policy REINFORCE with per-sequence token mean
    x = logp.clone().requires_grad_(True)
    reinforce = -((x * mask).sum(-1) / mask.sum(-1) * adv).mean()
    reinforce.backward()
    torch.testing.assert_close(grads["grpo"], x.grad)
    torch.testing.assert_close(grads["tis"], x.grad)
    torch.testing.assert_close(grads["gspo"], x.grad)
    # with the same aggregation, trajectory methods and grpo agree too
    same = EstimatorConfig(aggregation="seq_mean")
    y = logp.clone().requires_grad_(True)
    call_loss("gmc", y, logp.detach(), mask, adv, same)[0].backward()
    torch.testing.assert_close(y.grad, x.grad)


ON_POLICY_CLASSES = sorted({e.on_policy for e in REGISTRY.values() if e.on_policy is not None})


@pytest.mark.parametrize("on_policy", ON_POLICY_CLASSES, ids="-".join)
@pytest.mark.parametrize("aggregation", [None, *AGGREGATIONS])
@pytest.mark.parametrize("seed", [0, 1])
def test_members_of_an_on_policy_class_give_its_loss_and_gradient_at_ratio_one(on_policy, aggregation, seed):
    """Every ratio exactly 1: each estimator of a declared class ``("pg", how)`` gives the plain
    policy gradient under ``how`` (or the aggregation asked for), loss and gradient alike."""
    members = [name for name, e in REGISTRY.items() if e.on_policy == on_policy]
    kind, how = on_policy
    assert kind == "pg" and how in AGGREGATIONS
    logp, _, mask, rewards = random_batch(seed=seed)
    adv = group_advantages(rewards)
    cfg = EstimatorConfig(aggregation=aggregation)
    ref_loss, ref_grad = naive_loss_and_grad(
        "none", logp, logp, mask, adv, EstimatorConfig(aggregation=aggregation or how), 8
    )
    first = None
    for name in members:
        x = logp.clone().requires_grad_(True)
        loss, _ = call_loss(name, x, logp.detach(), mask, adv, cfg, max_new_tokens=8)
        loss.backward()
        assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-5, abs=1e-7), name
        torch.testing.assert_close(x.grad.double(), ref_grad, rtol=1e-5, atol=1e-8)
        if first is None:
            first = (loss.detach(), x.grad)
        else:  # members agree to the bit
            assert torch.equal(loss.detach(), first[0]) and torch.equal(x.grad, first[1]), name


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("denominator", [None, "all", "kept"])
@pytest.mark.parametrize("name", list(REGISTRY))
def test_needs_batch_stats_says_whether_a_rows_gradient_depends_on_the_other_rows(name, denominator, aggregation):
    """Without batch statistics, the gradient of each response computed alone (times its share:
    ``1/(B G)`` of a mean over responses, its tokens' fraction of the batch's under ``token_mean``)
    is its gradient in the batch; with them (the estimator's own, or a ``kept`` denominator under
    ``token_mean``: the kept tokens of every row), it is not."""
    logp, logp_b, mask, rewards = random_batch(B=3, G=4, T=6, seed=8, scale=0.4)
    adv = group_advantages(rewards)
    cfg = REGISTRY[name].resolved(
        EstimatorConfig(
            aggregation=aggregation,
            m2po_tau=0.01,
            icepop_low=0.8,
            icepop_high=1.25,
            seq_mask_high=1.2,
            dppo_delta_low=0.05,
            dppo_delta_high=0.05,
            kpop_threshold=0.01,
            dppo_kl_low=0.005,
            dppo_kl_high=0.005,
            opsm_threshold=0.02,
            mask_denominator=denominator,
        )
    )  # every mask drops a token here
    loss_fn = functools.partial(get_estimator(name), max_new_tokens=6)
    x = logp.clone().requires_grad_(True)
    loss_fn(x, logp_b, mask, adv, cfg)[0].backward()
    alone = torch.zeros_like(logp)
    B, G, _ = logp.shape
    for b in range(B):
        for g in range(G):
            y = logp[b : b + 1, g : g + 1].clone().requires_grad_(True)
            loss_fn(y, logp_b[b : b + 1, g : g + 1], mask[b : b + 1, g : g + 1], adv[b : b + 1, g : g + 1], cfg)[
                0
            ].backward()
            share = mask[b, g].sum() / mask.sum() if aggregation == "token_mean" else 1 / (B * G)
            alone[b, g] = y.grad[0, 0] * share
    if REGISTRY[name].needs_batch_stats_under(cfg):
        assert not torch.allclose(alone, x.grad, rtol=1e-4, atol=1e-7)
    else:
        torch.testing.assert_close(alone, x.grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_masked_tokens_get_exactly_zero_gradient(name):
    logp, logp_b, mask, rewards = random_batch(seed=6)
    logp = logp.masked_fill(~mask, float("-inf"))  # padding may hold anything
    logp_b = logp_b.masked_fill(~mask, float("nan"))
    x = logp.clone().requires_grad_(True)
    loss, _ = call_loss(name, x, logp_b, mask, group_advantages(rewards), EstimatorConfig())
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(x.grad[~mask] == 0)
    assert torch.isfinite(x.grad).all() and x.grad[mask].abs().sum() > 0


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_extreme_log_ratios_stay_finite(name, sign):
    B, G, T = 2, 4, 3
    logp_b = torch.full((B, G, T), -2.0)
    logp = logp_b + sign * torch.tensor([3000.0, 0.0, -1.0, 5.0]).view(1, G, 1)
    x = logp.clone().requires_grad_(True)
    mask = torch.ones(B, G, T, dtype=torch.bool)
    adv = group_advantages(torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 0]]))
    for mode in ("truncate", "ppo_min"):
        loss, stats = call_loss(name, x, logp_b, mask, adv, EstimatorConfig(tic_mode=mode))
        (grad,) = torch.autograd.grad(loss, x)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert all(math.isfinite(v) for v in stats.values()), stats


def test_group_advantages_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    a = group_advantages(r)
    torch.testing.assert_close(a[0], torch.tensor([1.0, -1.0, -1.0, 1.0]) / (0.5 + 1e-6) * 0.5)
    assert torch.all(a[1] == 0)
    std = math.sqrt(27 / 16)
    torch.testing.assert_close(a[2], torch.tensor([-0.75, -0.75, -0.75, 2.25]) / (std + 1e-6))
    torch.testing.assert_close(group_advantages(r, scale=False)[2], torch.tensor([-0.75, -0.75, -0.75, 2.25]))


def test_length_corrected_advantages():
    r = torch.tensor([[1.0, 1.0, 0.0]])
    lengths = torch.tensor([[2, 4, 3]])
    a = advantages_for(r, lengths, EstimatorConfig(length_corrected=True, scale_advantages=False))
    torch.testing.assert_close(a, torch.tensor([[0.5 - 0.25, 0.25 - 0.25, -0.25]]))


def test_trajectory_log_ratio_ignores_mask_and_is_float32():
    logp = torch.tensor([[[-1.0, -2.0, 5.0]]], dtype=torch.bfloat16)
    logp_b = torch.tensor([[[-1.5, -1.0, float("nan")]]])
    mask = torch.tensor([[[1, 1, 0]]])
    L = trajectory_log_ratios(logp, logp_b, mask)
    assert L.dtype == torch.float32 and float(L) == pytest.approx(-0.5)


def test_is_weight_clamp_and_unknown_method():
    L = torch.tensor([[100.0, 0.0]])
    assert float(trajectory_weights("is", L, 0.2, is_clamp=20.0)[0, 0]) == pytest.approx(math.exp(20), rel=1e-6)
    assert torch.all(trajectory_weights("none", L, 0.2) == 1)
    with pytest.raises(ValueError, match="unknown trajectory-weight algorithm 'foo'"):
        trajectory_weights("foo", L, 0.2)
    with pytest.raises(ValueError, match="known:"):
        get_estimator("ppo")


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="estimator.eps: must be greater than or equal to 0, got -0.1"):
        EstimatorConfig(eps=-0.1)
    with pytest.raises(ConfigError, match="estimator.aggregation: must be 'token_mean', 'seq_mean' or 'seq_sum_const'"):
        EstimatorConfig(aggregation="mean")
    with pytest.raises(ConfigError, match="estimator.tic_mode: must be 'truncate' or 'ppo_min', got 'clip'"):
        EstimatorConfig(tic_mode="clip")
    with pytest.raises(ConfigError, match="estimator.max_new_tokens: unknown key"):
        EstimatorConfig(max_new_tokens=64)  # the token limit's one home is sampling.max_new_tokens


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_registry_resolves_an_estimators_defaults_and_keeps_what_is_given(name):
    entry = REGISTRY[name]
    resolved = entry.resolved(EstimatorConfig(eps=0.3))
    assert (resolved.aggregation, resolved.mask_denominator, resolved.eps) == (
        DEFAULT_AGG.get(name, "seq_sum_const"),
        entry.mask_denominator,
        0.3,
    )
    given = EstimatorConfig(aggregation="token_mean", mask_denominator="kept")
    assert entry.resolved(given) == given


def test_a_loss_takes_resolved_settings_and_the_token_limit_and_never_reads_the_registry():
    """A loss is handed what it needs: no loss fills in defaults by looking itself up."""
    from gmc.estimators import losses

    assert not hasattr(losses, "REGISTRY")
    logp, logp_b, mask, rewards = random_batch(seed=2)
    adv = group_advantages(rewards)
    with pytest.raises(ValueError, match=r"aggregation is None: .*REGISTRY\[algorithm\].resolved"):
        get_estimator("gmc")(logp, logp_b, mask, adv, EstimatorConfig(), max_new_tokens=6)
    with pytest.raises(ValueError, match="mask_denominator is None"):
        get_estimator("icepop")(logp, logp_b, mask, adv, EstimatorConfig(aggregation="token_mean"))
    with pytest.raises(ValueError, match="seq_sum_const .* pass max_new_tokens"):
        get_estimator("gmc")(logp, logp_b, mask, adv, REGISTRY["gmc"].resolved(EstimatorConfig()))
    # the limit divides seq_sum_const alone: halving it doubles the loss
    half = call_loss("gmc", logp, logp_b, mask, adv, max_new_tokens=3)[0]
    assert float(half) == pytest.approx(2 * float(call_loss("gmc", logp, logp_b, mask, adv, max_new_tokens=6)[0]))


def test_kl_penalty_k3():
    logp, logp_b, mask, rewards = random_batch(seed=7)
    ref = logp_b - 0.1
    adv = group_advantages(rewards)
    with pytest.raises(ValueError, match="ref_logp"):
        call_loss("gmc", logp, logp_b, mask, adv, EstimatorConfig(kl_coef=0.1))
    loss0, _ = call_loss("gmc", logp, logp_b, mask, adv, EstimatorConfig())
    loss1, stats = call_loss("gmc", logp, logp_b, mask, adv, EstimatorConfig(kl_coef=0.5), ref_logp=ref)
    d = (ref - logp)[mask]
    k3 = torch.exp(d) - d - 1
    n = mask.sum(-1).clamp(min=1)
    per_seq = torch.zeros(mask.shape[:2])
    per_seq = ((torch.exp(ref - logp) - (ref - logp) - 1) * mask).sum(-1) / 512
    assert stats["loss/kl"] == pytest.approx(float(per_seq.mean()), rel=1e-5)
    assert float(loss1) == pytest.approx(float(loss0) + 0.5 * stats["loss/kl"], rel=1e-5)
    assert float(k3.min()) >= 0 and n.min() >= 1


def test_stats_diagnostics_hand_computed():
    # one group, G=2, T=1: L = [log 2, log 0.5] -> m = 1.25 > 1.2 -> capped
    logp_b = torch.zeros(1, 2, 1) - 1.0
    logp = logp_b + torch.tensor([math.log(2.0), math.log(0.5)]).view(1, 2, 1)
    mask = torch.ones(1, 2, 1, dtype=torch.bool)
    adv = torch.tensor([[1.0, -1.0]])
    _, s = call_loss("gmc", logp, logp_b, mask, adv, EstimatorConfig(eps=0.2))
    assert s["ratio/frac_groups_capped"] == 1.0
    # w = rho * 1.2/1.25 -> shortfall = 1 - 1.2/1.25
    assert s["ratio/shortfall"] == pytest.approx(1 - 1.2 / 1.25, rel=1e-5)
    assert s["ratio/ess"] == pytest.approx((2.5**2) / (4 + 0.25), rel=1e-5)
    assert s["ratio/log_group_mass_max"] == pytest.approx(math.log(1.25), rel=1e-5)
    _, s = call_loss("tic", logp, logp_b, mask, adv, EstimatorConfig(eps=0.2))
    assert s["ratio/frac_traj_capped"] == 0.5
    assert s["ratio/shortfall"] == pytest.approx(0.8 / 2.5, rel=1e-5)
    # uncapped IS removes nothing; unit weights (none) are no cap of rho and report no shortfall
    _, s = call_loss("is", logp, logp_b, mask, adv, EstimatorConfig(eps=0.2))
    assert s["ratio/shortfall"] == pytest.approx(0.0, abs=1e-6)
    _, s = call_loss("none", logp, logp_b, mask, adv, EstimatorConfig(eps=0.2))
    assert "ratio/shortfall" not in s and s["ratio/ess_frac"] == 1.0


@pytest.mark.parametrize("name", ["m2po", "kpop"])
def test_decoupled_losses_weight_by_the_behaviour_and_clip_the_proximal_ratio_hand_computed(name):
    """AReaL's decoupled loss: ``exp(log pi_prox - log mu)`` times the proximal ratio
    ``pi / pi_prox``, which PPO's clip switches off (here the second token of the positive
    response, ratio ``e^0.3 > 1.2``, and the third of the negative one, ``e^-0.3 < 0.8``). Without a
    proximal policy (the batch's first update) the proximal ratio is 1 and the weight is ``r``."""
    logp_b = torch.full((1, 2, 3), -1.0)
    l_b = torch.tensor([[[0.1, 0.0, -0.05], [0.02, -0.1, 0.0]]])
    l_p = torch.tensor([[[0.0, 0.3, -0.1], [0.05, 0.1, -0.3]]])
    prox = logp_b + l_b
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    adv = torch.tensor([[1.0, -1.0]])
    cfg = EstimatorConfig(m2po_tau=10.0, kpop_threshold=10.0)  # nothing masked: the weights alone
    x = (prox + l_p).requires_grad_(True)
    loss, stats = call_loss(name, x, logp_b, mask, adv, cfg, prox_logp=prox)
    loss.backward()
    gate = torch.tensor([[[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]])
    expected = -torch.exp(l_b) * gate * torch.exp(l_p) * adv.unsqueeze(-1) / 6  # token_mean over 6 tokens
    torch.testing.assert_close(x.grad, expected, rtol=1e-6, atol=1e-9)
    assert stats["ratio/frac_tokens_masked"] == 0.0

    y = (prox + l_p).requires_grad_(True)
    loss_none, _ = call_loss(name, y, logp_b, mask, adv, cfg)
    loss_none.backward()
    z = (prox + l_p).requires_grad_(True)
    loss_self, _ = call_loss(name, z, logp_b, mask, adv, cfg, prox_logp=z.detach())
    loss_self.backward()
    assert float(loss_none.detach()) == float(loss_self.detach()) and torch.equal(y.grad, z.grad)
    torch.testing.assert_close(y.grad, -torch.exp(l_b + l_p) * adv.unsqueeze(-1) / 6, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_loss_takes_a_proximal_policy_exactly_when_its_entry_declares_one(name):
    """The decoupled losses read ``prox_logp`` (the registry's ``proximal``); every other loss
    refuses one rather than ignore it."""
    logp, logp_b, mask, rewards = random_batch(seed=2)
    call = functools.partial(call_loss, name, logp, logp_b, mask, group_advantages(rewards), prox_logp=logp_b)
    if REGISTRY[name].proximal:
        call()
    else:
        with pytest.raises(TypeError, match="takes no prox_logp"):
            call()
