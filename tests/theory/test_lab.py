"""The theory lab's world is exact, and its Monte Carlo agrees with closed forms."""

import numpy as np
import pandas as pd
import pytest

from gmc.cli import main
from gmc.theory.lab import (
    CLAIM_EXPONENTS,
    TabularWorld,
    _bias_norm,
    claim_fits,
    delayed_run,
    fixed_policy_experiment,
)


def test_world_probabilities_and_gradient_are_exact():
    world = TabularWorld(V=3, T=3)
    rng = np.random.default_rng(0)
    theta = rng.standard_normal((world.n_nodes, world.V))
    p = world.seq_probs(theta)
    assert p.sum() == pytest.approx(1.0)
    assert world.reward.mean() == pytest.approx(1 / 3)
    g = world.exact_gradient(theta).reshape(world.n_nodes, world.V)
    h = 1e-6
    for idx in [(0, 0), (1, 2), (5, 1), (world.n_nodes - 1, 0)]:
        tp, tm = theta.copy(), theta.copy()
        tp[idx] += h
        tm[idx] -= h
        fd = (world.expected_reward(tp) - world.expected_reward(tm)) / (2 * h)
        assert g[idx] == pytest.approx(fd, abs=1e-7)


def test_token_grad_matches_score_matrix():
    world = TabularWorld(V=3, T=3)
    theta = np.random.default_rng(1).standard_normal((world.n_nodes, world.V))
    coef = np.random.default_rng(2).standard_normal(world.N)
    _, probs = world.token_log_probs(theta)
    via_tokens = world.token_grad(probs, np.repeat(coef[:, None], world.T, axis=1)).ravel()
    np.testing.assert_allclose(via_tokens, world.score_matrix(theta).T @ coef, atol=1e-12)


def test_monte_carlo_tic_bias_matches_closed_form_and_gmc_shortfall_is_smaller():
    world = TabularWorld(V=3, T=3)
    df = fixed_policy_experiment(world, [4, 64], [0.1], [1.0], n_rep=4000, seed=0, progress=False)
    tic = df[(df.algorithm == "tic") & (df.variant == "exact_baseline")]
    for _, row in tic.iterrows():  # tic's bias is G-independent and known exactly
        assert row.bias_lo <= row.exact_bias * 1.02 and row.exact_bias * 0.98 <= row.bias_hi
    exact = df[df.variant == "exact_baseline"].set_index(["G", "algorithm"])
    for G in (4, 64):
        assert exact.loc[(G, "gmc"), "shortfall"] <= exact.loc[(G, "tic"), "shortfall"]
    assert exact.loc[(64, "gmc"), "bias"] < exact.loc[(4, "gmc"), "bias"]
    assert exact.loc[(64, "gmc"), "bias"] < exact.loc[(64, "tic"), "bias"]


def test_delay_zero_makes_trajectory_methods_identical():
    world = TabularWorld(V=3, T=3)
    runs = [delayed_run(world, m, 0, 0.2, 8, 40, 4.0, 4, seed=3, target=0.9) for m in ("tic", "gmc", "is", "none")]
    finals = {r["final_reward"] for r in runs}
    assert len(finals) == 1 and runs[0]["final_reward"] > runs[0]["initial_reward"]


def test_theory_cli_quick_writes_tables_and_figures(tmp_path):
    main(["theory", "--quick", "--out", str(tmp_path)])
    for name in ("fixed_policy", "bias_slopes", "claims", "delayed_runs", "delayed_summary"):
        assert len(pd.read_csv(tmp_path / f"{name}.csv")) > 0
    claims = pd.read_csv(tmp_path / "claims.csv")
    assert set(claims["claim"].astype(str)) == {"1", "2/3"} and {"exponent", "lo", "hi"} <= set(claims.columns)
    for stem in (
        "theory_bias_vs_G_exact_baseline",
        "theory_bias_vs_G_group_norm",
        "theory_bias_vs_eps",
        "theory_shortfall_vs_eps",
        "theory_reward_vs_delay",
    ):
        assert (tmp_path / f"{stem}.png").stat().st_size > 1000
        assert (tmp_path / f"{stem}.pdf").stat().st_size > 1000
    assert not list(tmp_path.glob(".*.tmp"))


