"""The trainer's side of real asynchrony: delay mode ``ray`` (:class:`RaySource`).

``delay.workers`` rollout workers generate continuously, run by a :class:`~gmc.rollouts.ray.pool.WorkerPool`
whose dispatcher thread hands them the run's prompts, in its own order, with the newest published
weights whenever the staleness bound (:class:`gmc.rollouts.ray.admission.StalenessBound`) has
capacity, independently of the trainer's steps. The source buffers every finished group; each
optimizer step takes the first ``prompts_per_step`` buffered groups in arrival order, waiting only
when too few have arrived. Nothing waits for the slowest worker.

Versions count optimizer updates (a step of ``updates_per_batch`` updates trains its groups in
order, mini-batch ``k`` with the step's update ``k``). What is dropped: a group that would be
trained more than ``max_staleness`` updates after its weights (by the update of its place in the
batch), on arrival or later in the buffer, is dropped and counted (``async/dropped``), never
trained; its prompt is not generated again (the run's prompt order moves on, as in AReaL and
SkyRL). ``rollout/*`` describe the groups a step trains on. A checkpoint keeps the finished,
unconsumed groups, the bound's counters and the tasks in flight (generated again after a resume,
from the same prompts and streams); faults and restarts are the pool's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import asdict, replace

from gmc.rollouts.collect import RolloutStats
from gmc.rollouts.groups import Group, Rollouts
from gmc.rollouts.ray.admission import StalenessBound
from gmc.rollouts.ray.pool import POLL_SECONDS, WorkerPool
from gmc.rollouts.sources import SyncSource

log = logging.getLogger(__name__)


def ray_source(cfg, rollouts: Rollouts, records: list[dict]) -> RaySource:
    """The ``ray`` delay mode's source for a run's TrainConfig ``cfg``: rollout workers generating
    from the run's prompt records."""
    return RaySource(cfg, rollouts, records)


def group_stats(g: Group, task_stats, limit: int):
    """The share of a task's :class:`gmc.rollouts.collect.RolloutStats` that is group ``g``'s: its own
    samples, tokens, reward and longest answer, answers at the token limit counted as truncated,
    the task's seconds in proportion to its samples."""
    share = g.lengths.numel() / task_stats.samples
    return replace(
        task_stats,
        samples=g.lengths.numel(),
        tokens=int(g.lengths.sum()),
        seconds=task_stats.seconds * share,
        behaviour_seconds=task_stats.behaviour_seconds * share,
        reward_sum=float(g.rewards.sum()),
        length_max=g.max_length,
        truncated=int((g.lengths >= limit).sum()),
    )


class RaySource(SyncSource):
    def __init__(self, run, rollouts: Rollouts, records: list[dict]):
        super().__init__(rollouts, run.prompts_per_step)
        self.run = run
        self.bound = StalenessBound(run.delay.max_staleness, run.prompts_per_step // run.updates_per_batch)
        self.buffer: list[tuple[Group, object]] = []  # finished unconsumed groups and their stats
        self.step_stats: dict[str, float] = {}
        self.lock = threading.Condition()  # guards the buffer, the bound and the pool's state
        self.pool = WorkerPool(run, rollouts, records, self.bound, self.lock, self._deliver)

    def publish(self, model, version: int) -> None:
        self.pool.publish(model, version)

    def close(self) -> None:
        self.pool.close()

    def _deliver(self, k: int, out: dict, submitted: float) -> None:
        """The groups of a finished task of worker ``k`` into the buffer, unless already too old;
        the caller (the pool's dispatcher) holds the lock."""
        made_at = out["version"]  # the weights it generated with (a broadcast may be newer than asked)
        for state in out["groups"]:
            g = Group.from_state(state)
            g.worker, g.submit_wall, g.finish_wall = k, submitted, out["finish_wall"]
            g.generation_seconds = out["seconds"]
            if self.bound.finished(made_at, self.pool.trainer_version):
                self.buffer.append((g, group_stats(g, out["stats"], self.run.sampling.max_new_tokens)))

    # -- the trainer's side ------------------------------------------------------------------

    def _consumer(self, version: int, place: int) -> int:
        """The update that trains the group at ``place`` of the buffer in the step whose first
        update is ``version``: its mini-batch's; a group beyond the batch is held to the step's last
        update (a later step trains it later still)."""
        return version + min(place, self.batch_prompts - 1) // self.bound.per_update

    def _next(self, version: int) -> list[Group]:
        t = time.perf_counter()
        with self.lock:
            while True:
                if self.pool.failure is not None:
                    raise self.pool.failure
                fresh = []
                for g, stats in self.buffer:  # the bound is strict: what is too old for its update is dropped
                    if self.bound.too_old(g.version, self._consumer(version, len(fresh))):
                        self.bound.discard()
                    else:
                        fresh.append((g, stats))
                self.buffer = fresh
                if len(self.buffer) >= self.batch_prompts:
                    break
                if self.pool.regroup():  # a worker is back that only a publish gives weights to
                    continue
                self.lock.wait(POLL_SECONDS)
            waited = time.perf_counter() - t
            taken, self.buffer = self.buffer[: self.batch_prompts], self.buffer[self.batch_prompts :]
            batch = [g for g, _ in taken]
            self._collected = [stats for _, stats in taken]
            now = time.time()
            for g in batch:
                g.consume_wall = now
            lags = Counter(self._consumer(version, i) - g.version for i, g in enumerate(batch))
            self.step_stats = {
                "async/dropped": float(self.bound.dropped),
                "async/buffer_groups": float(len(self.buffer)),
                "async/in_flight": float(self.bound.in_flight),
                "async/trainer_idle_seconds": waited,
                "async/worker_idle_seconds": self.pool.worker_idle,
                "async/lost_tasks": float(self.pool.lost_tasks),
                "async/wait_seconds": time.perf_counter() - t,
                **{f"async/staleness_hist/{lag}": float(n) for lag, n in sorted(lags.items())},
            }
            self.pool.worker_idle = 0.0
        return batch

    def queued_groups(self) -> list[Group]:
        with self.lock:
            return [g for g, _ in self.buffer]

    def stats(self) -> dict[str, float]:
        return {
            **super().stats(),
            **self.step_stats,
            **self.pool.sync_stats,
            "async/weights_version": float(self.pool.version),
        }

    # -- checkpoints -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The source's state at one instant of the dispatcher (which takes prompts from the run's
        order as it goes): so the prompt cursor's state is kept here too, and wins on load."""
        with self.lock:
            return {
                "buffer": [g.state() for g, _ in self.buffer],
                "stats": [asdict(s) for _, s in self.buffer],
                "bound": self.bound.state_dict(),
                **self.pool.state_dict(),
                "cursor": self.rollouts.cursor.state_dict(),
            }

    def load_state_dict(self, state: dict) -> None:
        with self.lock:
            self.buffer = [(Group.from_state(g), RolloutStats(**s)) for g, s in zip(state["buffer"], state["stats"])]
            self.bound.load_state_dict(state["bound"])
            self.pool.load_state_dict(state)
            self.rollouts.cursor.load_state_dict(state["cursor"])
