"""The staleness bound of real asynchrony: admission by capacity, and dropping what is too old
(no Ray: the rule on its own)."""

import numpy as np
import pytest


def test_the_staleness_bound_admits_by_capacity_and_drops_what_is_too_old():
    from gmc.rollouts.ray.admission import StalenessBound

    bound = StalenessBound(max_staleness=2, batch=4)
    assert bound.capacity(0) == 12  # (S + v + 1) B before anything started
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
def test_under_the_capacity_rule_no_group_is_consumed_beyond_the_bound(seed):
    """A simulation of admission, out-of-order completion and consumption: every consumed group is
    at most S versions old, every batch is full, and what is dropped was too old."""
    from gmc.rollouts.ray.admission import StalenessBound

    rng = np.random.default_rng(seed)
    S, B, workers = 2, 4, 3
    bound, buffer, running, consumed = StalenessBound(S, B), [], [], []
    for v in range(40):
        while True:
            while len(running) < workers and bound.capacity(v) > 0:
                bound.started(1)
                running.append((v, rng.integers(1, 30)))  # (weights, time to finish)
            buffer = [g for g in buffer if not (bound.too_old(g, v) and (bound.discard() or True))]
            if len(buffer) >= B:
                break
            k = int(np.argmin([t for _, t in running]))
            made, _ = running.pop(k)
            running = [(m, t - 1) for m, t in running]
            if bound.finished(made, v):
                buffer.append(made)
        batch, buffer = buffer[:B], buffer[B:]
        consumed += [v - m for m in batch]
        assert len(batch) == B
    assert max(consumed) <= S and bound.accepted - len(buffer) == len(consumed)
