"""The delay modes: how stale a run's rollouts are (method.md section 4), as settings and a
registry, in a room of their own below everything that builds a rollout source.

:class:`DelayConfig` holds every mode's settings; :data:`DELAY_MODES` names, for each mode, the
builder of its rollout source as ``"module:function"`` (``gmc.rollouts.sources`` for the simulated
modes, ``gmc.rollouts.ray.source`` for Ray), the keys of :class:`DelayConfig` it reads, its label
and how the workflow sweeps it. Nothing here imports a source, torch or Ray: the workflow and
the results read this registry cheaply, and no arrow runs back up from the sources.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gmc.estimators import REGISTRY
from gmc.settings import (
    ConfigError,
    Fraction,
    NonNegative,
    NonNegativeInt,
    PositiveInt,
    load_named,
    registered,
    settings,
)


@settings(prefix="delay.")
class DelayConfig:
    """How stale the rollouts are (method.md section 4)."""

    mode: registered(lambda: DELAY_MODES, "delay mode") = "fixed"
    """A name of :data:`DELAY_MODES`: ``sync`` (generate then train, no queue), ``fixed`` (FIFO
    of delay ``d``) or ``latency`` (the length-dependent latency model)."""
    d: NonNegativeInt = 0
    """Fixed delay: the queue's length in batches (steps). A batch is trained ``d`` steps after the
    one that generated it, so its staleness is ``d K`` updates at its first update (``d K + k`` at
    mini-batch ``k``) with ``K = updates_per_batch``; versions and ``groups.jsonl`` count updates."""
    warmup: Literal["history", "prefill", "ramp"] = "prefill"
    """How the run starts [choice]. ``history``: from the end of an on-policy run of
    ``history_steps`` steps of the same settings (trained by ``history_algorithm``), its weights,
    optimizer state, prompt order and random streams, in every delay mode; a fixed delay's queue
    holds the ``d`` batches the history generated for it with its last ``d`` versions, one each,
    from the prompts that come after its own (no update has trained them), so staleness is
    exactly ``d`` batches from the first step and the run trains the prompts a run at ``d = 0``
    trains, in its order. ``prefill`` (fixed delay): the queue starts with
    ``d`` batches of the starting weights, trained at steps ``0 .. d-1``, as many batches stale.
    ``ramp`` (fixed delay): the queue starts empty and staleness grows from 0 to ``d`` batches.
    Under ``prefill`` and ``ramp`` every other mode starts from the base model."""
    history_steps: NonNegativeInt | None = None
    """``warmup: history``: the history's on-policy steps ``H`` (at least ``d``; ``H K`` updates
    with ``K = updates_per_batch``); None: ``d``; 0: no history, the run starts from the base model."""
    history_algorithm: registered(lambda: REGISTRY, "estimator") = "grpo"
    """``warmup: history``: the estimator that trains the history (on-policy, where the estimators
    of one class are one computation)."""
    slots: PositiveInt = 16
    """Latency model: generation slots K (groups in flight)."""
    alpha: NonNegative = 1.0
    """Latency model: fixed cost of a group, in virtual seconds."""
    beta: NonNegative = 0.05
    """Latency model: cost per token of the group's longest response, virtual seconds."""
    noise_scale: NonNegative = 0.0
    """Latency model: scale of the additive log-normal noise (0: none)."""
    noise_sigma: NonNegative = 0.5
    """Latency model: sigma of that log-normal noise."""
    step_time: NonNegative = 1.0
    """Latency model: virtual seconds per training step (its ``updates_per_batch`` updates)."""
    workers: PositiveInt = 1
    """Real asynchrony (``ray``): rollout workers, each a Ray actor with its own policy copy."""
    max_staleness: NonNegativeInt = 4
    """Real asynchrony: the bound in optimizer updates. A group is admitted for generation only
    while groups accepted plus in flight stay within ``(max_staleness + version + 1) x
    prompts_per_step / updates_per_batch`` (groups per update; ``version`` the trainer's update),
    and a finished group older than this many updates when the update of its mini-batch trains
    it is dropped (``async/dropped``), never trained. Mini-batch ``k`` of a step is at least ``k``
    updates stale, so the bound is at least ``updates_per_batch - 1`` (:attr:`publish_every`)."""
    transport: Literal["object_store", "collective"] = "object_store"
    """Real asynchrony: how new weights reach the workers: Ray's object store (the state dict put
    once per version) or a ``torch.distributed`` broadcast (gloo on CPU, NCCL on GPUs)."""
    ray_address: str | None = None
    """Real asynchrony: the Ray cluster to join (``auto``: the one running on this node, as inside
    a SLURM allocation); None: start one in this process for the run."""
    worker_device: str = "cpu"
    """Real asynchrony: the device of each worker's policy copy (``cuda`` asks Ray for
    ``worker_gpus`` of a GPU each)."""
    worker_gpus: Fraction = 1.0
    """Real asynchrony on GPUs: the share of a GPU each worker asks of Ray (0.5: two workers on one
    GPU). A trainer on a GPU of the same node keeps that GPU: a reservation takes it from Ray's
    pool before the workers are placed."""
    worker_threads: PositiveInt = 1
    """Real asynchrony: torch threads (and CPUs asked of Ray) per worker."""
    groups_per_task: PositiveInt | None = None
    """Real asynchrony: prompts (groups) a worker generates in one task; None:
    ``ceil(prompts_per_step / workers)``, one step's share."""
    tasks_per_worker: PositiveInt = 2
    """Real asynchrony: tasks in flight per worker (one generating, the others queued at it), so
    a worker that finishes starts its next task at once, without waiting for the trainer; with
    ``groups_per_task`` it caps what is in flight below what the bound admits."""
    partial_rollouts: bool = False
    """Real asynchrony: a worker that receives new weights while it generates continues its answers
    with them (their cache computed again with the new weights), each token's log-prob and version
    recorded; a group is labelled with its oldest version and ``groups.jsonl`` lists them all
    (``versions``). The trajectory ratios then span versions. Needs ``behaviour_logprobs:
    sampler`` (a recomputed behaviour pass would use one version) and the HF engine."""
    publish_every: PositiveInt = 1
    """Real asynchrony: the trainer sends its weights to the workers after every this many steps
    (``publish_every x updates_per_batch`` updates; TRL's ``weight_sync_steps``, verl's
    ``trigger_parameter_sync_step``), and at its start; the workers generate with the weights last
    sent, whose version (update) labels their groups, while the bound's capacity counts the
    trainer's own updates; a resumed run sends its weights at once. ``async/weights_version`` is
    the version the workers have. At most ``(max_staleness + 1) / updates_per_batch``: the last
    update before a send would find every group too old."""
    trace: str | None = None
    """Replay (``trace``): a ``staleness_trace.jsonl`` whose groups are generated and consumed at the
    recorded versions."""

    def __post_init__(self) -> None:
        if self.publish_every > 1 and self.mode != "ray":
            raise ConfigError(
                f"the {self.mode!r} mode generates with the trainer's own weights at every step; a "
                "publish interval is real asynchrony's (delay.mode: ray)",
                "publish_every",
            )
        if (
            self.warmup == "history"
            and self.mode == "fixed"
            and self.history_steps is not None
            and self.history_steps < self.d
        ):
            raise ConfigError(
                f"a history of {self.history_steps} steps cannot fill a queue of d = {self.d} batches: give at least d",
                "history_steps",
            )

    @property
    def queued(self) -> int:
        """The batches a run's queue starts with from a history (``warmup: history``): ``d`` for a
        fixed delay, 0 in every other mode (its history generates no queue for it)."""
        return self.d if self.mode == "fixed" else 0

    @property
    def history_length(self) -> int:
        """The on-policy steps (batches) the run starts after: ``history_steps`` (``d`` where None)
        under ``warmup: history``, else 0."""
        if self.warmup != "history":
            return 0
        return self.d if self.history_steps is None else self.history_steps


