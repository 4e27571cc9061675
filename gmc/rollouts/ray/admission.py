"""The staleness bound of real asynchrony: admission by capacity, and dropping what still
exceeds the bound (the rule of AReaL's and SkyRL's staleness managers).

At policy version ``v`` with bound ``S`` and ``B`` groups per step, a group may start only while
``accepted + in_flight < (S + v + 1) B``, ``accepted`` counting every group that finished and
entered the buffer since the run began (consumed or not) and ``in_flight`` those started and
not finished; a finished group is accepted when it arrives unless it is already more than ``S``
versions old, and a buffered group that the consumer would train more than ``S`` versions after
its weights is dropped, never trained (a dropped group frees its slot for another). No torch, no Ray: the rule is tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from gmc.settings import ConfigError


def check_ray_mode(cfg) -> None:
    """What ``delay.mode: ray`` refuses before a run starts: partial rollouts without the sampler's
    own log-probs (a recomputed behaviour pass would give every token one version's) or with an
    engine other than the HF one (its decoding loop is where new weights are taken in), and a
    publish interval longer than the bound lets a group wait."""
    if cfg.delay.partial_rollouts and cfg.behaviour_logprobs != "sampler":
        raise ConfigError(
            "partial rollouts need behaviour_logprobs: sampler (each token's log-prob from the "
            "weights that sampled it)",
            "delay.partial_rollouts",
        )
    if cfg.delay.partial_rollouts and cfg.engine != "hf":
        raise ConfigError(f"partial rollouts run on the hf engine, not {cfg.engine!r}", "delay.partial_rollouts")
    if cfg.delay.publish_every > cfg.delay.max_staleness + 1:
        raise ConfigError(
            f"weights sent every {cfg.delay.publish_every} steps make groups up to "
            f"{cfg.delay.publish_every - 1} versions old before the next send, and the bound drops "
            f"those older than max_staleness {cfg.delay.max_staleness}: the run would wait forever; "
            "give at most max_staleness + 1",
            "delay.publish_every",
        )


@dataclass
class StalenessBound:
    """Counters of the bound; ``state_dict`` / ``load_state_dict`` keep them across a resume."""

    max_staleness: int
    batch: int
    accepted: int = 0
    in_flight: int = 0
    dropped: int = 0

    def capacity(self, version: int) -> int:
        """Groups that may start now, at policy ``version`` (0 or more)."""
        return max(0, (self.max_staleness + version + 1) * self.batch - self.accepted - self.in_flight)

    def started(self, n: int) -> None:
        self.in_flight += n

    def lost(self, n: int) -> None:
        """``n`` started groups will not finish (their worker died): they are no longer in flight."""
        self.in_flight -= n

    def finished(self, made_at: int, version: int) -> bool:
        """A group made with the weights of ``made_at`` finished while the trainer is at ``version``:
        accepted into the buffer (True) or dropped as too old (False)."""
        self.in_flight -= 1
        if version - made_at > self.max_staleness:
            self.dropped += 1
            return False
        self.accepted += 1
        return True

    def too_old(self, made_at: int, consumer: int) -> bool:
        """Whether a buffered group would be trained more than the bound after its weights."""
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
