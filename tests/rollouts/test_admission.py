"""The staleness bound of real asynchrony: admission by capacity, and dropping what is too old
(no Ray: the rule on its own), in optimizer updates."""

from types import SimpleNamespace

import numpy as np
import pytest

from gmc.rollouts.delays import DelayConfig


def test_the_staleness_bound_admits_by_capacity_and_drops_what_is_too_old():
    from gmc.rollouts.ray.admission import StalenessBound

    bound = StalenessBound(max_staleness=2, per_update=4)
    assert bound.capacity(0) == 12  # (S + v + 1) b before anything started
    bound.started(12)
    assert bound.capacity(0) == 0 and bound.capacity(1) == 4
    assert all(bound.finished(0, 0) for _ in range(10)) and bound.accepted == 10
    assert bound.finished(0, 3) is False and bound.dropped == 1  # arrived 3 versions after its weights
    bound.lost(1)  # its worker died
    assert bound.in_flight == 0 and bound.capacity(0) == 2
    assert bound.too_old(0, 3) and not bound.too_old(1, 3)
    bound.discard()  # a buffered group dropped at consumption frees its slot
    assert bound.accepted == 9 and bound.dropped == 2 and bound.capacity(0) == 3
    state = bound.state_dict()
    resumed = StalenessBound(2, 4)
    resumed.load_state_dict(state)
    assert (resumed.accepted, resumed.dropped, resumed.in_flight) == (9, 2, 0)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("K", [1, 2])
def test_under_the_capacity_rule_no_group_is_consumed_beyond_the_bound(seed, K):
    """A simulation of admission, out-of-order completion and consumption with K updates per step
    of B groups (b = B / K per update): every consumed group is at most S updates old at the update
    of its mini-batch, every batch is full, and what is dropped was too old."""
    from gmc.rollouts.ray.admission import StalenessBound

    rng = np.random.default_rng(seed)
    S, B, workers = 2, 4, 3
    b = B // K
    bound, buffer, running, consumed = StalenessBound(S, b), [], [], []
    for step in range(40):
        v = step * K  # the trainer's update, the version of its weights
        while True:
            while len(running) < workers and bound.capacity(v) > 0:
                bound.started(1)
                running.append((v, rng.integers(1, 30)))  # (weights, time to finish)
            kept = []
            for made in buffer:  # the update that would train it: its place's mini-batch's
                if bound.too_old(made, v + min(len(kept), B - 1) // b):
                    bound.discard()
                else:
                    kept.append(made)
            buffer = kept
            if len(buffer) >= B:
                break
            k = int(np.argmin([t for _, t in running]))
            made, _ = running.pop(k)
            running = [(m, t - 1) for m, t in running]
            if bound.finished(made, v):
                buffer.append(made)
        batch, buffer = buffer[:B], buffer[B:]
        consumed += [v + i // b - m for i, m in enumerate(batch)]
        assert len(batch) == B
    assert max(consumed) <= S and bound.accepted - len(buffer) == len(consumed)


@pytest.mark.parametrize(
    "K, S, publish, refused",
    [(1, 1, 2, False), (1, 1, 3, True), (2, 1, 1, False), (2, 0, 1, True), (2, 3, 2, False), (2, 2, 2, True)],
)
def test_a_publish_interval_the_bound_cannot_wait_out_is_refused_counting_updates(K, S, publish, refused):
    """The last update before a send finds only groups at least publish_every x K - 1 updates
    old: a bound below that would wait forever, and is refused naming the key."""
    from gmc.rollouts.ray.admission import check_ray_mode
    from gmc.settings import ConfigError

    delay = DelayConfig(mode="ray", max_staleness=S, publish_every=publish)
    cfg = SimpleNamespace(delay=delay, updates_per_batch=K, behaviour_logprobs="trainer", engine="hf")
    if refused:
        with pytest.raises(ConfigError, match=f"^delay.publish_every: .* at least {publish * K - 1} updates old"):
            check_ray_mode(cfg)
    else:
        check_ray_mode(cfg)
