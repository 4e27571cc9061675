"""Rollout groups: the staleness statistics of a batch, computed without torch."""

import pytest
import torch

from gmc.rollouts.groups import Group, staleness_stats


def test_staleness_stats_without_torch_are_exact():
    batch = [
        Group(
            0,
            torch.zeros(1),
            torch.zeros(1, 1),
            torch.ones(1, 1, dtype=torch.bool),
            torch.zeros(1),
            None,
            torch.zeros(1, 1),
            version=v,
            consumed_version=5,
        )
        for v in (5, 3, 2)
    ]
    stats = staleness_stats(batch)
    assert stats == {
        "async/staleness_mean": pytest.approx(5 / 3),
        "async/staleness_max": 3.0,
        "async/staleness_min": 0.0,
    }
