"""The delay-mode registry: each mode builds its source and names the keys it reads, whether a
run is on-policy is the mode's answer, and unknown modes list the registry."""

import pytest

from gmc.rollouts import delays, sources
from gmc.rollouts.delays import DELAY_MODES, DelayConfig, named_delays
from gmc.rollouts.sources import LatencySource
from gmc.run.config import TrainConfig


def test_delay_modes_build_their_sources_and_bad_modes_list_the_registry():
    records = [{"prompt": "1+1", "answer": "2"}] * 4
    for mode, entry in DELAY_MODES.items():
        assert entry.label and set(entry.keys) <= {f for f in DelayConfig.__dataclass_fields__} - {"mode"}
        if entry.in_process:  # ray's builder is tested with Ray (tests/e2e/test_ray.py)
            source = entry.make_source(
                TrainConfig(delay=DelayConfig(mode=mode, d=2), prompts_per_step=2), None, records
            )
            assert isinstance(source, sources.SyncSource)
    assert isinstance(
        DELAY_MODES["latency"].make_source(TrainConfig(delay=DelayConfig(mode="latency")), None, records), LatencySource
    )
    assert named_delays() == ["latency", "ray"]
    # whether a run can train on-policy is the delay mode's answer alone
    assert [
        delays.on_policy(DelayConfig(mode=m, d=d)) for m, d in (("sync", 0), ("fixed", 0), ("fixed", 1), ("latency", 0))
    ] == [True, True, False, False]
    with pytest.raises(
        ValueError,
        match=r"delay.mode: unknown delay mode 'bursty'; known: \['sync', 'fixed', 'latency', 'ray', 'trace'\]",
    ):
        DelayConfig(mode="bursty")
