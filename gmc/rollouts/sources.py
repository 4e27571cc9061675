"""Simulated asynchrony: the rollout sources of a training run (method.md section 4).

At every step the trainer asks its source (:data:`gmc.rollouts.delays.DELAY_MODES`: ``sync``,
``fixed``, ``latency``, ``trace``; each built by a function here from the run's
:class:`~gmc.run.config.TrainConfig`) for a :class:`~gmc.rollouts.groups.Batch` of groups, which
it trains with ``updates_per_batch`` (``K``) optimizer updates. A source gets groups from a
:class:`~gmc.rollouts.groups.Rollouts` (the run's prompt order and the collector,
:mod:`gmc.rollouts.collect`) and labels each with the policy version that generated it and the
version that consumes it. Versions count optimizer updates: the trainer asks for step ``s``'s
batch with the weights of update ``s K`` and publishes those of update ``(s + 1) K`` after it.
Old weights are never kept, so memory is O(delay x batch x tokens). No torch is imported.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gmc.rollouts.delays import DelayConfig
from gmc.rollouts.groups import Batch, Group, Rollouts
from gmc.settings import ConfigError, to_dict

log = logging.getLogger(__name__)


class SyncSource:
    """No queue: every step trains on a batch generated with the current weights."""

    def __init__(self, rollouts: Rollouts, batch_prompts: int):
        self.rollouts = rollouts
        self.batch_prompts = batch_prompts
        self._collected: list[Any] = []
        self._carried: list[Any] = []  # measurements of calls made before the first step (a loaded prefill)

    def _generate(self, n: int, version: int) -> list[Group]:
        """``n`` groups of the run's next prompts with the weights of ``version``; the call's
        measurements go with this step's batch."""
        out = self.rollouts.collect(self.rollouts.take(n), version)
        self._collected.append(out.stats)
        return out.groups

    def next_batch(self, version: int) -> Batch:
        """The groups of the step whose first update is ``version`` (their ``consumed_version``;
        the trainer sets each mini-batch's own update)."""
        self._collected, self._carried = self._carried, []
        groups = self._next(version)
        for g in groups:
            g.consumed_version = version
        return Batch(groups, self._collected)

    def _next(self, version: int) -> list[Group]:
        return self._generate(self.batch_prompts, version)

    def queued_groups(self) -> list[Group]:
        return []

    def load_history(self, batches: list[list[Group]]) -> None:
        """Start after a history (``warmup: history``): the batches it generated for this queue,
        oldest first, labelled with the versions (updates, counted back from the run's first) that
        made them. A source without a queue takes none."""
        if batches:
            raise ValueError(f"{type(self).__name__} keeps no queue: it starts from a history's weights alone")

    def publish(self, model, version: int) -> None:
        """The weights of update ``version`` (the starting ones, then after every step); an
        in-process source generates with the trainer's model itself and needs no copy."""

    def close(self) -> None:
        """Release what the source started (workers, clusters); the in-process ones start nothing."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def stats(self) -> dict[str, float]:
        groups = self.queued_groups()
        return {"async/queue_groups": float(len(groups)), "async/queue_bytes": float(sum(g.nbytes for g in groups))}


class FixedDelaySource(SyncSource):
    """A FIFO of step batches with delay ``d`` (in batches): at step ``t`` a batch is generated with
    the current weights and pushed, and the batch generated at ``t - d`` is popped, so with ``K``
    updates per batch it is ``d K`` updates stale at its first update. How the queue starts
    [choice, ``delay.warmup``]: ``history``, with the ``d`` batches an on-policy history generated
    for it with its last ``d`` versions and trained on none (:meth:`load_history`), versions
    ``-d K .. -K``, so the staleness is ``d`` batches at every step, from ``d`` distinct behaviour
    policies; ``prefill``, with ``d`` batches of the starting
    weights ``theta_0``, labelled with its version, so the batch trained at step ``t < d`` is
    ``t`` batches stale; ``ramp``, empty, generating two batches per step until it is ``d`` ahead.
    ``d = 0`` is on-policy training."""

    def __init__(self, rollouts: Rollouts, batch_prompts: int, d: int, warmup: str = "prefill"):
        super().__init__(rollouts, batch_prompts)
        self.d = d
        self.warmup = warmup
        self.queue: deque[list[Group]] = deque()
        self.started = False

    def _next(self, version: int) -> list[Group]:
        if not self.started:
            if self.warmup == "history" and self.d:
                raise ValueError(
                    f"a fixed delay of {self.d} with warmup: history starts from the {self.d} batches its "
                    "history generated for it (load_history), which were not given"
                )
            self.prefill(version)
        self.queue.append(self._generate(self.batch_prompts, version))
        if self.warmup == "ramp" and len(self.queue) <= self.d:
            self.queue.append(self._generate(self.batch_prompts, version))
        return self.queue.popleft()

    def prefill(self, version: int) -> list[Any]:
        """Start the queue before the update of ``version`` (warm-up ``prefill``: the ``d``
        batches of the starting weights, labelled ``version``: they are what generated them);
        returns the measurements of the calls it made."""
        self.started = True
        if self.warmup == "prefill":
            every = max(1, self.d // 8)  # a line per eighth: a prefill at paper scale takes hours
            for k in range(self.d):
                self.queue.append(self._generate(self.batch_prompts, version))
                if (k + 1) % every == 0 or k + 1 == self.d:
                    log.info("prefill: %d of %d batches generated", k + 1, self.d)
        return self._collected

    def load_history(self, batches: list[list[Group]]) -> None:
        if len(batches) != self.d:
            raise ValueError(
                f"a queue of d = {self.d} starts from the {self.d} batches its history generated for it, "
                f"got {len(batches)}"
            )
        self.queue, self.started = deque(batches), True

    def load_prefill(self, state: dict, collected: list[Any]) -> None:
        """Start from a prefill another run made (:meth:`prefill`, then :meth:`state_dict`); its
        measurements go with the first step's, as if this run had made it."""
        self.load_state_dict(state)
        self._carried = list(collected)

    def queued_groups(self) -> list[Group]:
        return [g for b in self.queue for g in b]

    def state_dict(self) -> dict:
        return {"started": self.started, "queue": [[g.state() for g in b] for b in self.queue]}

    def load_state_dict(self, state: dict) -> None:
        self.started = state["started"]
        self.queue = deque([Group.from_state(s) for s in b] for b in state["queue"])


