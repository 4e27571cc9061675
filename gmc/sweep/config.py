"""The sweep's sections of the workflow's configuration (``config.yaml``; the whole of it is
:class:`gmc.workflow.WorkflowConfig`): the grid of runs (``sweep``), the runs under a named delay
mode (``latency``, ``ray``), the replayed traces (``traces``), the variants of an estimator
(``variants``), and what every run of the sweep shares of its delay (``train.delay``).

A key is spelled as the run spells it (:class:`~gmc.run.config.TrainConfig`): an axis lists the
values of the run's key (``sweep.algorithm``, ``sweep.delay``, ``sweep.group_size``,
``sweep.seed``), and a run's shared delay settings are ``train.delay.<key>`` as in a run's own
config. No torch is imported.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import Field

from gmc.estimators import REGISTRY
from gmc.run.config import TrainConfig
from gmc.settings import NonNegativeInt, keys_of, registered, settings

SET_ELSEWHERE: dict[str, str] = {
    "model": "model",
    "data_source": "data_source",
    "data_root": "data_root",
    "synthetic": "synthetic",
    "tracking_uri": "tracking_uri",
    "experiment": "experiment",
    "algorithm": "sweep.algorithm",
    "group_size": "sweep.group_size",
    "seed": "sweep.seed",
}
"""The run keys that the ``train`` section does not hold, and where the config holds each: the
settings every job shares, at the top level under the run's own names, and the sweep's axes. (Of
``delay``, the section holds :class:`RunDelay`'s keys; the others are set per point.)"""

Algorithm = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
"""A registered estimator, or the name of one of the sweep's variants (``variants``)."""
GroupSize = Annotated[int, Field(ge=2)]
Estimator = registered(lambda: REGISTRY, "estimator")


@settings
class References:
    """Reference rows run at a few delays only, with every group size and seed of the sweep (for
    instance uncapped importance sampling, ``is``, and no correction, ``none``, at the largest
    delay). Runs already in the grid are not repeated."""

    algorithm: list[Algorithm] = field(default_factory=list)
    """Reference estimators (the runs' ``algorithm``)."""
    delay: list[NonNegativeInt] = field(default_factory=list)
    """Fixed delays ``d`` at which the references run (the runs' ``delay.d``)."""


@settings(prefix="sweep.")
class SweepAxes:
    """The grid of training runs: every algorithm x delay x group size x seed, each a point
    ``algo~A/delay~d/group~G/seed~S`` with the run's keys set to those values."""

    algorithm: Annotated[list[Algorithm], Field(min_length=1)]
    """Estimators to compare (the runs' ``algorithm``), or variants of them (``variants``)."""
    delay: list[NonNegativeInt]
    """Fixed delays ``d`` in batches (the runs' ``delay.d``, ``delay.mode: fixed``), 0 = synchronous."""
    group_size: Annotated[list[GroupSize], Field(min_length=1)]
    """Responses per prompt, ``G`` (the runs' ``group_size``)."""
    seed: Annotated[list[NonNegativeInt], Field(min_length=1)]
    """Training seeds: sampling, data order and, for a model built per seed, the base model (the
    runs' ``seed``)."""
    samples_per_step: Annotated[int, Field(ge=2)] | None = None
    """Rollouts per optimizer step held fixed across group sizes (the sampling budget a user has):
    every run's ``prompts_per_step`` is ``samples_per_step / G``, so a larger ``G`` sees fewer
    prompts per step. None: ``train.prompts_per_step`` at every group size."""
    references: References = field(default_factory=References)
    """Reference rows at a few delays (:class:`References`)."""


@settings
class RunDelay:
    """How every run of the sweep starts (``train.delay``): the run's ``delay`` keys that the
    sweep shares; the others are set per point (``sweep.delay``, a named delay mode's section,
    ``traces``)."""

    warmup: Literal["history", "prefill", "ramp"] = "history"
    """How every run starts (the runs' ``delay.warmup``). ``history``: each seed's runs (every
    estimator and delay, the latency model and Ray included) start from the end of one on-policy
    history; a fixed delay ``d`` first trains the ``d`` batches the history generated for it with
    its last ``d`` versions from the prompts that come after its own, which no update has trained,
    so staleness is exactly ``d`` at every step and every delay trains the same prompts in the
    same order. ``prefill``: a fixed delay's queue starts with ``d`` batches of
    the base model (the batch trained at step ``t < d`` is ``t`` updates stale), the other runs
    from the base model. ``ramp``: the queue starts empty and staleness grows to ``d``."""
    history_steps: NonNegativeInt | None = None
    """Under ``warmup: history``: the history's on-policy steps ``H``, trained once per seed and
    settings (``<results>/history/<name>/``, ``gmc history``) and shared by every estimator and
    delay; at least the sweep's largest fixed delay. None: that delay."""
    history_algorithm: Estimator = "grpo"
    """Under ``warmup: history``: the estimator that trains the history (on-policy, where the
    estimators of one class are one computation)."""


@settings
class NamedDelay:
    """The runs under one named delay mode (``delay~<mode>``): its estimators and group sizes,
    every seed of the sweep, with the mode's settings."""

    enabled: bool = False
    """Run this delay mode's points at all."""
    algorithm: list[Algorithm] = field(default_factory=list)
    """Estimators (or variants) to run under this delay mode."""
    group_size: list[GroupSize] = field(default_factory=list)
    """Group sizes ``G`` to run under this delay mode."""
    delay: dict[str, Any] = field(default_factory=dict)
    """The delay mode's settings: the keys of the runs' ``delay``
    (:class:`~gmc.rollouts.delays.DelayConfig`) that the mode reads, and no other."""


@settings
class Trace:
    """A recorded staleness trace replayed as the points ``delay~trace-<name>``: each group
    generated at its recorded version and consumed at its recorded step (``delay.mode: trace``)."""

    trace: str
    """The ``staleness_trace.jsonl`` to replay (the runs' ``delay.trace``)."""
    algorithm: list[Algorithm]
    """Estimators (or variants) to run on the trace."""
    group_size: list[GroupSize]
    """Group sizes ``G`` (the trace's own, to match its prompts per step)."""


@settings
class Variant:
    """A named variant of an estimator, run as sweep points of its own (``algo~<name>``) wherever
    an estimator may be named: the estimator with train settings of its own over the ``train``
    section's (a mismatch correction, an estimator setting). The tables compare each variant with
    its estimator (``<name> − <algorithm>``)."""

    algorithm: Estimator
    """The estimator it varies."""
    train: keys_of(lambda: TrainConfig, drop=(*SET_ELSEWHERE, "delay")) = field(default_factory=dict)
    """Its train settings (the runs' keys but those :data:`SET_ELSEWHERE` and ``delay``), merged
    key by key over the ``train`` section."""
