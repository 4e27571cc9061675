"""The simulated sources (sync, fixed delay, latency model, trace replay), driven by a
deterministic group generator."""

import json

import numpy as np
import pytest
import torch

from gmc.rollouts.delays import DELAY_MODES, DelayConfig
from gmc.rollouts.groups import Collected, Group
from gmc.rollouts.sources import FixedDelaySource, LatencySource, SyncSource
from gmc.run.config import TrainConfig


class Generator:
    """Rollouts whose groups have response lengths drawn from a seeded RNG; records each call
    (prompts are numbered in the order they are taken)."""

    def __init__(self, G=4, seed=0, max_len=64):
        self.rng = np.random.default_rng(seed)
        self.G, self.max_len, self.calls, self.taken = G, max_len, [], 0

    def take(self, n):
        self.taken += n
        return list(range(self.taken - n, self.taken))

    def collect(self, prompts, version):
        self.calls.append((len(prompts), version))
        out = []
        for index in prompts:
            lengths = torch.tensor(self.rng.integers(1, self.max_len + 1, self.G))
            T = int(lengths.max())
            mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
            out.append(Group(index, torch.arange(5), torch.zeros(self.G, T, dtype=torch.long), mask,
                             torch.rand(self.G), torch.zeros(self.G, T), torch.zeros(self.G, T), version))
        return Collected(out, stats=("call", len(self.calls)))


@pytest.mark.parametrize("d", [1, 3, 8])
def test_prefill_staleness_is_exactly_d(d):
    gen = Generator()
    src = FixedDelaySource(gen, batch_prompts=2, d=d, warmup="prefill")
    for t in range(20):
        batch = src.next_batch(t).groups
        assert [g.staleness for g in batch] == [d, d]
        assert all(g.version == t - d for g in batch)
        assert len(src.queued_groups()) == 2 * d  # bounded
    # prefill generated d batches up front, then one per step
    assert len(gen.calls) == d + 20


def test_ramp_staleness_grows_to_d():
    d = 4
    src = FixedDelaySource(Generator(), batch_prompts=1, d=d, warmup="ramp")
    stale = [src.next_batch(t).groups[0].staleness for t in range(30)]
    assert stale[0] == 0
    assert all(b >= a for a, b in zip(stale, stale[1:]))
    assert stale[-1] == d
    assert max(len(src.queued_groups()) for _ in [0]) <= d + 1


def test_delay_zero_equals_sync():
    a, b = Generator(seed=1), Generator(seed=1)
    fixed = FixedDelaySource(a, 3, d=0)
    sync = SyncSource(b, 3)
    for t in range(5):
        x, y = fixed.next_batch(t).groups, sync.next_batch(t).groups
        assert [g.version for g in x] == [g.version for g in y] == [t] * 3
        for gx, gy in zip(x, y):
            assert torch.equal(gx.response_mask, gy.response_mask)
    assert a.calls == b.calls
    assert fixed.queued_groups() == []


def test_latency_model_long_answers_arrive_staler():
    cfg = DelayConfig(mode="latency", slots=16, alpha=0.5, beta=0.2, step_time=1.0)
    src = LatencySource(Generator(G=2, seed=3, max_len=60), batch_prompts=4, cfg=cfg)
    stale, lengths = [], []
    for t in range(150):
        batch = src.next_batch(t).groups
        for g in batch:
            stale.append(g.staleness)
            lengths.append(g.max_length)
            assert g.completed_at == pytest.approx(g.submitted_at + 0.5 + 0.2 * g.max_length)
            assert g.completed_at <= src.clock
        assert len(src.queued_groups()) <= cfg.slots + 4 + cfg.slots  # in flight + ready, bounded
        assert len(src.in_flight) == cfg.slots
    corr = np.corrcoef(stale[100:], lengths[100:])[0, 1]
    assert corr > 0.3, corr
    assert min(stale) >= 0


def test_latency_completion_order_and_idle_time():
    cfg = DelayConfig(mode="latency", slots=2, alpha=5.0, beta=0.0, step_time=1.0)
    src = LatencySource(Generator(G=2), batch_prompts=2, cfg=cfg)
    batch = src.next_batch(0).groups
    assert [g.completed_at for g in batch] == [5.0, 5.0]
    assert src.idle_time == pytest.approx(5.0)  # the trainer waited for the first groups
    batch = src.next_batch(1).groups  # refills were submitted at t=5 with version 0
    assert [g.version for g in batch] == [0, 0] and batch[0].completed_at == 10.0


def test_latency_noise_is_seeded_and_state_round_trips():
    cfg = DelayConfig(mode="latency", slots=4, alpha=1.0, beta=0.1, noise_scale=1.0)
    a = LatencySource(Generator(seed=5), 2, cfg, seed=9)
    for t in range(5):
        a.next_batch(t)
    state = a.state_dict()
    b = LatencySource(Generator(seed=5), 2, cfg, seed=9)
    b.load_state_dict(state)
    assert b.clock == a.clock and len(b.in_flight) == len(a.in_flight)
    assert [i.completes_at for i in sorted(b.in_flight)] == [i.completes_at for i in sorted(a.in_flight)]
    assert a.rng.random() == b.rng.random()


