"""Rollout groups: one prompt's ``G`` answers with everything the trainer needs, labelled with
the policy version that generated them and the version that consumed them (method.md section 4),
and the batch a source hands the trainer for one step. Staleness is data: every group carries
its versions, counted in optimizer updates. No torch is imported (the tensors are the collector's).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the module itself needs no torch
    from torch import Tensor


@dataclass
class Group:
    """One prompt's ``G`` responses with everything the trainer needs, and their provenance."""

    prompt_index: int
    prompt_ids: Tensor  # [P] int64, no padding
    response_ids: Tensor  # [G, T] int64, right-padded
    response_mask: Tensor  # [G, T] bool
    rewards: Tensor  # [G] float32
    behaviour_logp: Tensor | None  # [G, T] float32, the trainer model's at generation time (or the
    # sampler's own, behaviour_logprobs: sampler); None when the group is consumed in the step
    # that made it (the training forward gives them exactly)
    sampler_logp: Tensor  # [G, T] float32, as reported by the rollout engine
    version: int  # policy version (optimizer update) that generated it
    submitted_at: float = 0.0  # virtual clock of the latency model
    completed_at: float = 0.0
    consumed_version: int | None = None
    worker: int | None = None  # the rollout worker that made it (None: simulated in process)
    submit_wall: float | None = None  # wall clock (time.time) of real asynchrony: dispatched,
    finish_wall: float | None = None  # finished by its worker,
    consume_wall: float | None = None  # handed to the trainer
    generation_seconds: float | None = None  # its worker's time for the call that made it
    token_versions: Tensor | None = None  # [G, T] int64: the version that sampled each token (partial
    # rollouts: the weights changed mid-answer; ``version`` is the oldest); None: all ``version``
    trained: bool = False  # an update has trained it: consumed again, it is reused (``groups.jsonl``)

    @property
    def versions(self) -> list[int]:
        """The sorted policy versions the group's tokens came from."""
        if self.token_versions is None:
            return [self.version]
        return sorted(set(self.token_versions[self.response_mask].tolist()) or {self.version})

    @property
    def lengths(self) -> Tensor:
        return self.response_mask.sum(-1)

    @property
    def max_length(self) -> int:
        return int(self.lengths.max())

    @property
    def staleness(self) -> int:
        if self.consumed_version is None:
            raise ValueError("staleness is defined once the group is consumed")
        return self.consumed_version - self.version

    @cached_property
    def nbytes(self) -> int:
        tensors = (
            self.prompt_ids,
            self.response_ids,
            self.response_mask,
            self.rewards,
            self.behaviour_logp,
            self.sampler_logp,
            self.token_versions,
        )
        unique = {id(t): t for t in tensors if t is not None}  # behaviour may be the sampler's tensor
        return sum(t.numel() * t.element_size() for t in unique.values())

    def state(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state(cls, state: dict) -> Group:
        return cls(**state)


@dataclass
class Collected:
    """What one call of the collector returns: its groups and what it measured making them
    (:class:`gmc.rollouts.collect.RolloutStats`; a source passes it through untouched)."""

    groups: list[Group]
    stats: Any = None


class Rollouts(Protocol):
    """Where a source gets its groups: the run's prompt order and the collector."""

    def take(self, n: int) -> list[int]:
        """The indices of the run's next ``n`` prompts."""

    def collect(self, prompts: list[int], version: int) -> Collected:
        """One group per prompt index, generated with the current weights, labelled ``version``."""


@dataclass
class Batch:
    """What a source hands the trainer for one step: the groups to train on, and the
    measurements of every collector call made while producing them."""

    groups: list[Group]
    collected: list[Any] = field(default_factory=list)


def staleness_stats(batch: list[Group]) -> dict[str, float]:
    s = [g.staleness for g in batch]
    return {
        "async/staleness_mean": sum(s) / len(s),
        "async/staleness_max": float(max(s)),
        "async/staleness_min": float(min(s)),
    }
