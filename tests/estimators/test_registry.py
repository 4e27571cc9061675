"""The estimator registry: every entry's loss resolves and reports the diagnostics the entry
names, unknown names list the known ones, and each diagnostic is named once."""

import pytest
import torch

from gmc import estimators
from gmc.estimators import REGISTRY, EstimatorConfig, diagnostic_names, get_estimator


def _stale_batch(seed=0, B=4, G=4, T=6):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, G, T, generator=gen) * 2
    logp_b = logp - 1.2 * torch.randn(B, G, T, generator=gen)  # far from on-policy: caps, clips and masks fire
    mask = torch.ones(B, G, T, dtype=torch.bool)
    mask[:, :, -2:] = torch.rand(B, G, 2, generator=gen) > 0.5
    adv = torch.randn(B, G, generator=gen)
    return logp.requires_grad_(), logp_b, mask, adv


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_entry_resolves_its_loss_and_the_loss_reports_the_diagnostics_it_names(name):
    entry = REGISTRY[name]
    assert entry.label and entry.color and entry.loss.count(":") == 1
    assert entry.aggregation in estimators.AGGREGATIONS and isinstance(entry.needs_batch_stats, bool)
    hash(entry.on_policy)
    loss_fn = entry.loss_function()
    assert callable(loss_fn) and get_estimator(name) is loss_fn
    _, stats = loss_fn(*_stale_batch(), entry.resolved(EstimatorConfig()), max_new_tokens=8)
    for key in entry.diagnostics:
        assert key in stats and 0 < stats[key] <= 1, (name, key, stats.get(key))


def test_an_unknown_estimator_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown estimator 'ppo'; known: \['cispo', "):
        get_estimator("ppo")


def test_diagnostic_names_cover_every_estimator_once():
    names = diagnostic_names()
    assert len(names) == len(set(names))
    assert {
        "ratio/frac_groups_capped",
        "ratio/frac_traj_capped",
        "ratio/frac_tokens_clipped",
        "ratio/frac_seq_clipped",
        "ratio/frac_tokens_masked",
        "ratio/frac_seq_masked",
        "ratio/frac_tokens_damped",
        "ratio/ess_frac",
        "ratio/shortfall",
    } == set(names)
