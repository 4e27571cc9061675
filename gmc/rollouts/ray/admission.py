"""The staleness bound of real asynchrony: admission by capacity, and dropping what still
exceeds the bound (the rule of AReaL's and SkyRL's staleness managers).

Versions count optimizer updates. At the trainer's update ``v`` with bound ``S`` and ``b``
groups per update (``prompts_per_step / updates_per_batch``: each update trains a mini-batch of
``b`` groups), a group may start only while ``accepted + in_flight < (S + v + 1) b``,
``accepted`` counting every group that finished and entered the buffer since the run began
(consumed or not) and ``in_flight`` those started and not finished; so the groups consumed in
order are at most ``S`` updates stale. A finished group is accepted when it arrives unless it is
already more than ``S`` updates old, and a buffered group that the update training it would
take more than ``S`` updates after its weights is dropped, never trained (a dropped group frees
its slot for another). With one update per step, versions are steps and ``b`` is the batch. No
torch, no Ray: the rule is tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from gmc.settings import ConfigError


def check_ray_mode(cfg) -> None:
    """What ``delay.mode: ray`` refuses before a run starts: partial rollouts without the sampler's
    own log-probs (a recomputed behaviour pass would give every token one version's) or with an
    engine other than the HF one (its decoding loop is where new weights are taken in), and a
    publish interval longer than the bound lets a group wait."""
    K = cfg.updates_per_batch
    if cfg.delay.partial_rollouts and cfg.behaviour_logprobs != "sampler":
        raise ConfigError(
            "partial rollouts need behaviour_logprobs: sampler (each token's log-prob from the "
            "weights that sampled it)",
            "delay.partial_rollouts",
        )
    if cfg.delay.partial_rollouts and cfg.engine != "hf":
        raise ConfigError(f"partial rollouts run on the hf engine, not {cfg.engine!r}", "delay.partial_rollouts")
    if cfg.delay.publish_every * K > cfg.delay.max_staleness + 1:
        raise ConfigError(
            f"weights sent every {cfg.delay.publish_every} steps ({cfg.delay.publish_every * K} updates) "
            f"leave the last update before a send only groups at least {cfg.delay.publish_every * K - 1} "
            f"updates old, and the bound drops those older than max_staleness {cfg.delay.max_staleness}: "
            "the run would wait forever; give publish_every x updates_per_batch at most max_staleness + 1",
            "delay.publish_every",
        )


@dataclass
class StalenessBound:
    """Counters of the bound of ``max_staleness`` updates with ``per_update`` groups trained per
    update; ``state_dict`` / ``load_state_dict`` keep them across a resume."""

    max_staleness: int
    per_update: int
    accepted: int = 0
    in_flight: int = 0
    dropped: int = 0

    def capacity(self, version: int) -> int:
        """Groups that may start now, at the trainer's update ``version`` (0 or more)."""
        return max(0, (self.max_staleness + version + 1) * self.per_update - self.accepted - self.in_flight)

    def started(self, n: int) -> None:
        self.in_flight += n

    def lost(self, n: int) -> None:
        """``n`` started groups will not finish (their worker died): they are no longer in flight."""
        self.in_flight -= n

    def finished(self, made_at: int, version: int) -> bool:
        """A group made with the weights of update ``made_at`` finished while the trainer is at
        update ``version``: accepted into the buffer (True) or dropped as too old (False)."""
        self.in_flight -= 1
        if version - made_at > self.max_staleness:
            self.dropped += 1
            return False
        self.accepted += 1
        return True

    def too_old(self, made_at: int, consumer: int) -> bool:
        """Whether a buffered group that update ``consumer`` would train is more than the bound
        after its weights."""
        return consumer - made_at > self.max_staleness

    def discard(self) -> None:
        """A buffered group is dropped after all (too old for the consumer): it frees its slot, as
        one never accepted, so that another group can take its place."""
        self.accepted -= 1
        self.dropped += 1

    def state_dict(self) -> dict:
        return {"accepted": self.accepted, "dropped": self.dropped}

    def load_state_dict(self, state: dict) -> None:
        self.accepted, self.dropped, self.in_flight = state["accepted"], state["dropped"], 0