def test_bias_norm_interval_covers_with_the_targets_own_noise():
    """||E x - E y|| from two noisy sample sets: the interval covers the truth about 95% of the
    time when the target's Monte Carlo noise is counted, and 0 is inside when they agree."""
    rng = np.random.default_rng(0)
    P, n = 30, 1500
    offset = np.zeros(P)
    offset[0] = 0.08
    covered = zero_inside = 0
    for _ in range(200):
        x = rng.standard_normal((n, P)) + offset
        y = rng.standard_normal((n, P))
        b, lo, hi, se = _bias_norm(x, y)
        covered += lo <= 0.08 <= hi
        zero_inside += _bias_norm(rng.standard_normal((n, P)), y)[1] == 0
    assert covered / 200 >= 0.9 and zero_inside / 200 >= 0.9
    b, lo, hi, se = _bias_norm(rng.standard_normal((n, P)) * 0.01 + offset)
    assert b == pytest.approx(0.08, abs=0.002) and se == pytest.approx((hi - lo) / 2 / 1.96, rel=0.2)


def test_group_normalised_table_has_the_is_floor_and_excess_over_it():
    world = TabularWorld(V=4, T=4)
    df = fixed_policy_experiment(world, [4, 256], [0.1], [0.5], n_rep=3000, seed=0, progress=False)
    norm = df[df.variant == "group_norm"].set_index(["G", "algorithm"])
    assert set(df[df.algorithm == "is"]["variant"]) == {"group_norm"}
    assert (norm.xs("is", level="algorithm")["excess"] == 0).all()
    assert norm.loc[(256, "is"), "bias_lo"] > 0  # the floor: even uncapped IS is biased here
    # gmc's excess over the floor shrinks with G, tic's does not
    assert norm.loc[(256, "gmc"), "excess"] < 0.5 * norm.loc[(4, "gmc"), "excess"]
    assert norm.loc[(256, "tic"), "excess_lo"] > 0.5 * norm.loc[(4, "tic"), "excess"]
    for G in (4, 256):  # triangle inequality: |bias - floor| <= excess, up to Monte Carlo noise
        for m in ("tic", "gmc"):
            gap = abs(norm.loc[(G, m), "bias"] - norm.loc[(G, "is"), "bias"])
            assert gap <= norm.loc[(G, m), "excess_hi"] + norm.loc[(G, m), "bias_hi"] - norm.loc[(G, m), "bias_lo"]
    exact = df[df.variant == "exact_baseline"]
    assert (exact["bias"] == exact["excess"]).all()


def test_claim_fits_recover_synthetic_power_laws():
    rows = []
    for G in (2, 8, 32, 128, 512):
        for eps in (0.05, 0.1, 0.2, 0.4, 0.8):
            for algorithm, k_eps, k_G in (("tic", -4.0, 0.0), ("gmc", -2.0, -0.4)):
                y = 1e-3 * eps**k_eps * G**k_G
                rows.append(
                    dict(
                        variant="exact_baseline",
                        drift=1.0,
                        rho_max_dev=2.0,
                        G=G,
                        eps=eps,
                        algorithm=algorithm,
                        excess=y,
                        excess_lo=0.9 * y,
                        excess_hi=1.1 * y,
                        excess_se=0.05 * y,
                    )
                )
    claims = claim_fits(pd.DataFrame(rows))
    assert len(claims) == 2 * 5 + 2 * 5
    for r in claims.itertuples():
        assert r.exponent == pytest.approx(r.reference, abs=1e-9) and r.covers_reference, r
        assert r.reference == CLAIM_EXPONENTS[(r.claim, r.algorithm)]