PREFILL_FREE = ("algorithm", "estimator", "updates_per_batch")
"""The settings a fixed-delay prefill does not depend on: its ``d`` batches are generated with
the starting weights before the first update, so runs that differ only in these generate the
same prefill (same prompts, same streams, same grades) and may share one (:func:`prefill_settings`)."""


def prefill_settings(cfg) -> dict | None:
    """The resolved settings that decide a run's prefill (all but :data:`PREFILL_FREE`); None
    when the run starts without one (not a fixed delay with ``warmup: prefill`` and ``d > 0``)."""
    if cfg.delay.mode != "fixed" or cfg.delay.warmup != "prefill" or cfg.delay.d == 0:
        return None
    return {k: v for k, v in to_dict(cfg).items() if k not in PREFILL_FREE}


def prefill_id(cfg) -> str | None:
    """A short name of the run's prefill settings (:func:`prefill_settings`): runs with the same
    name generate the same prefill."""
    settings = prefill_settings(cfg)
    if settings is None:
        return None
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(order=True)
class _InFlight:
    completes_at: float
    seq: int
    group: Group = field(compare=False)


class LatencySource(SyncSource):
    """``slots`` generation slots on a virtual clock. A group submitted at ``s`` completes at
    ``s + alpha + beta * L_max`` (plus ``noise_scale * LogNormal(0, noise_sigma)``), ``L_max`` its
    longest response in tokens; a freed slot is refilled at once with the weights in force. The
    trainer takes finished groups in completion order until its batch is full (idling when too
    few are done); one step (its ``updates_per_batch`` updates) advances the clock by
    ``step_time``, and groups finishing during it are refilled with the step's starting weights. Long answers therefore arrive staler,
    which breaks the paper's Assumption 3 on purpose. (What a refill generates depends on the
    weights, not the moment, so the refills between two optimizer steps are generated together,
    in one call, as soon as the clock could need one of their completion times.)"""

    def __init__(self, rollouts: Rollouts, batch_prompts: int, cfg: DelayConfig, seed: int = 0):
        super().__init__(rollouts, batch_prompts)
        self.cfg = cfg
        self.clock = 0.0
        self.in_flight: list[_InFlight] = []
        self.ready: list[Group] = []
        self.pending: list[float] = []  # times of refilled slots whose groups are not generated yet
        self.seq = 0
        self.idle_time = 0.0
        self.rng = np.random.default_rng(seed)
        self.started = False

    def _latency(self, group: Group) -> float:
        lat = self.cfg.alpha + self.cfg.beta * group.max_length
        if self.cfg.noise_scale > 0:
            lat += self.cfg.noise_scale * float(self.rng.lognormal(0.0, self.cfg.noise_sigma))
        return lat

    def _flush(self, version: int) -> None:
        """Generate the groups of every slot refilled since the last flush, in one batched call
        (all with ``version``: refills are only deferred while the weights stay the same)."""
        times, self.pending = self.pending, []
        if not times:
            return
        for at, g in zip(times, self._generate(len(times), version)):
            g.submitted_at = at
            g.completed_at = at + self._latency(g)
            heapq.heappush(self.in_flight, _InFlight(g.completed_at, self.seq, g))
            self.seq += 1

    def _may_finish_by(self, until: float) -> bool:
        """Could a refilled, not yet generated group finish by ``until``? Its latency is at least
        ``alpha + beta``: every response has a token."""
        return bool(self.pending) and min(self.pending) + self.cfg.alpha + self.cfg.beta <= until

    def _complete_until(self, until: float, version: int) -> None:
        """Move every group finishing by ``until`` to ready; each freed slot is refilled at the
        moment it frees, with ``version`` (the weights do not change before ``until``)."""
        while True:
            if self._may_finish_by(until):
                self._flush(version)
            if not (self.in_flight and self.in_flight[0].completes_at <= until):
                return
            while self.in_flight and self.in_flight[0].completes_at <= until:
                item = heapq.heappop(self.in_flight)
                self.ready.append(item.group)
                self.pending.append(item.completes_at)

    def _next(self, version: int) -> list[Group]:
        if not self.started:
            self.started = True
            self.pending = [self.clock] * self.cfg.slots
        self._complete_until(self.clock, version)
        while len(self.ready) < self.batch_prompts:
            # the trainer idles until enough groups are done: jump to the completion that fills the batch
            need = self.batch_prompts - len(self.ready)
            if self.pending and len(self.in_flight) < need:
                self._flush(version)
                continue
            nxt = heapq.nsmallest(need, self.in_flight)[-1].completes_at
            if self._may_finish_by(nxt):
                self._flush(version)
                continue
            self.idle_time += nxt - self.clock
            self.clock = nxt
            self._complete_until(self.clock, version)
        self.ready.sort(key=lambda g: g.completed_at)
        batch, self.ready = self.ready[: self.batch_prompts], self.ready[self.batch_prompts :]
        # groups finishing while this step computes are refilled with the pre-update weights
        self.clock += self.cfg.step_time
        self._complete_until(self.clock, version)
        self._flush(version)
        return batch

    def queued_groups(self) -> list[Group]:
        return self.ready + [item.group for item in self.in_flight]

    def state_dict(self) -> dict:
        return {
            "clock": self.clock,
            "seq": self.seq,
            "idle_time": self.idle_time,
            "started": self.started,
            "ready": [g.state() for g in self.ready],
            "in_flight": [(i.completes_at, i.seq, i.group.state()) for i in self.in_flight],
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        self.clock, self.seq, self.idle_time, self.started = (
            state["clock"],
            state["seq"],
            state["idle_time"],
            state["started"],
        )
        self.ready = [Group.from_state(s) for s in state["ready"]]
        self.in_flight = [_InFlight(c, s, Group.from_state(g)) for c, s, g in state["in_flight"]]
        heapq.heapify(self.in_flight)
        self.rng.bit_generator.state = state["rng"]

    def stats(self) -> dict[str, float]:
        return {
            **super().stats(),
            "async/clock": self.clock,
            "async/trainer_idle": self.idle_time,
            "async/in_flight": float(len(self.in_flight)),
        }


def read_trace(path: str | Path) -> list[dict]:
    """The lines of a ``staleness_trace.jsonl`` (``prompt_index``, ``version``, ``consumed_version``
    of every consumed group, in consumption order, versions in steps: :func:`trace_line`); a
    missing or malformed file is named."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: no such staleness trace", "delay.trace")
    out = []
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        try:
            row = json.loads(line)
            out.append({k: int(row[k]) for k in TRACE_FIELDS})
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{p}:{lineno}: not a trace line with {list(TRACE_FIELDS)}", "delay.trace") from None
    return out


TRACE_FIELDS = ("prompt_index", "version", "consumed_version")
"""The fields of a staleness trace line."""


def trace_line(group: dict, updates_per_batch: int) -> dict:
    """A consumed group's line in a staleness trace, from its ``groups.jsonl`` record (versions in
    updates of ``updates_per_batch`` per step): its versions in steps, because a trace is replayed
    batch by batch, each batch generated with the weights of a step's first update (a replay takes
    step ``t`` as update ``t K``: :class:`TraceSource`)."""
    K = updates_per_batch
    return {
        "prompt_index": group["prompt_index"],
        "version": group["version"] // K,
        "consumed_version": group["consumed_version"] // K,
    }


def check_trace(cfg: DelayConfig, steps: int, prompts_per_step: int) -> None:
    """A trace fits a run only with its number of steps and groups per step; the key that differs
    is named."""
    trace = read_trace(cfg.trace)
    per_step: dict[int, int] = {}
    for row in trace:
        per_step[row["consumed_version"]] = per_step.get(row["consumed_version"], 0) + 1
    recorded = max(per_step) + 1 if per_step else 0
    if recorded != steps:
        raise ConfigError(f"the trace {cfg.trace} records {recorded} steps, the run has {steps}", "steps")
    bad = {s: n for s, n in per_step.items() if n != prompts_per_step}
    if bad or len(per_step) != steps:
        raise ConfigError(
            f"the trace {cfg.trace} records {sorted(set(per_step.values()))} groups per step, the run "
            f"consumes {prompts_per_step}",
            "prompts_per_step",
        )


class TraceSource(SyncSource):
    """Replays a recorded staleness pattern in process, deterministically: each group of the trace
    is generated for its prompt with the weights of its recorded ``version`` and consumed at its
    recorded step, in recorded order. A recorded version before the run's first (a prefill's or a
    history's) is generated with the starting weights and labelled with their version, the
    weights that made it. The trace counts steps; with ``updates_per_batch`` ``K`` its step ``t``
    is update ``t K``, what the trainer asks for and the groups are labelled with."""

    def __init__(self, rollouts: Rollouts, batch_prompts: int, cfg: DelayConfig, updates_per_batch: int = 1):
        super().__init__(rollouts, batch_prompts)
        K = updates_per_batch
        self.trace = [
            {**row, "version": row["version"] * K, "consumed_version": row["consumed_version"] * K}
            for row in (read_trace(cfg.trace) if cfg.trace else [])
        ]
        self.updates_per_batch = K
        self.held: dict[int, Group] = {}  # trace line -> its generated group, until consumed
        self.generated_through: int | None = None

    def _next(self, version: int) -> list[Group]:
        first = self.generated_through is None
        due = [
            i for i, row in enumerate(self.trace) if row["version"] == version or (first and row["version"] < version)
        ]
        for v in sorted({self.trace[i]["version"] for i in due}):  # one collector call per version
            lines = [i for i in due if self.trace[i]["version"] == v]
            out = self.rollouts.collect([self.trace[i]["prompt_index"] for i in lines], max(v, version))
            self._collected.append(out.stats)
            self.held.update(zip(lines, out.groups))
        self.generated_through = version
        lines = [i for i, row in enumerate(self.trace) if row["consumed_version"] == version]
        missing = [i for i in lines if i not in self.held]
        if missing:
            K = self.updates_per_batch
            raise ValueError(
                f"the trace consumes at step {version // K} groups generated at later steps "
                f"({[self.trace[i]['version'] // K for i in missing]})"
            )
        return [self.held.pop(i) for i in lines]

    def queued_groups(self) -> list[Group]:
        return list(self.held.values())

    def state_dict(self) -> dict:
        return {"held": {i: g.state() for i, g in self.held.items()}, "generated_through": self.generated_through}

    def load_state_dict(self, state: dict) -> None:
        self.held = {int(i): Group.from_state(s) for i, s in state["held"].items()}
        self.generated_through = state["generated_through"]


def sync_source(cfg, rollouts: Rollouts, records: list[dict]) -> SyncSource:
    return SyncSource(rollouts, cfg.prompts_per_step)


def fixed_source(cfg, rollouts: Rollouts, records: list[dict]) -> FixedDelaySource:
    return FixedDelaySource(rollouts, cfg.prompts_per_step, cfg.delay.d, cfg.delay.warmup)


def latency_source(cfg, rollouts: Rollouts, records: list[dict]) -> LatencySource:
    return LatencySource(rollouts, cfg.prompts_per_step, cfg.delay, cfg.seed)


def trace_source(cfg, rollouts: Rollouts, records: list[dict]) -> TraceSource:
    return TraceSource(rollouts, cfg.prompts_per_step, cfg.delay, cfg.updates_per_batch)


def check_trace_mode(cfg) -> None:
    """``delay.mode trace``: a trace file is given and fits the run."""
    if cfg.delay.trace is None:
        raise ConfigError("delay.mode trace replays a staleness trace: give its file", "delay.trace")
    check_trace(cfg.delay, cfg.steps, cfg.prompts_per_step)
