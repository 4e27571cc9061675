"""The trainer's side of real asynchrony: delay mode ``ray`` (:class:`RaySource`).

``delay.workers`` rollout workers (:class:`gmc.distributed.worker.RolloutWorker`) generate
continuously: whenever a worker is idle and the staleness bound has capacity
(:class:`gmc.distributed.admission.StalenessBound`), the trainer takes the next prompts of the
run's own order and dispatches them with the newest published weights; finished groups enter a
buffer, and each optimizer step takes the first ``prompts_per_step`` of them in arrival order,
waiting only when too few have arrived. Nothing waits for the slowest worker.

Faults: a worker that dies (its process killed) is restarted by Ray and its lost prompts are
dispatched again, first, so every batch is full and no group is trained twice; a worker that
raises ends the run with its error. A checkpoint keeps the finished, unconsumed groups and the
bound's counters; groups in flight at a kill are generated again after the resume, from the
same prompts (their versions then are newer, so the bound holds across the resume).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from typing import TYPE_CHECKING

from gmc.asynchrony import Batch, Group, Rollouts, SyncSource
from gmc.distributed.admission import StalenessBound
from gmc.distributed.transport import CollectiveTransport, ObjectStoreTransport
from gmc.rundir import STOP

if TYPE_CHECKING:
    from gmc.config import TrainConfig

log = logging.getLogger(__name__)


def ray_source(cfg: TrainConfig, rollouts: Rollouts, records: list[dict]) -> RaySource:
    """The ``ray`` delay mode's source: rollout workers generating from the run's prompt records."""
    return RaySource(cfg, rollouts, records)


class RolloutWorkerError(RuntimeError):
    """A rollout worker raised, could not start, or died again and again on the same prompts; the
    message is the worker's error."""


MAX_LOSSES = 3
"""Deaths of a worker under the same prompts after which the run stops (a prompt that kills
whoever generates it is not retried forever)."""


