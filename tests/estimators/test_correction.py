"""The mismatch correction (gmc.estimators.correction, gmc.estimators.mismatch) against naive
loops over tokens and responses, and hand-computed cases; its settings' errors; verl's own code
is in test_peers.py."""

import math

import pytest
import torch

from gmc.estimators.correction import PRESETS, RolloutCorrection, parse_is_threshold, parse_rs
from gmc.estimators.mismatch import correct, correct_bypass, importance_weights, offpolicy_metrics, rejection_mask
from gmc.settings import ConfigError


def batch(seed, rows=6, T=7, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(rows, T, generator=g) * 2 - 0.05
    trainer = (sampler + scale * torch.randn(rows, T, generator=g)).clamp(max=-1e-3)
    lengths = torch.randint(0, T + 1, (rows,), generator=g)
    lengths[0] = T
    mask = torch.arange(T).expand(rows, T) < lengths.unsqueeze(-1)
    return trainer, sampler, mask


def naive_weights(lr, mask, level, upper, lower=None):
    out = torch.zeros_like(lr)
    for i in range(lr.shape[0]):
        total = sum(float(lr[i, t]) for t in range(lr.shape[1]) if mask[i, t])
        for t in range(lr.shape[1]):
            if not mask[i, t]:
                continue
            raw = math.exp(max(-20.0, min(20.0, float(lr[i, t]) if level == "token" else total)))
            if lower is None:
                out[i, t] = min(raw, upper)
            else:
                out[i, t] = raw if lower <= raw <= upper else 0.0
    return out


def naive_keep(lr, mask, name, low, high):
    """verl's rule per token and response, written out."""
    level, k = name.rsplit("_", 1)
    keep = torch.zeros_like(mask)
    for i in range(lr.shape[0]):
        valid = [t for t in range(lr.shape[1]) if mask[i, t]]
        per = {}
        for t in valid:
            x = max(-20.0, min(20.0, float(lr[i, t])))
            per[t] = {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[k]
        for t in valid:
            if level == "token":
                stat = per[t]
            elif level == "seq_sum":
                stat = sum(per.values())
            elif level == "seq_mean":
                stat = sum(per.values()) / len(valid)
            else:
                stat = max(per.values())
            ok = math.log(low) <= stat <= math.log(high) if k == "k1" else stat <= high
            keep[i, t] = ok
    return keep


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 1.1, "0.5_1.5"])
def test_weights_equal_a_naive_loop(seed, level, threshold):
    trainer, sampler, mask = batch(seed)
    lr = trainer - sampler
    w, stats = importance_weights(lr, mask, level, threshold)
    upper, lower = parse_is_threshold(threshold)
    torch.testing.assert_close(w, naive_weights(lr, mask, level, upper, lower), rtol=1e-6, atol=1e-7)
    assert float(stats["rollout_is_mean"]) == pytest.approx(float(w[mask].mean()), rel=1e-6)
    assert not w.requires_grad


def test_weights_hand_case():
    # one response of two tokens: token ratios 2 and 0.5, the product 1
    lr = torch.tensor([[math.log(2.0), math.log(0.5)]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    w, _ = importance_weights(lr, mask, "token", 1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5]]))
    w, _ = importance_weights(lr, mask, "sequence", 1.5)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0]]))
    w, stats = importance_weights(lr, mask, "token", "0.6_5.0")  # IcePop: 0.5 falls out of the band
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.0]]))
    assert float(stats["rollout_is_oob_ratio"]) == 0.5


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "name,threshold",
    [
        ("token_k1", "0.8_1.25"),
        ("token_k2", 0.02),
        ("token_k3", 0.02),
        ("seq_sum_k1", 2.0),
        ("seq_sum_k3", 0.1),
        ("seq_mean_k1", "0.9_1.1"),
        ("seq_mean_k2", 0.02),
        ("seq_mean_k3", 0.02),
        ("seq_max_k2", 0.05),
        ("seq_max_k3", 0.05),
    ],
)
def test_rejection_equals_a_naive_loop(seed, name, threshold):
    trainer, sampler, mask = batch(seed)
    lr = trainer - sampler
    keep, stats = rejection_mask(lr, mask, name, threshold)
    ((_, low, high),) = parse_rs(name, threshold)
    expected = naive_keep(lr, mask, name, low, high)
    assert torch.equal(keep, expected)
    assert float(stats["rollout_rs_masked_fraction"]) == pytest.approx(float((~keep[mask]).float().mean()))


def test_chained_criteria_keep_what_every_one_keeps():
    trainer, sampler, mask = batch(5, rows=12, scale=0.5)
    lr = trainer - sampler
    keep, stats = rejection_mask(lr, mask, "token_k1,seq_mean_k3", "0.7_1.4,0.05")
    one, _ = rejection_mask(lr, mask, "token_k1", "0.7_1.4")
    two, _ = rejection_mask(lr, mask, "seq_mean_k3", 0.05)
    assert torch.equal(keep, one & two)
    assert 0 < float(stats["rollout_rs_masked_fraction"]) < 1
    assert {"rollout_rs_token_k1_masked_fraction", "rollout_rs_seq_mean_k3_seq_masked_fraction"} <= set(stats)
    # a single k1 bound u means [1/u, u]
    assert parse_rs("token_k1", 2.0) == [("token_k1", 0.5, 2.0)]


