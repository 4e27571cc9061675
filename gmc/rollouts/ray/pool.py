"""The rollout workers of real asynchrony as one pool (:class:`WorkerPool`): Ray's lifecycle, the
workers and their weight transport, the dispatcher thread that keeps them busy, and their
restarts.

The pool starts Ray (or joins ``delay.ray_address``), checks the model folder on every node,
keeps the trainer's GPU out of Ray's pool, and starts ``delay.workers`` rollout workers
(:class:`gmc.rollouts.ray.worker.RolloutWorker`) with the transport that moves weights to them
(:mod:`gmc.rollouts.ray.transport`). A dispatcher thread, independent of the trainer's steps,
gives every worker with fewer than ``delay.tasks_per_worker`` tasks the next
``delay.groups_per_task`` prompts of the run's own order with the newest published weights,
while the staleness bound (:class:`gmc.rollouts.ray.admission.StalenessBound`) has capacity, and
hands each finished task to the source that owns the pool (``deliver``). A worker that dies (its
process killed) is restarted by Ray while the others go on, and its lost tasks are dispatched
again first, with their own random streams; under the collective transport it leaves the group
and rejoins it at a publish after its restart. A worker that raises ends the run with its error
(:attr:`WorkerPool.failure`, raised in the trainer's thread). Every wait has a time limit.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable

from gmc.rollouts.ray.admission import StalenessBound
from gmc.rollouts.ray.transport import CollectiveTransport, ObjectStoreTransport
from gmc.stop import STOP

log = logging.getLogger(__name__)


class RolloutWorkerError(RuntimeError):
    """A rollout worker raised, could not start, or died again and again on the same prompts; the
    message is the worker's error."""


MAX_LOSSES = 3
"""Deaths of a worker under the same prompts after which the run stops (a prompt that kills
whoever generates it is not retried forever)."""


