"""A rollout worker: the run's collector (:mod:`gmc.rollouts.collect`) on a policy copy of its own, with the
run's engine, grader and behaviour numerics, run by Ray as an actor (``RolloutWorker``).

The trainer hands it prompt indices, a policy version and the task's number; before generating
it loads that version's weights (from the object store, or from what its receiving thread got
by broadcast), and it draws its samples from the task's own random streams (the task number is
its engine's call counter), so no two tasks of a run share a stream and one worker at bound 0
samples what the synchronous loop samples.
"""

from __future__ import annotations

import os
import threading
import time

import ray
import torch

from gmc.policy.model import load_policy
from gmc.policy.update import Update
from gmc.rollouts.collect import rollout_side
from gmc.rollouts.ray.transport import BROADCAST_SECONDS


@ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={"rollout": 1, "weights": 1})
class RolloutWorker:
    def __init__(self, cfg, records, worker: int):
        """Worker ``worker`` of a run of :class:`~gmc.run.config.TrainConfig` ``cfg`` (sent by Ray,
        pickled), generating from the run's prompt ``records``."""
        torch.set_num_threads(cfg.delay.worker_threads)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        torch.manual_seed(cfg.seed)
        params = "float32" if cfg.master_weights is True else cfg.model_dtype  # the trainer's live weights
        self.model, self.tokenizer = load_policy(cfg.model, params, cfg.delay.worker_device)
        update = Update.from_config(cfg, self.model, self.tokenizer.pad_token_id)
        self.collector = rollout_side(cfg, update, self.tokenizer, cfg.behaviour_logprobs, grader_workers=1)
        self.engine = self.collector.engine
        self.records, self.worker, self.version = records, worker, -1
        self.incoming: dict | None = None  # the newest weights received by broadcast
        self.incoming_version = -1
        self.offered: dict | None = None  # the newest weights offered through the object store
        self.offered_version = -1
        self.arrived = threading.Condition()
        self.partial = cfg.delay.partial_rollouts
        if self.partial:  # answers in progress take in new weights between two decoding steps
            self.engine.newer_weights = self._newer

    def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="rollout")
    def generate(self, prompts: list[int], version: int, task: int, weights: dict) -> dict:
        """One group per prompt index with the weights of ``version`` (or, by broadcast, of the
        newest version this worker has received, which is never older); the groups (as states),
        labelled with the version they were generated with and returned as ``version``, the
        collector's measurements, the call's seconds and its wall-clock start and finish."""
        start = time.time()
        if self.partial:  # newer weights arrived while it waited: it starts with them
            version = max(version, self.version)
        version = self._load(version, weights)
        self.engine.version = version
        self.engine.set_generator_state({"seed": self.engine.seed, "calls": task})
        t = time.perf_counter()
        out = self.collector.collect([(i, self.records[i]) for i in prompts], version)
        return {
            "groups": [g.state() for g in out.groups],
            "stats": out.stats,
            "worker": self.worker,
            "version": version,
            "seconds": time.perf_counter() - t,
            "start_wall": start,
            "finish_wall": time.time(),
        }

    def _load(self, version: int, weights: dict) -> int:
        """Load the weights of ``version`` (a broadcast: the newest received, at least ``version``)
        unless they are loaded already; returns the version loaded."""
        if weights["ref"] is not None:  # the object store: fetch the version's state dict
            if version != self.version:
                self.model.load_state_dict(ray.get(weights["ref"][0]))
                self.engine.sync_weights(self.model)
                self.version = version
            return version
        with self.arrived:  # a broadcast: wait for the receiving thread to have it
            if not self.arrived.wait_for(lambda: self.incoming_version >= version, timeout=BROADCAST_SECONDS):
                raise TimeoutError(
                    f"rollout worker {self.worker}: the weights of version {version} did not arrive "
                    f"within {BROADCAST_SECONDS} s (newest received: {self.incoming_version})"
                )
            state, received = self.incoming, self.incoming_version
        if received != self.version:
            self.model.load_state_dict(state)
            self.engine.sync_weights(self.model)
            self.version = received
        return received

    def _newer(self) -> int | None:
        """Partial rollouts, between two decoding steps: load weights newer than those in use, if
        any arrived (offered through the object store or received by broadcast); their version."""
        with self.arrived:
            newest = max(self.offered_version, self.incoming_version)
            weights = self.offered if self.offered_version == newest else {"ref": None}
        return self._load(newest, weights) if newest > self.version else None

    @ray.method(concurrency_group="weights")
    def offer(self, version: int, weights: dict) -> None:
        """The trainer published ``version`` (object store; partial rollouts take it mid-answer)."""
        with self.arrived:
            if version > self.offered_version:
                self.offered, self.offered_version = weights, version

    @ray.method(concurrency_group="weights")
    def join_group(self, backend: str, address: str, port: int, rank: int, world: int) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=BROADCAST_SECONDS),
        )

    @ray.method(concurrency_group="weights")
    def leave_group(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    @ray.method(concurrency_group="weights")
    def receive(self, version: int) -> bool:
        """Take part in the trainer's broadcast of ``version`` (in the order of the state dict);
        False from a process in no group (restarted since the group was formed)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return False
        state = {name: torch.empty_like(t) for name, t in self.model.state_dict().items()}
        for tensor in state.values():
            dist.broadcast(tensor, src=0)
        with self.arrived:
            self.incoming, self.incoming_version = state, version
            self.arrived.notify_all()
        return True

    def close(self) -> None:
        self.collector.close()