def test_correct_applies_nothing_unset_and_prefixes_its_statistics():
    trainer, sampler, mask = batch(0)
    w, keep, stats = correct(trainer - sampler, mask, RolloutCorrection().resolved())
    assert w is None and torch.equal(keep, mask) and stats == {}
    w, keep, stats = correct(trainer - sampler, mask, RolloutCorrection(preset="decoupled_geo_rs_token_tis").resolved())
    assert w is not None and keep.sum() < mask.sum()
    assert all(k.startswith("rollout_corr/") for k in stats)


def test_bypass_weights_carry_the_kept_share_under_token_mean():
    """Hand case: six valid tokens, of which token-k1 rejection in [1/2, 2] drops two (|log-ratio|
    above log 2); under token_mean the weights are correct's times 4/6 (a 0-dim 4/6 without
    importance weights), under seq_mean or without rejection correct's own."""
    lr = torch.tensor([[0.0, 1.0, 0.0, 0.1], [-1.0, 0.2, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    rs = {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}
    for settings in (rs, {**rs, "rollout_is": "token", "rollout_is_threshold": 2.0}):
        resolved = RolloutCorrection(**settings, bypass_mode=True).resolved()
        w, keep, stats = correct(lr, mask, resolved)
        expected = torch.tensor(4 / 6) if w is None else w * 4 / 6
        bw, bkeep, bstats = correct_bypass(lr, mask, resolved, "token_mean")
        assert torch.equal(bkeep, keep) and int(keep.sum()) == 4 and bstats.keys() == stats.keys()
        torch.testing.assert_close(bw, expected)
        sw, _, _ = correct_bypass(lr, mask, resolved, "seq_mean")
        assert sw is w is None or torch.equal(sw, w)
    tis = RolloutCorrection(rollout_is="token", rollout_is_threshold=2.0, bypass_mode=True).resolved()
    assert torch.equal(correct_bypass(lr, mask, tis, "token_mean")[0], correct(lr, mask, tis)[0])


def test_offpolicy_metrics_hand_case():
    # one response of two tokens: trainer log-probs (-1, -2), sampler's (-1.5, -1)
    trainer = torch.tensor([[-1.0, -2.0]])
    sampler = torch.tensor([[-1.5, -1.0]])
    m = offpolicy_metrics(trainer, sampler, torch.ones(1, 2, dtype=torch.bool))
    lr = [0.5, -1.0]
    assert float(m["rollout_corr/training_ppl"]) == pytest.approx(math.exp(1.5))
    assert float(m["rollout_corr/rollout_ppl"]) == pytest.approx(math.exp(1.25))
    assert float(m["rollout_corr/kl"]) == pytest.approx(-sum(lr) / 2)
    assert float(m["rollout_corr/k3_kl"]) == pytest.approx(sum(math.exp(x) - x - 1 for x in lr) / 2)
    assert float(m["rollout_corr/log_ppl_diff"]) == pytest.approx(-1.25 + 1.5)
    assert float(m["rollout_corr/ppl_ratio"]) == pytest.approx(math.exp(0.25))
    assert float(m["rollout_corr/chi2_token"]) == pytest.approx(sum(math.exp(2 * x) for x in lr) / 2 - 1)
    assert float(m["rollout_corr/chi2_seq"]) == pytest.approx(math.exp(2 * sum(lr)) - 1)
    same = offpolicy_metrics(trainer, trainer, torch.ones(1, 2, dtype=torch.bool))
    assert float(same["rollout_corr/kl"]) == 0 and float(same["rollout_corr/chi2_seq"]) == 0


def test_presets_and_settings():
    assert len(PRESETS) == 19
    for name in PRESETS:
        RolloutCorrection(preset=name)  # each validates
    r = RolloutCorrection(preset="decoupled_seq_is_rs", rollout_is_threshold=3.0).resolved()
    assert r == {
        "rollout_is": "sequence",
        "rollout_is_threshold": 3.0,
        "rollout_rs": "seq_sum_k1",
        "rollout_rs_threshold": "0.5_2.0",
        "bypass_mode": False,
    }
    assert RolloutCorrection(preset="bypass_pg_is").bypass and not RolloutCorrection().bypass
    with pytest.raises(ConfigError, match="rollout_correction.rollout_rs_threshold"):
        RolloutCorrection(rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="1.5,0.1,0.2")
    with pytest.raises(ConfigError, match="seq_mean_k3 takes one upper bound"):
        RolloutCorrection(rollout_rs="seq_mean_k3", rollout_rs_threshold="0.1_0.2")
    with pytest.raises(ConfigError, match="rollout_correction.rollout_is_threshold: not a number"):
        RolloutCorrection(rollout_is="token", rollout_is_threshold="two")