def test_fixed_state_round_trip_and_queue_bytes():
    a = FixedDelaySource(Generator(seed=2), 2, d=3)
    for t in range(4):
        a.next_batch(t)
    b = FixedDelaySource(Generator(seed=2), 2, d=3)
    b.load_state_dict(a.state_dict())
    assert [g.version for g in b.queued_groups()] == [g.version for g in a.queued_groups()]
    stats = a.stats()
    assert stats["async/queue_groups"] == 6 and stats["async/queue_bytes"] > 0


def test_delay_config_validation():
    with pytest.raises(ValueError, match=r"delay.mode: unknown delay mode 'async'; known: \['sync', 'fixed', 'latency', 'ray', 'trace'\]"):
        DelayConfig(mode="async")
    with pytest.raises(ValueError, match="delay.d: must be greater than or equal to 0"):
        DelayConfig(d=-1)
    assert isinstance(DELAY_MODES["sync"].make_source(TrainConfig(delay=DelayConfig(mode="sync")), Generator(), None), SyncSource)


@pytest.mark.parametrize("alpha,beta,noise", [(1.0, 0.5, 0.0), (0.1, 0.05, 1.0)])
def test_latency_refills_carry_the_weights_of_the_moment_their_slot_frees(alpha, beta, noise):
    cfg = DelayConfig(mode="latency", slots=24, alpha=alpha, beta=beta, noise_scale=noise, step_time=1.0)
    gen = Generator(G=2, seed=4, max_len=30)
    src = LatencySource(gen, batch_prompts=8, cfg=cfg, seed=1)
    ends, consumed = [], []
    for t in range(60):
        consumed += src.next_batch(t).groups
        ends.append(src.clock)  # the weights change after this moment
        assert not src.pending  # every refill of the step is generated before its weights change
    groups = consumed + src.queued_groups()
    frees = {0.0} | {g.completed_at for g in groups}
    for g in groups:
        # the weights in force when the slot freed: one version per optimizer step finished before
        assert g.version == sum(e < g.submitted_at for e in ends)
        assert g.submitted_at in frees
    assert len(src.in_flight) == cfg.slots
    # refills are batched: far fewer generation calls than refilled slots
    assert len(gen.calls) <= 2 * 60 and sum(n for n, _ in gen.calls) == len(groups)


def test_a_batch_carries_the_measurements_of_every_collector_call_made_for_it():
    """Nothing is stashed for later: each step's batch holds what the calls made during it returned."""
    gen = Generator()
    src = FixedDelaySource(gen, batch_prompts=2, d=3, warmup="prefill")
    first, second = src.next_batch(0), src.next_batch(1)
    assert first.collected == [("call", k) for k in (1, 2, 3, 4)]  # the prefill and this step's batch
    assert second.collected == [("call", 5)]
    lat = LatencySource(Generator(), 2, DelayConfig(mode="latency", slots=4, alpha=1.0, beta=0.1))
    batches = [lat.next_batch(t) for t in range(6)]
    assert sum(len(b.collected) for b in batches) == len(lat.rollouts.calls)


def test_a_trace_is_replayed_with_its_recorded_versions_and_steps(tmp_path):
    from gmc.rollouts.sources import TraceSource, check_trace

    trace = tmp_path / "staleness_trace.jsonl"
    rows = [(7, -1, 0), (3, 0, 0), (5, 0, 1), (1, 1, 1), (2, 1, 2), (9, 0, 2)]
    trace.write_text("".join(json.dumps({"prompt_index": p, "version": v, "consumed_version": c}) + "\n"
                             for p, v, c in rows))
    gen = Generator()
    src = TraceSource(gen, 2, DelayConfig(mode="trace", trace=str(trace)))
    got = [[(g.prompt_index, g.version, g.staleness) for g in src.next_batch(t).groups] for t in range(3)]
    assert got == [[(7, -1, 1), (3, 0, 0)], [(5, 0, 1), (1, 1, 0)], [(2, 1, 1), (9, 0, 2)]]
    assert gen.calls == [(1, -1), (3, 0), (2, 1)]  # one call per recorded version, at that version
    check_trace(DelayConfig(mode="trace", trace=str(trace)), 3, 2)
    with pytest.raises(ValueError, match=r"^steps: the trace .* records 3 steps, the run has 4"):
        check_trace(DelayConfig(mode="trace", trace=str(trace)), 4, 2)
    with pytest.raises(ValueError, match=r"^prompts_per_step: .* records \[2\] groups per step, the run consumes 3"):
        check_trace(DelayConfig(mode="trace", trace=str(trace)), 3, 3)
    with pytest.raises(ValueError, match="delay.trace: .*no such staleness trace"):
        check_trace(DelayConfig(mode="trace", trace=str(tmp_path / "nope.jsonl")), 3, 2)