class RaySource(SyncSource):
    def __init__(self, run: TrainConfig, rollouts: Rollouts, records: list[dict]):
        super().__init__(rollouts, run.prompts_per_step)
        self.run, self.cfg, self.prompt_records = run, run.delay, records
        self.bound = StalenessBound(self.cfg.max_staleness, run.prompts_per_step)
        self.chunk = math.ceil(run.prompts_per_step / self.cfg.workers)
        self.buffer: list[Group] = []
        self.retry: list[int] = []  # prompts of lost tasks and of tasks in flight at a checkpoint
        self.pending: dict = {}  # task reference -> (worker, prompts, version, submit_wall)
        self.idle_since: dict[int, float] = {}
        self.worker_idle: dict[int, float] = {}  # this step's idle seconds per worker
        self.tasks = 0  # tasks dispatched since the start: each task's random streams
        self.lost_tasks = 0  # tasks whose worker died under them
        self.losses: dict[tuple, int] = {}  # prompts -> how often a worker died generating them
        self.workers: list = []
        self.transport = None
        self.version = -1
        self.started_ray = False
        self.step_stats: dict[str, float] = {}
        self.sync_stats: dict[str, float] = {}

    # -- workers and weights -----------------------------------------------------------------

    def _start(self) -> None:
        import ray

        from gmc.distributed.worker import RolloutWorker
        from gmc.settings import to_dict

        gpus = 1 if self.cfg.worker_device.startswith("cuda") else 0
        with STOP.blocked():  # Ray's processes start with the stop signals blocked (SLURM signals them too)
            if not ray.is_initialized():
                ray.init(address=self.cfg.ray_address, include_dashboard=False, log_to_driver=False,
                         **({} if self.cfg.ray_address else
                            {"num_cpus": max(2, self.cfg.workers * self.cfg.worker_threads)}))
                self.started_ray = True
            # ray.init replaced the SIGTERM handler with Ray's (kill the Ray processes, exit): the
            # run's stop signals are its own again, so a stop ends it at a step boundary with a checkpoint
            STOP.reclaim()
        if gpus and ray.cluster_resources().get("GPU", 0) < self.cfg.workers:
            raise RolloutWorkerError(f"delay.worker_device {self.cfg.worker_device} asks Ray for a GPU per worker: "
                                     f"{self.cfg.workers} workers, {ray.cluster_resources().get('GPU', 0):g} GPUs in the "
                                     "cluster")
        config = to_dict(self.run)
        # kept for the run: a restarted worker is constructed again from these arguments
        self.records = ray.put(self.prompt_records)
        self.workers = [RolloutWorker.options(num_cpus=self.cfg.worker_threads, num_gpus=gpus).remote(config, self.records, k)
                        for k in range(self.cfg.workers)]
        self.transport = (CollectiveTransport("nccl" if gpus else "gloo") if self.cfg.transport == "collective"
                          else ObjectStoreTransport())
        self.transport.start(self.workers)
        now = time.time()
        self.idle_since = dict.fromkeys(range(len(self.workers)), now)

    def publish(self, model, version: int) -> None:
        if not self.workers:
            try:
                self._start()
            except BaseException:
                self.close()
                raise
        self.sync_stats = self.transport.publish(model, version)
        self.version = version

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers, self.pending = [], {}
        if self.transport is not None:
            self.transport.stop()
        if self.started_ray and ray.is_initialized():
            ray.shutdown()

    # -- admission and collection ------------------------------------------------------------

    def _dispatch(self) -> None:
        """Give every idle worker the next prompts while the bound has room for them."""
        busy = {task[0] for task in self.pending.values()}
        for k in sorted(set(range(len(self.workers))) - busy):
            n = min(self.chunk, self.bound.capacity(self.version))
            if n <= 0:
                return
            prompts, self.retry = self.retry[:n], self.retry[n:]
            prompts += self.rollouts.take(n - len(prompts))
            ref = self.workers[k].generate.remote(prompts, self.version, self.tasks, self.transport.task_weights())
            self.tasks += 1
            self.bound.started(len(prompts))
            self.pending[ref] = (k, prompts, self.version, time.time())
            self.worker_idle[k] = self.worker_idle.get(k, 0.0) + time.time() - self.idle_since.pop(k, time.time())

    def _collect_one(self) -> None:
        """Wait for the next finished task and buffer its groups (dropping those already too old)."""
        import ray

        (ref,), _ = ray.wait(list(self.pending), num_returns=1)
        k, prompts, made_at, submitted = self.pending.pop(ref)
        self.idle_since[k] = time.time()
        try:
            out = ray.get(ref)
        except ray.exceptions.RayActorError as e:  # the worker died: Ray restarts it; its prompts go again
            if getattr(e, "actor_init_failed", False):
                raise RolloutWorkerError(f"rollout worker {k} could not start: {e}") from None
            key = tuple(prompts)
            self.losses[key] = self.losses.get(key, 0) + 1
            if self.losses[key] >= MAX_LOSSES:
                raise RolloutWorkerError(f"rollout worker {k} died {MAX_LOSSES} times generating prompts {prompts} "
                                         f"({type(e).__name__}: {e})") from None
            log.warning("rollout worker %d died (%s); it restarts and its %d prompts are generated again", k,
                        type(e).__name__, len(prompts))
            self.bound.lost(len(prompts))
            self.retry = prompts + self.retry
            self.lost_tasks += 1
            self._await_restart(k)
            return
        except ray.exceptions.RayTaskError as e:
            raise RolloutWorkerError(f"rollout worker {k} failed: {e.cause!r}") from None
        self._collected.append(out["stats"])
        for state in out["groups"]:
            g = Group.from_state(state)
            g.worker, g.submit_wall, g.finish_wall = k, submitted, out["finish_wall"]
            g.generation_seconds = out["seconds"]
            if self.bound.finished(made_at, self.version):
                self.buffer.append(g)

    def _await_restart(self, k: int) -> None:
        """Block until Ray has restarted worker ``k`` (a fault path: seconds)."""
        import ray

        try:
            ray.get(self.workers[k].pid.options(max_task_retries=-1).remote(), timeout=600)
        except ray.exceptions.RayActorError as e:
            raise RolloutWorkerError(f"rollout worker {k} could not restart: {e}") from None

    def next_batch(self, version: int) -> Batch:
        self.worker_idle = {}
        return super().next_batch(version)

    def _next(self, version: int) -> list[Group]:
        t = time.perf_counter()
        waited = 0.0
        while True:
            fresh = []
            for g in self.buffer:  # the bound is strict: what is too old for this step is dropped
                if self.bound.too_old(g.version, version):
                    self.bound.discard()
                else:
                    fresh.append(g)
            self.buffer = fresh
            if len(self.buffer) >= self.batch_prompts:
                break
            self._dispatch()
            w = time.perf_counter()
            self._collect_one()
            waited += time.perf_counter() - w
        batch, self.buffer = self.buffer[: self.batch_prompts], self.buffer[self.batch_prompts :]
        now = time.time()
        for g in batch:
            g.consume_wall = now
        self._dispatch()  # the workers go on while the trainer computes
        lags = Counter(version - g.version for g in batch)
        self.step_stats = {
            "async/dropped": float(self.bound.dropped), "async/buffer_groups": float(len(self.buffer)),
            "async/in_flight": float(self.bound.in_flight), "async/trainer_idle_seconds": waited,
            "async/worker_idle_seconds": sum(self.worker_idle.values()), "async/lost_tasks": float(self.lost_tasks),
            "async/wait_seconds": time.perf_counter() - t,
            **{f"async/staleness_hist/{lag}": float(n) for lag, n in sorted(lags.items())},
        }
        return batch

    def queued_groups(self) -> list[Group]:
        return list(self.buffer)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), **self.step_stats, **self.sync_stats}

    # -- checkpoints -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        in_flight = [p for _, prompts, _, _ in self.pending.values() for p in prompts]
        return {"buffer": [g.state() for g in self.buffer], "bound": self.bound.state_dict(),
                "retry": self.retry + in_flight, "tasks": self.tasks}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = [Group.from_state(s) for s in state["buffer"]]
        self.bound.load_state_dict(state["bound"])
        self.retry, self.tasks = list(state["retry"]), state["tasks"]
