"""The theory lab's world is exact, and its Monte Carlo agrees with closed forms."""

import numpy as np
import pandas as pd
import pytest

from gmc.cli import main
from gmc.theory import TabularWorld, delayed_run, fixed_policy_experiment


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
    tic = df[(df.method == "tic") & (df.variant == "exact_baseline")]
    for _, row in tic.iterrows():  # tic's bias is G-independent and known exactly
        assert row.bias_lo <= row.exact_bias * 1.02 and row.exact_bias * 0.98 <= row.bias_hi
    exact = df[df.variant == "exact_baseline"].set_index(["G", "method"])
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
    for name in ("fixed_policy", "bias_slopes", "delayed_runs", "delayed_summary"):
        assert len(pd.read_csv(tmp_path / f"{name}.csv")) > 0
    for stem in ("theory_bias_vs_G_exact_baseline", "theory_shortfall_vs_eps", "theory_reward_vs_delay"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 1000
        assert (tmp_path / f"{stem}.pdf").stat().st_size > 1000
    assert not list(tmp_path.glob(".*.tmp"))
