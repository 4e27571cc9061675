"""A rollout worker: the run's collector (:mod:`gmc.collect`) on a policy copy of its own, with the
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

from gmc.collect import rollout_side
from gmc.config import TrainConfig
from gmc.policy import load_policy
from gmc.settings import from_dict
from gmc.update import Update


@ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={"rollout": 1, "weights": 1})
class RolloutWorker:
    def __init__(self, config: dict, records, worker: int):
        cfg = from_dict(TrainConfig, config)
        torch.set_num_threads(cfg.delay.worker_threads)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        torch.manual_seed(cfg.seed)
        params = "float32" if cfg.master_weights else cfg.model_dtype
        self.model, self.tokenizer = load_policy(cfg.model, params, cfg.delay.worker_device)
        update = Update.from_config(cfg, self.model, self.tokenizer.pad_token_id)
        self.collector = rollout_side(cfg, update, self.tokenizer, cfg.behaviour_logprobs, grader_workers=1)
        self.engine = self.collector.engine
        self.records, self.worker, self.version = records, worker, -1
        self.incoming: dict | None = None
        self.incoming_version = -1
        self.arrived = threading.Condition()

    def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="rollout")
    def generate(self, prompts: list[int], version: int, task: int, weights: dict) -> dict:
        """One group per prompt index with the weights of ``version``; the groups (as states), the
        collector's measurements and the call's wall-clock seconds."""
        self._load(version, weights)
        self.engine.set_generator_state({"seed": self.engine.seed, "calls": task})
        t = time.perf_counter()
        out = self.collector.collect([(i, self.records[i]) for i in prompts], version)
        return {"groups": [g.state() for g in out.groups], "stats": out.stats, "worker": self.worker,
                "seconds": time.perf_counter() - t, "finish_wall": time.time()}

    def _load(self, version: int, weights: dict) -> None:
        if version == self.version:
            return
        if weights["ref"] is not None:  # the object store: fetch the version's state dict
            state = ray.get(weights["ref"][0])
        else:  # a broadcast: wait for the receiving thread to have it
            with self.arrived:
                self.arrived.wait_for(lambda: self.incoming_version >= version)
                state = self.incoming
        self.model.load_state_dict(state)
        self.engine.sync_weights(self.model)
        self.version = version

    @ray.method(concurrency_group="weights")
    def join_group(self, backend: str, address: str, port: int, rank: int, world: int) -> None:
        import torch.distributed as dist

        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world)

    @ray.method(concurrency_group="weights")
    def receive(self, version: int) -> None:
        """Take part in the trainer's broadcast of ``version`` (in the order of the state dict)."""
        import torch.distributed as dist

        state = {name: torch.empty_like(t) for name, t in self.model.state_dict().items()}
        for tensor in state.values():
            dist.broadcast(tensor, src=0)
        with self.arrived:
            self.incoming, self.incoming_version = state, version
            self.arrived.notify_all()

    def close(self) -> None:
        self.collector.close()