@dataclass(frozen=True)
class DelayMode:
    """A registered delay mode: how to build its rollout source, what it reads, how results show it."""

    source: str
    """``module:function`` of its builder ``build(cfg, rollouts, records) -> source``: the run's
    :class:`~gmc.run.config.TrainConfig`, its :class:`~gmc.rollouts.groups.Rollouts` (prompt order and
    collector) and its prompt records (what a remote worker is sent to generate from)."""
    label: str
    """Name in figure titles and reports."""
    keys: tuple[str, ...]
    """The :class:`DelayConfig` fields the mode reads besides ``mode``: the only keys its config
    section accepts (``latency.delay``, ``ray.delay``)."""
    named_point: bool
    """The workflow sweeps it as ``delay~<name>``, with the settings of config.yaml's section of
    that name (a ``NamedDelay`` field of ``gmc.workflow.WorkflowConfig``, which a new named mode
    adds); otherwise it is not a sweep point of its own (``fixed`` runs are ``delay~<d>``)."""
    on_policy: Callable[[DelayConfig], bool] = lambda cfg: False
    """Whether every batch is trained by the weights that generated it (then the training
    forward gives the behaviour log-probs exactly, and no behaviour pass is run)."""
    in_process: bool = True
    """Groups are generated in the trainer's process (by the run's collector); otherwise elsewhere
    (remote workers), and the trainer builds no rollout engine of its own."""
    check: str | None = None
    """``module:function`` of ``check(cfg)``, run on the run's TrainConfig before it starts: a
    :class:`~gmc.settings.ConfigError` naming the key when the mode cannot run with these settings."""

    def check_run(self, cfg: Any) -> None:
        """The mode's own check of a run's TrainConfig ``cfg`` (a trace must fit the run), before it starts."""
        if self.check:
            load_named(self.check)(cfg)

    def make_source(self, cfg: Any, rollouts: Any, records: list[dict]) -> Any:
        """The rollout source of a run (a :class:`~gmc.rollouts.sources.SyncSource`) for its
        TrainConfig ``cfg``, its :class:`~gmc.rollouts.groups.Rollouts` and prompt records, built by
        :attr:`source` (this module imports none of the builders)."""
        return load_named(self.source)(cfg, rollouts, records)


