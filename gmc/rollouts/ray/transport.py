"""Weights from the trainer to the rollout workers, behind one interface.

:class:`ObjectStoreTransport` puts the state dict into Ray's object store once per version (the
previous version's object is released) and hands each task a reference that its worker
resolves only when its weights are older. :class:`CollectiveTransport` broadcasts every tensor
from the trainer (rank 0) to the workers over a ``torch.distributed`` group: gloo on CPUs, NCCL
on GPUs, the same code; each worker receives in a thread of its own while it generates, and
swaps the new weights in before its next group. Both report seconds and bytes per publish.

A worker that dies leaves the collective group, whose every broadcast would now fail: the next
publish forms the group again from the workers alive (a broadcast that fails because a worker
died during it is sent again to the others), and a worker outside the group (restarting, or back
since the last publish) pulls the newest weights itself from a copy in the object store, until
the next publish takes it into the group again. No call waits longer than
:data:`BROADCAST_SECONDS`.
"""

from __future__ import annotations

import gc
import logging
import socket
import time
from datetime import timedelta

import torch

log = logging.getLogger(__name__)

BROADCAST_SECONDS = 600
"""How long the collective transport waits for the workers to join, for a broadcast to reach
every member alive, and a worker for the weights of its task, before the run stops with an
error naming what did not arrive."""


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
        self.found_dead: set[int] = set()

    def start(self, workers) -> None:
        pass

    def publish(self, model, version: int) -> dict[str, float]:
        import ray

        t = time.perf_counter()
        state = {k: v.cpu() for k, v in published_state(model).items()}
        self.ref, self.version = ray.put(state), version  # the previous object goes with its last reference
        return {"async/weight_sync_seconds": time.perf_counter() - t, "async/weight_sync_bytes": float(nbytes(state))}

    def task_weights(self, worker: int | None = None):
        """What a task for ``worker`` carries: the version and a reference (nested, so Ray does not
        fetch it)."""
        return {"version": self.version, "ref": [self.ref]}

    def lost(self, worker: int) -> None:
        pass

    def back(self, worker: int) -> None:
        pass

    def ready(self, worker: int) -> bool:
        return True

    def regroup_due(self) -> bool:
        return False

    def stop(self) -> None:
        self.ref = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CollectiveTransport:
    """A ``torch.distributed`` broadcast from the trainer (rank 0) to every worker in the group."""

    name = "collective"

    def __init__(self, backend: str = "gloo"):
        self.backend, self.workers = backend, []
        self.members: tuple[int, ...] = ()  # the workers in the current group, in rank order
        self.died: set[int] = set()  # workers that died since the group was formed
        self.restarting: set[int] = set()  # workers that died and are not back yet
        self.found_dead: set[int] = set()  # workers the last publish found dead (for the source to watch)
        self.current = (-1, frozenset(), None)  # (version, members, object-store copy for the others)

    def start(self, workers) -> None:
        self.workers = list(workers)
        self._form(tuple(range(len(self.workers))))

    def _form(self, members: tuple[int, ...]) -> None:
        """Form a group of the trainer (rank 0) and ``members``: each joins in its receiving thread
        while rank 0 joins here."""
        import ray
        import torch.distributed as dist

        address, port = ray.util.get_node_ip_address(), free_port()
        joins = [
            self.workers[k].join_group.remote(self.backend, address, port, rank + 1, len(members) + 1)
            for rank, k in enumerate(members)
        ]
        dist.init_process_group(
            self.backend,
            init_method=f"tcp://{address}:{port}",
            rank=0,
            world_size=len(members) + 1,
            timeout=timedelta(seconds=BROADCAST_SECONDS),
        )
        ray.get(joins, timeout=BROADCAST_SECONDS)
        if self.members != members:
            log.info("the collective transport's group: the trainer and workers %s", list(members))
        self.members = members
        self.died -= set(members)

    def _leave(self) -> None:
        """Dissolve the group: the trainer leaves, then every member alive."""
        import ray
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        leaving = [self.workers[k].leave_group.remote() for k in self.members if k not in self.restarting]
        ray.wait(leaving, num_returns=len(leaving), timeout=BROADCAST_SECONDS)
        self.members = ()

    def lost(self, worker: int) -> None:
        """``worker`` died (the source saw it): it gets no weights until it is back."""
        self.died.add(worker)
        self.restarting.add(worker)

    def back(self, worker: int) -> None:
        """``worker`` restarted: it joins the group at the next publish (until then it pulls the
        object store's copy, where the last publish left one)."""
        self.restarting.discard(worker)

    def ready(self, worker: int) -> bool:
        """Whether a task for ``worker`` can get weights now: not so for a worker that died since
        the last publish counted it a member, until a publish takes it in again."""
        return not (worker in self.died and worker in self.current[1])

    def regroup_due(self) -> bool:
        """A worker is back that only a publish can give weights to."""
        return any(not self.ready(k) and k not in self.restarting for k in range(len(self.workers)))

    def publish(self, model, version: int) -> dict[str, float]:
        import ray

        t = time.perf_counter()
        state = published_state(model)
        alive = tuple(k for k in range(len(self.workers)) if k not in self.restarting)
        if alive != self.members or self.died & set(self.members):
            self._leave()
            self._form(alive)
        dead = self.found_dead = self._broadcast(state, version)
        if dead:  # died during the broadcast: the others get it again in a group without them
            self.died |= dead
            self.restarting |= dead
            self._leave()
            self._form(tuple(k for k in alive if k not in dead))
            if self._broadcast(state, version):
                raise RuntimeError(f"the broadcast of version {version} failed twice: rollout workers died under it")
        outside = set(range(len(self.workers))) - set(self.members)
        copy = ray.put({k: v.cpu() for k, v in state.items()}) if outside else None
        self.current = (version, frozenset(self.members), copy)
        return {"async/weight_sync_seconds": time.perf_counter() - t, "async/weight_sync_bytes": float(nbytes(state))}

    def _broadcast(self, state: dict[str, torch.Tensor], version: int) -> set[int]:
        """Broadcast ``state`` to the members; the members that died (under it or unseen since the
        group was formed: an empty set when it reached them all). Any other failure, or a member that neither receives nor dies
        within :data:`BROADCAST_SECONDS`, is an error."""
        import ray
        import torch.distributed as dist

        receiving = {self.workers[k].receive.remote(version): k for k in self.members}
        failure = None
        try:
            for tensor in state.values():
                dist.broadcast(tensor.contiguous(), src=0)
        except Exception as e:  # a peer went away
            failure = f"{type(e).__name__}: {e}"  # the message only: the error's frames keep the group alive
        if failure is not None:  # the group's connections closed, so the members stop waiting at once
            dist.destroy_process_group()
            gc.collect()
        done, waiting = ray.wait(list(receiving), num_returns=len(receiving), timeout=BROADCAST_SECONDS)
        dead, errors = set(), []
        for ref in done:
            try:
                if not ray.get(ref):  # restarted since the group was formed
                    dead.add(receiving[ref])
            except ray.exceptions.RayActorError:
                dead.add(receiving[ref])
            except ray.exceptions.RayTaskError as e:
                errors.append(f"worker {receiving[ref]}: {e.cause!r}")
        if waiting or (failure is not None and not dead):
            stuck = sorted(receiving[r] for r in waiting)
            raise RuntimeError(
                f"the broadcast of version {version} to the rollout workers failed"
                + (f" ({failure})" if failure is not None else "")
                + (f"; workers {stuck} did not receive it within {BROADCAST_SECONDS} s" if stuck else "")
                + (f"; {'; '.join(errors)}" if errors else "")
            )
        return dead

    def task_weights(self, worker: int | None = None):
        """A member takes the newest broadcast (at least this version); a worker outside the group
        pulls the object store's copy."""
        version, members, copy = self.current
        return {"version": version, "ref": None if worker in members else [copy]}

    def stop(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
