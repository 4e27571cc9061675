"""Weights from the trainer to the rollout workers, behind one interface.

:class:`ObjectStoreTransport` puts the state dict into Ray's object store once per version (the
previous version's object is released) and hands each task a reference that its worker
resolves only when its weights are older. :class:`CollectiveTransport` broadcasts every tensor
from the trainer (rank 0) to the workers over a ``torch.distributed`` group: gloo on CPUs, NCCL
on GPUs, the same code; each worker receives in a thread of its own while it generates, and
swaps the new weights in before its next group. Both report seconds and bytes per publish.
"""

from __future__ import annotations

import socket
import time

import torch


def published_state(model) -> dict[str, torch.Tensor]:
    """The model's weights as the workers load them, detached, on the model's device."""
    return {name: t.detach() for name, t in model.state_dict().items()}


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class ObjectStoreTransport:
    """Ray's object store: one object per version."""

    name = "object_store"

    def __init__(self):
        self.ref = None
        self.version = -1

    def start(self, workers) -> None:
        pass

    def publish(self, model, version: int) -> dict[str, float]:
        import ray

        t = time.perf_counter()
        state = {k: v.cpu() for k, v in published_state(model).items()}
        self.ref, self.version = ray.put(state), version  # the previous object goes with its last reference
        return {"async/weight_sync_seconds": time.perf_counter() - t, "async/weight_sync_bytes": float(nbytes(state))}

    def task_weights(self):
        """What a task carries: the version and a reference (nested, so Ray does not fetch it)."""
        return {"version": self.version, "ref": [self.ref]}

    def stop(self) -> None:
        self.ref = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CollectiveTransport:
    """A ``torch.distributed`` broadcast from the trainer (rank 0) to every worker."""

    name = "collective"

    def __init__(self, backend: str = "gloo"):
        self.backend, self.version, self.workers = backend, -1, []

    def start(self, workers) -> None:
        """Form the group: the workers join in their receiving threads while rank 0 joins here."""
        import ray
        import torch.distributed as dist

        self.workers = list(workers)
        address, port = ray.util.get_node_ip_address(), free_port()
        joins = [w.join_group.remote(self.backend, address, port, rank + 1, len(self.workers) + 1)
                 for rank, w in enumerate(self.workers)]
        dist.init_process_group(self.backend, init_method=f"tcp://{address}:{port}", rank=0,
                                world_size=len(self.workers) + 1)
        ray.get(joins)

    def publish(self, model, version: int) -> dict[str, float]:
        import ray
        import torch.distributed as dist

        t = time.perf_counter()
        state = published_state(model)
        receiving = [w.receive.remote(version) for w in self.workers]
        for tensor in state.values():
            dist.broadcast(tensor.contiguous(), src=0)
        ray.get(receiving)
        self.version = version
        return {"async/weight_sync_seconds": time.perf_counter() - t, "async/weight_sync_bytes": float(nbytes(state))}

    def task_weights(self):
        return {"version": self.version, "ref": None}

    def stop(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