def check_model_on_every_node(model: str) -> None:
    """Check the model folder (:func:`gmc.policy.preflight.check_model_dir`) on every node of the Ray
    cluster before a worker starts: a folder on storage one node lacks is a
    :class:`RolloutWorkerError` naming that node, not a worker that fails to start there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from gmc.policy.preflight import check_model_dir, looks_local

    if not looks_local(model):
        return

    @ray.remote(num_cpus=0)
    def check() -> str | None:
        try:
            check_model_dir(model)
        except OSError as e:
            return str(e)
        return None

    nodes = [n for n in ray.nodes() if n["Alive"]]
    found = ray.get(
        [
            check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
            for n in nodes
        ],
        timeout=RESTART_SECONDS,
    )
    for node, problem in zip(nodes, found):
        if problem:
            raise RolloutWorkerError(f"node {node['NodeManagerAddress']}: {problem}")


@functools.cache
def _gpu_reservation():
    import ray

    @ray.remote
    class TrainerGPU:
        """Holds the trainer's GPU in Ray's pool, so that no worker is placed on it."""

        def gpu(self) -> list:
            return ray.get_gpu_ids()

    return TrainerGPU


def reserve_trainer_gpu(device: str):
    """For a trainer on a CUDA device of a node of the Ray cluster, an actor holding one GPU of
    that node (the lowest free: the trainer's own when it runs on the first), so that Ray places
    the rollout workers on the others; None for a trainer on a CPU."""
    import ray
    import torch
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from gmc.policy.model import resolve_device

    if resolve_device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    here = ray.get_runtime_context().get_node_id()
    actor = (
        _gpu_reservation()
        .options(num_gpus=1, num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
        .remote()
    )
    log.info("GPU %s of this node kept for the trainer", ray.get(actor.gpu.remote(), timeout=RESTART_SECONDS))
    return actor


POLL_SECONDS = 0.05
"""How long the dispatcher waits for a finished task before it looks for new work to hand out."""
RESTART_SECONDS = 600
"""How long a dead worker may take to come back before the run stops with an error."""


class WorkerPool:
    """The rollout workers of a run of :class:`~gmc.run.config.TrainConfig` ``run`` and the
    dispatcher that keeps them busy. Every attribute the dispatcher touches is guarded by
    ``lock``, which the source that owns the pool shares; ``deliver(worker, output, submitted)``
    is called with it held for every finished task (its output as the worker returns it, and the
    wall clock at which the task was dispatched)."""

    def __init__(
        self,
        run,
        rollouts,
        records: list[dict],
        bound: StalenessBound,
        lock: threading.Condition,
        deliver: Callable[[int, dict, float], None],
    ):
        self.run, self.cfg, self.rollouts, self.prompt_records = run, run.delay, rollouts, records
        self.bound, self.lock, self.deliver = bound, lock, deliver
        self.per_task = self.cfg.groups_per_task or math.ceil(run.prompts_per_step / self.cfg.workers)
        self.retry: list[tuple[list[int], int]] = []  # (prompts, task number) to dispatch again, first
        self.pending: dict = {}  # task reference -> (worker, prompts, version, task, submit_wall)
        self.restarting: dict = {}  # a dead worker's first call after its restart -> (worker, deadline)
        self.last_finish: dict[int, float] = {}  # each worker's last finish (wall clock)
        self.worker_idle = 0.0  # idle seconds of the workers since the source last read it
        self.tasks = 0  # tasks dispatched since the start: each task's random streams
        self.lost_tasks = 0  # tasks whose worker died under them
        self.losses: dict[tuple, int] = {}  # prompts -> how often a worker died generating them
        self.workers: list = []
        self.transport = None
        self.model = None  # the trainer's model, as last published
        self.version = -1  # of the weights last sent to the workers
        self.trainer_version = -1  # the trainer's newest (the bound's capacity counts it)
        self.started_ray = False
        self.reservation = None  # the actor holding the trainer's GPU in Ray's pool
        self.sync_stats: dict[str, float] = {}
        self.dispatcher: threading.Thread | None = None
        self.stopping = False
        self.failure: BaseException | None = None

    # -- workers and weights -----------------------------------------------------------------

    def _start(self) -> None:
        import ray

        from gmc.rollouts.ray.worker import RolloutWorker

        gpus = self.cfg.worker_gpus if self.cfg.worker_device.startswith("cuda") else 0
        with STOP.blocked():  # Ray's processes start with the stop signals blocked (SLURM signals them too)
            if not ray.is_initialized():
                ray.init(
                    address=self.cfg.ray_address,
                    include_dashboard=False,
                    log_to_driver=False,
                    **(
                        {} if self.cfg.ray_address else {"num_cpus": max(2, self.cfg.workers * self.cfg.worker_threads)}
                    ),
                )
                self.started_ray = True
            # ray.init replaced the SIGTERM handler with Ray's (kill the Ray processes, exit): the
            # run's stop signals are its own again, so a stop ends it at a step boundary with a checkpoint
            STOP.reclaim()
        check_model_on_every_node(self.run.model)
        self.reservation = reserve_trainer_gpu(self.run.device) if gpus else None
        available = ray.available_resources().get("GPU", 0)
        if gpus and available < self.cfg.workers * gpus:
            raise RolloutWorkerError(
                f"delay.worker_device {self.cfg.worker_device} asks Ray for {gpus:g} of a GPU per "
                f"worker: {self.cfg.workers} workers, {available:g} GPUs free in the cluster"
                + (" (one kept for the trainer)" if self.reservation else "")
            )
        # kept for the run: a restarted worker is constructed again from these arguments
        self.records = ray.put(self.prompt_records)
        self.workers = [
            RolloutWorker.options(num_cpus=self.cfg.worker_threads, num_gpus=gpus).remote(self.run, self.records, k)
            for k in range(self.cfg.workers)
        ]
        self.transport = (
            CollectiveTransport("nccl" if gpus else "gloo")
            if self.cfg.transport == "collective"
            else ObjectStoreTransport()
        )
        self.transport.start(self.workers)

    def publish(self, model, version: int) -> None:
        """The trainer is at update ``version``: its weights go to the workers at the start and after
        every ``publish_every`` steps of ``updates_per_batch`` updates
        (:attr:`gmc.rollouts.delays.DelayConfig.publish_every`). The bound opens for the new version
        only as its weights are sent, or at once when none are due (then the new groups are made
        with the weights the workers have)."""
        if self.workers and (version // self.run.updates_per_batch) % self.cfg.publish_every:
            with self.lock:
                self.trainer_version = version
                self.sync_stats = {k: 0.0 for k in self.sync_stats}  # nothing sent this step
                self.lock.notify_all()  # the bound has room for the new version's groups
            return
        if not self.workers:
            try:
                self._start()
            except BaseException:
                self.close()
                raise
        self.model = model
        self._send(version)

    def _send(self, version: int) -> None:
        """Publish the model's weights as ``version``; workers the transport found dead are
        watched until Ray has restarted them."""
        sync_stats = self.transport.publish(self.model, version)
        if self.cfg.partial_rollouts and self.transport.name == "object_store":  # answers in progress take them up
            for k, w in enumerate(self.workers):
                w.offer.remote(version, self.transport.task_weights(k))
        with self.lock:
            self.sync_stats, self.version = sync_stats, version
            self.trainer_version = max(self.trainer_version, version)
            for k in self.transport.found_dead:
                self._watch_restart(k)
            self.lock.notify_all()  # the bound has room for the new version's groups
        if self.dispatcher is None:
            self.dispatcher = threading.Thread(target=self._dispatch_loop, name="gmc-ray-dispatcher", daemon=True)
            self.dispatcher.start()

    def close(self) -> None:
        import ray

        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        if self.dispatcher is not None:
            self.dispatcher.join(timeout=30)
        for w in self.workers:
            ray.kill(w)
        if self.reservation is not None:
            ray.kill(self.reservation)
        self.workers, self.pending = [], {}
        if self.transport is not None:
            self.transport.stop()
        if self.started_ray and ray.is_initialized():
            ray.shutdown()

    # -- the dispatcher thread ---------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        """Hand out work and take in results until the source closes; an error ends the loop and
        is raised in the trainer's next :meth:`next_batch`."""
        import ray

        try:
            while True:
                with self.lock:
                    if self.stopping:
                        return
                    for k, deadline in self.restarting.values():
                        if time.time() > deadline:
                            raise RolloutWorkerError(f"rollout worker {k} did not restart within {RESTART_SECONDS} s")
                    self._dispatch()
                    waiting = [*self.pending, *self.restarting]
                    if not waiting:
                        self.lock.wait(POLL_SECONDS)
                        continue
                ready, _ = ray.wait(waiting, num_returns=1, timeout=POLL_SECONDS)
                for ref in ready:
                    self._finished(ref)
        except BaseException as e:  # noqa: BLE001  (handed to the trainer's thread)
            with self.lock:
                self.failure = e
                self.lock.notify_all()

    def _dispatch(self) -> None:
        """Give every worker with a free slot its next task while the bound has room (lost tasks
        first, with their own task numbers); the caller holds the lock."""
        load = Counter(task[0] for task in self.pending.values())
        idle = {k for k, _ in self.restarting.values()}
        for k in range(len(self.workers)):
            while k not in idle and self.transport.ready(k) and load[k] < self.cfg.tasks_per_worker:
                n = min(self.per_task, self.bound.capacity(self.trainer_version))
                if n <= 0:
                    return
                if self.retry and len(self.retry[0][0]) <= n:
                    prompts, task = self.retry.pop(0)
                else:
                    prompts, task = self.rollouts.take(n), self.tasks
                    self.tasks += 1
                ref = self.workers[k].generate.remote(prompts, self.version, task, self.transport.task_weights(k))
                self.bound.started(len(prompts))
                self.pending[ref] = (k, prompts, self.version, task, time.time())
                load[k] += 1

    def _finished(self, ref) -> None:
        """Take in a finished task (or a restarted worker's first answer)."""
        import ray

        with self.lock:
            if ref in self.restarting:
                k, _ = self.restarting.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    raise RolloutWorkerError(f"rollout worker {k} could not restart: {e}") from None
                log.info("rollout worker %d is back", k)
                self.transport.back(k)
                return
            k, prompts, _, task, submitted = self.pending.pop(ref)
        try:
            out = ray.get(ref)
        except ray.exceptions.RayActorError as e:  # the worker died: Ray restarts it; its tasks go again
            if getattr(e, "actor_init_failed", False):
                raise RolloutWorkerError(f"rollout worker {k} could not start: {e}") from None
            self._lost(k, prompts, task, e)
            return
        except ray.exceptions.RayTaskError as e:
            raise RolloutWorkerError(f"rollout worker {k} failed: {e.cause!r}") from None
        with self.lock:
            if k in self.last_finish:
                self.worker_idle += max(0.0, out["start_wall"] - self.last_finish[k])
            self.last_finish[k] = out["finish_wall"]
            self.deliver(k, out, submitted)
            self.lock.notify_all()

    def _lost(self, k: int, prompts: list[int], task: int, error) -> None:
        with self.lock:
            key = tuple(prompts)
            self.losses[key] = self.losses.get(key, 0) + 1
            if self.losses[key] >= MAX_LOSSES:
                raise RolloutWorkerError(
                    f"rollout worker {k} died {MAX_LOSSES} times generating prompts {prompts} "
                    f"({type(error).__name__}: {error})"
                ) from None
            log.warning(
                "rollout worker %d died (%s); it restarts and its %d prompts are generated again",
                k,
                type(error).__name__,
                len(prompts),
            )
            self.bound.lost(len(prompts))
            self.retry.append((prompts, task))
            self.lost_tasks += 1
            self.last_finish.pop(k, None)
            self._watch_restart(k)

    def _watch_restart(self, k: int) -> None:
        """Worker ``k`` died: the others go on while Ray restarts it (its first answer after the
        restart marks it back); the caller holds the lock."""
        self.transport.lost(k)
        if k not in {w for w, _ in self.restarting.values()}:
            self.restarting[self.workers[k].pid.options(max_task_retries=-1).remote()] = (
                k,
                time.time() + RESTART_SECONDS,
            )

    def regroup(self) -> bool:
        """Publish the trainer's current weights (its version) if a worker is back that only a
        publish gives weights to (the collective transport); the caller holds the lock, which is
        released meanwhile."""
        if not self.transport.regroup_due():
            return False
        self.lock.release()
        try:
            self._send(self.trainer_version)
        finally:
            self.lock.acquire()
        return True

    # -- checkpoints -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The tasks to dispatch again after a resume (those to retry, then those in flight, in
        task order) and the counters; the caller holds the lock."""
        in_flight = [(prompts, task) for _, prompts, _, task, _ in self.pending.values()]
        return {
            "retry": self.retry + sorted(in_flight, key=lambda p: p[1]),
            "tasks": self.tasks,
            "lost_tasks": self.lost_tasks,
        }

    def load_state_dict(self, state: dict) -> None:
        self.retry = [(list(p), t) for p, t in state["retry"]]
        self.tasks, self.lost_tasks = state["tasks"], state["lost_tasks"]
