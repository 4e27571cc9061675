"""The gradient lab (gmc.theory.gradients): a batch's gradient against a naive per-sample loop,
its statistics against direct formulas and a known truth, and a whole lab on a short history
where the truth is known (behaviour = current weights, caps that never bind)."""

import math

import numpy as np
import pytest
import torch
import yaml

from gmc.results.outputs import GRADIENT_LAB_FILES
from gmc.run.main import main_history
from gmc.settings import ConfigError, to_dict
from gmc.theory.config import GradientLabConfig
from gmc.theory.figures import lab_report
from gmc.theory.gradients import _Lab, _row, paired_ratio, run_gradient_lab

LAB = dict(
    delays=(0, 2), group_sizes=(2, 4), prompts=2, batches=4, focus_group_size=4, eps_values=(1000.0,), league=("cispo",)
)
"""A lab of seconds: the same weights (d = 0) and two updates apart, caps of 1 + 1000 that never bind."""


@pytest.fixture(scope="module")
def history(tmp_path_factory, small_config):
    """A finished on-policy history of 4 updates of the tiny model, behaviour log-probs from the trainer."""
    folder = tmp_path_factory.mktemp("lab")
    cfg = small_config(
        steps=4, behaviour_logprobs="trainer", **{"delay.d": 2, "delay.warmup": "history", "delay.history_steps": 4}
    )
    (folder / "run.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    main_history(str(folder / "run.yaml"), [], str(folder / "history"), queues=[])
    return folder / "history"


@pytest.fixture(scope="module")
def lab(history, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "gradient_lab"
    tables = run_gradient_lab(history, out, GradientLabConfig(**LAB), progress=False)
    return out, tables


def test_a_batch_gradient_is_the_per_sample_sum_of_each_estimators_weighted_score(history, tmp_path):
    """The lab's gradient of one batch (the trainer's update) equals, for tic and gmc at d = 2,
    ``-(1/N) sum_i w_i A_i grad log pi(y_i) / max_new_tokens`` summed sample by sample with
    autograd, the weights and advantages written out, on a batch with a gradient (a group of two
    rewards)."""
    lab = _Lab(history, GradientLabConfig(**LAB), tmp_path / "scratch", progress=False)
    try:
        weights = lab.weights()
        lab.load(0, weights)
        rates = lab.choose_prompts()
        assert len(lab.prompts) == 2 and all(0 < r < 1 for r in rates)
        for _ in range(20):  # a batch whose groups all have equal rewards has no gradient to compare
            groups = lab.sample(4, "trainer")
            if any(g.rewards.std() > 0 for g in groups):
                break
        else:
            pytest.fail("20 batches of the screened prompts without a group of two rewards")
        lab.load(2, weights)
        cfg = lab.run
        for algorithm in ("tic", "gmc"):
            got, _ = lab.gradients(lab.update(algorithm), [groups], False)
            naive = torch.zeros(got.shape[1], dtype=torch.float64)
            N = sum(g.response_ids.shape[0] for g in groups)
            for g in groups:
                lengths = g.response_mask.sum(1)
                logps = []
                for i in range(g.response_ids.shape[0]):
                    ids = torch.cat([g.prompt_ids, g.response_ids[i, : lengths[i]]]).unsqueeze(0)
                    logits = lab.model(ids).logits[0, len(g.prompt_ids) - 1 : -1].float() / cfg.sampling.temperature
                    logps.append(logits.log_softmax(-1).gather(1, ids[0, len(g.prompt_ids) :, None]).sum())
                rho = torch.stack(
                    [(lp.detach() - g.behaviour_logp[i, : lengths[i]].sum()).exp() for i, lp in enumerate(logps)]
                )
                cap = 1 + cfg.estimator.eps
                w = rho.clamp(max=cap) if algorithm == "tic" else rho * min(1.0, cap / float(rho.mean()))
                r = g.rewards.float()
                A = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
                loss = -sum(w[i] * A[i] * lp for i, lp in enumerate(logps)) / (N * cfg.sampling.max_new_tokens)
                lab.model.zero_grad(set_to_none=True)
                loss.backward()
                naive += torch.cat(
                    [p.grad.reshape(-1).double() if p.grad is not None else torch.zeros(p.numel()) for p in lab.params]
                )
            lab.model.zero_grad(set_to_none=True)
            assert float(naive.norm()) > 0
            np.testing.assert_allclose(got[0], naive.numpy(), rtol=1e-4, atol=1e-5 * float(naive.abs().max()))
    finally:
        lab.close()


def test_a_cells_statistics_are_the_direct_formulas_and_cover_a_known_bias():
    """Second moment, variance, cosine and the paired ratio as written out; the debiased bias of
    Gaussian samples whose means differ by a known vector covers its norm."""
    rng = np.random.default_rng(0)
    D, n = 400, 64
    offset = np.zeros(D)
    offset[:4] = 0.5  # ||offset|| = 1
    target = rng.standard_normal((n, D)) * 0.3 + 1.0
    g = rng.standard_normal((n, D)) * 0.3 + 1.0 + offset
    row = _row(g, target, None, [{"ratio/weight_max": 2.0}, {"ratio/weight_max": 4.0}])
    sq = (g**2).sum(1)
    assert row["second_moment"] == pytest.approx(sq.mean())
    assert row["variance"] == pytest.approx(np.trace(np.cov(g.T)))
    assert row["cosine"] == pytest.approx(
        g.mean(0) @ target.mean(0) / np.linalg.norm(g.mean(0)) / np.linalg.norm(target.mean(0))
    )
    assert row["bias_lo"] <= 1.0 <= row["bias_hi"] and row["bias"] == pytest.approx(1.0, abs=0.2)
    assert row["ratio/weight_max"] == 3.0 and math.isnan(row["excess"])
    flat = _row(g, np.zeros((n, D)), None, [])  # a target without gradient: no relative bias, no cosine
    assert math.isnan(flat["rel_bias"]) and math.isnan(flat["cosine"]) and flat["target_norm"] == 0
    x, y = sq, (target**2).sum(1)
    R, lo, hi = paired_ratio(x, y)
    assert R == pytest.approx(x.mean() / y.mean()) and lo < R < hi


def test_the_lab_writes_its_files_and_the_known_truths_hold(lab):
    """d = 0: behaviour and current weights are the same, every trajectory ratio is exactly 1, so
    tic, gmc, none and is compute one gradient (no excess, equal second moments). Caps of 1 + 1000
    never bind: tic and gmc equal uncapped IS at d = 2 as well. Every registered file is written."""
    out, tables = lab
    assert sorted(p.name for p in out.iterdir() if p.name in GRADIENT_LAB_FILES) == sorted(GRADIENT_LAB_FILES)
    assert len(tables["prompts"]) == 2 and tables["prompts"]["screened_reward"].between(0, 1, inclusive="neither").all()
    rows, pairs = tables["gradients"], tables["pairs"]
    at0 = rows[(rows["delay"] == 0) & ~rows["eps_row"]].set_index(["G", "algorithm"])
    assert set(pairs.loc[pairs["delay"] == 0, "log_ratio_max"]) == {0.0}
    for G in (2, 4):
        for name in ("tic", "gmc", "none"):
            assert at0.loc[(G, name), "excess"] == 0
            assert at0.loc[(G, name), "second_moment"] == pytest.approx(at0.loc[(G, "is"), "second_moment"], rel=1e-6)
    at2 = rows[(rows["delay"] == 2) & (rows["G"] == 4)]
    is_row = at2[(at2["algorithm"] == "is") & ~at2["eps_row"]].iloc[0]
    for name in ("tic", "gmc"):
        never = at2[(at2["algorithm"] == name) & at2["eps_row"]].iloc[0]
        assert never["eps"] == 1000 and never["excess"] == 0
        assert never["second_moment"] == pytest.approx(is_row["second_moment"], rel=1e-5)
    assert pairs.loc[pairs["delay"] == 2, "log_ratio_max"].max() != 0  # two updates move the policy
    # the league at the largest delay and focus group size only; the estimators of the run at every cell
    assert set(rows.loc[rows["algorithm"] == "cispo", ["delay", "G"]].itertuples(index=False)) == {(2, 4)}
    assert len(rows[(rows["algorithm"] == "grpo")]) == 4
    claims = tables["claims"]
    assert set(claims["claim"]) == {"2/3", "1", "second moment"}
    sm = claims[(claims["claim"] == "second moment") & (claims["delay"] == 0)]
    assert sm["exponent"].notna().any() and np.allclose(sm["exponent"].dropna(), 1.0)  # NaN: no gradient at all


def test_the_report_redraws_the_labs_markdown_and_figures_from_its_tables(lab, tmp_path):
    out, _ = lab
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("gradients", "pairs", "claims", "prompts"):
        (copy / f"{name}.csv").write_bytes((out / f"{name}.csv").read_bytes())
    written = lab_report(copy)
    assert (copy / "gradient_lab.md").read_text() == (out / "gradient_lab.md").read_text()
    assert {p.name for p in written} >= {"gradient_bias_vs_G.png", "gradient_excess_vs_eps.pdf"}
    assert "| gmc / tic |" in (copy / "gradient_lab.md").read_text().replace("second moment | 0", "")


def test_a_bad_history_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="not a finished history"):
        run_gradient_lab(tmp_path, tmp_path / "out", GradientLabConfig(), progress=False)
    assert not (tmp_path / "out").exists()


def test_a_history_of_several_updates_per_step_is_refused_naming_the_key(tmp_path, small_config):
    """The lab's pairs are d updates apart: a history stepping two versions at a time cannot continue to them."""
    from gmc.theory.gradients import continuation_config

    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(to_dict(small_config(prompts_per_step=4, updates_per_batch=2)))
    )
    with pytest.raises(ConfigError, match="^updates_per_batch: .* 2 updates per step"):
        continuation_config(tmp_path, 2)


def test_a_policy_that_never_varies_is_refused_naming_what_to_change(history, tmp_path, monkeypatch):
    """Prompts every answer of which gets one reward give no gradient: the lab says so, not a table of zeros."""
    monkeypatch.setattr(
        _Lab,
        "sample",
        lambda self, G, behaviour, prompts=None: [type("Group", (), {"rewards": torch.ones(G)})() for _ in prompts],
    )
    lab = _Lab(history, GradientLabConfig(**{**LAB, "prompt_pool": 6}), tmp_path / "scratch", progress=False)
    try:
        with pytest.raises(ValueError, match="0 of 6 screened prompts .* raise prompt_pool"):
            lab.choose_prompts()
    finally:
        lab.close()
