"""Float32 master weights beside live weights in a lower dtype (``master_weights: optimizer``,
method.md section 7): the mixed precision of large trainers. The model's parameters are bfloat16
(every forward and backward in bfloat16, no autocast and no cast of a weight per use); the
optimizer steps float32 copies, so an update of 1e-6 on a weight of 0.02 is not rounded away,
and each step writes them back rounded to the live dtype.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


class MasterWeights:
    """The float32 masters (:attr:`masters`, what the optimizer steps) of ``live`` parameters."""

    def __init__(self, live: Iterable[Tensor]):
        self.live = list(live)
        self.masters = [p.detach().float().clone() for p in self.live]

    def grads_in(self) -> None:
        """Move the live gradients to the masters in float32, one tensor at a time (each live
        gradient freed as its copy is made: the gradients never take both sizes at once)."""
        for p, m in zip(self.live, self.masters):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def weights_out(self) -> None:
        """The masters, rounded to the live dtype, into the live parameters."""
        for p, m in zip(self.live, self.masters):
            p.copy_(m)

    def state(self) -> list[Tensor]:
        return self.masters

    @torch.no_grad()
    def load(self, masters: list[Tensor] | None) -> None:
        """Masters from a checkpoint (then the live weights from them); None: from the live
        weights, as a checkpoint written without masters holds them."""
        if masters is None:
            for m, p in zip(self.masters, self.live):
                m.copy_(p)
            return
        if len(masters) != len(self.masters):
            raise ValueError(f"{len(masters)} master tensors for {len(self.masters)} parameters")
        for m, saved in zip(self.masters, masters):
            m.copy_(saved)
        self.weights_out()