LATENCY_KEYS = ("slots", "alpha", "beta", "noise_scale", "noise_sigma", "step_time")
RAY_KEYS = (
    "workers",
    "max_staleness",
    "transport",
    "ray_address",
    "worker_device",
    "worker_gpus",
    "worker_threads",
    "groups_per_task",
    "tasks_per_worker",
    "partial_rollouts",
    "publish_every",
)

DELAY_MODES: dict[str, DelayMode] = {
    "sync": DelayMode(
        "gmc.rollouts.sources:sync_source", "synchronous", (), named_point=False, on_policy=lambda cfg: True
    ),
    "fixed": DelayMode(
        "gmc.rollouts.sources:fixed_source",
        "fixed delay",
        ("d", "warmup"),
        named_point=False,
        on_policy=lambda cfg: cfg.d == 0,
    ),
    "latency": DelayMode("gmc.rollouts.sources:latency_source", "latency model", LATENCY_KEYS, named_point=True),
    "ray": DelayMode(
        "gmc.rollouts.ray.source:ray_source",
        "real asynchrony (Ray)",
        RAY_KEYS,
        named_point=True,
        in_process=False,
        check="gmc.rollouts.ray.admission:check_ray_mode",
    ),
    "trace": DelayMode(
        "gmc.rollouts.sources:trace_source",
        "replayed trace",
        ("trace",),
        named_point=False,
        check="gmc.rollouts.sources:check_trace_mode",
    ),
}
"""Every delay mode by config name (``delay.mode``); the one place to add one (a mode swept by
name also takes its section in the workflow's configuration, :attr:`DelayMode.named_point`)."""


def named_delays() -> list[str]:
    """Delay modes swept by name (``delay~latency``), in registry order."""
    return [name for name, mode in DELAY_MODES.items() if mode.named_point]


def delay_mode(cfg: DelayConfig) -> DelayMode:
    """The registered mode of these delay settings."""
    return DELAY_MODES[cfg.mode]


def on_policy(cfg: DelayConfig) -> bool:
    """Whether a run with these delay settings trains every batch with the weights that made it."""
    return delay_mode(cfg).on_policy(cfg)
