"""The configuration of a training run: :class:`TrainConfig` (method.md sections 3, 4 and 6),
loaded strictly from YAML with ``--set key=value`` overrides (:mod:`gmc.settings`).

Every key is a field here or of a nested settings class, with its type, bounds, default and
docstring; the workflow's schema for the ``train`` section is generated from them. Reading a
config imports no torch.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from gmc.estimators import REGISTRY, EstimatorConfig, settings_read_by
from gmc.estimators.correction import RolloutCorrection
from gmc.rollouts.delays import DelayConfig
from gmc.rollouts.engines import ENGINES, HFConfig, SamplingConfig, VLLMConfig
from gmc.settings import (
    ConfigError,
    NonNegative,
    NonNegativeInt,
    Positive,
    PositiveInt,
    from_dict,
    load_config,
    registered,
    settings,
    to_dict,
)
from gmc.tasks.synthetic import SyntheticTask

__all__ = [
    "TrainConfig",
    "ConfigError",
    "from_dict",
    "to_dict",
    "load_config",
    "load_train_config",
    "history_config",
    "history_values",
]

Dtype = Literal["float32", "bfloat16", "float16"]


@settings
class TrainConfig:
    """Everything one training run depends on (method.md sections 3, 4 and 6).

    Paper-scale values are in ``workflow/presets/paper.yaml``; the defaults here are the tiny
    CPU run's.
    """

    model: str = "results/models/tiny/seed~0"
    """Local folder of HF weights, or a hub name (``gmc build-tiny-model`` makes the default)."""
    model_dtype: Dtype = "float32"
    """Compute dtype: ``float32``, ``bfloat16`` or ``float16``. Below float32, forwards run under
    autocast to this dtype while the parameters stay float32 (``master_weights``)."""
    master_weights: bool | Literal["optimizer"] = True
    """Below float32: keep float32 parameters, so the optimizer updates float32 masters and an
    update of 1e-6 on a weight of 0.02 is not rounded away (bfloat16 keeps 8 mantissa bits);
    checkpoints hold the masters. ``optimizer``: parameters in ``model_dtype`` (forward and
    backward without autocast: no weight cast per use, the residual stream in ``model_dtype``)
    and float32 masters held for the optimizer, written back after every step
    (:mod:`gmc.policy.masters`; the usual mixed precision of large trainers); checkpoints hold
    both. False: parameters in ``model_dtype``, updated in place (half the parameter memory;
    small updates round away)."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    gradient_checkpointing: bool | Literal["auto"] = False
    """Recompute activations in the backward pass (less memory, more time); ``auto``: only when
    the memory plan without it does not fit the device (:func:`gmc.policy.memory.plan`; off on a CPU
    without ``memory_limit_gib``)."""
    train_data: str = "synthetic"
    """``synthetic``, a registered training set (``math``) or a JSONL/JSON/Parquet file."""
    data_source: Literal["local", "hub"] = "local"
    """Registered training sets: read the local copy or the Hugging Face hub."""
    data_root: str | None = None
    """Local data root (default ``$GMC_DATA_ROOT``, else ``data/`` in the repository)."""
    synthetic: SyntheticTask = field(default_factory=SyntheticTask)
    """Difficulty knobs of the synthetic task."""
    thinking: bool = False
    """Qwen3 thinking mode in the chat template."""
    algorithm: registered(lambda: REGISTRY, "estimator") = "gmc"
    """Estimator name, a key of :data:`gmc.estimators.registry.REGISTRY`."""
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    """Estimator hyper-parameters (the ``seq_sum_const`` aggregation divides by
    ``sampling.max_new_tokens``)."""
    group_size: Annotated[int, Field(ge=2)] = 8
    """Responses per prompt, G (group-normalised advantages need at least 2)."""
    prompts_per_step: PositiveInt = 8
    """Prompts (groups) per optimizer step; the paper's [choice] is 32."""
    steps: PositiveInt = 200
    """Training steps: batches taken from the rollout source, each trained with
    ``updates_per_batch`` optimizer updates."""
    updates_per_batch: PositiveInt = 1
    """Optimizer updates per batch [choice]: the batch's groups split, in order, into this many
    mini-batches of ``prompts_per_step / updates_per_batch`` groups (one pass, no epochs), each
    one update (verl's ``ppo_mini_batch_size``, AReaL's ``ppo_n_minibatches``). The policy version
    counts updates, so a group's staleness is counted in updates (a batch's mini-batch ``k`` is
    ``k`` updates staler than its first); the rollout engine takes the weights once per batch and
    the learning-rate schedule steps once per batch. A decoupled loss's proximal policy is the
    policy at the batch's first update (:attr:`gmc.estimators.registry.Estimator.proximal`). 1:
    one update per batch."""
    lr: Positive = 2e-4
    """Peak learning rate (paper [choice]: 1e-6 for Qwen3)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    warmup_steps: NonNegativeInt = 0
    """Linear learning-rate warm-up, in training steps (batches)."""
    optimizer: Literal["auto", "adamw", "adamw8bit"] = "auto"
    """``auto``: 8-bit AdamW (bitsandbytes) on CUDA, torch AdamW on CPU."""
    weight_decay: NonNegative = 0.0
    """AdamW weight decay."""
    max_grad_norm: Positive = 1.0
    """Clip the gradient norm to this value."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Training rollouts: temperature in (0, 10] and top_p 1, so that behaviour log-probs describe
    what was sampled."""
    engine: registered(lambda: ENGINES, "rollout engine") = "hf"
    """Rollout engine, a key of :data:`gmc.rollouts.engines.ENGINES`: ``hf`` (any machine) or ``vllm`` (GPU)."""
    hf: HFConfig = field(default_factory=HFConfig)
    """Settings of the HF engine (a per-token wall-clock cost for benchmarks)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the vLLM engine (memory share, sleep mode, context length, eager mode, dtype)."""
    delay: DelayConfig = field(default_factory=DelayConfig)
    """How stale the rollouts are: delay mode and its settings (method.md section 4)."""
    behaviour_logprobs: Literal["trainer", "sampler"] | None = None
    """Behaviour log-probs of a stale batch [choice]. ``trainer``: recomputed by the trainer model
    when the batch is generated (method.md section 4; one no-grad forward per batch).
    ``sampler``: the rollout engine's own log-probs, no extra pass; with the HF engine in the
    trainer's dtype they come from the same weights (equal to float32 rounding), with vLLM or
    ``sampling.dtype`` from other numerics, so the sampler/trainer mismatch enters the ratios
    (what ``tis`` corrects). Needs sampling at temperature 1, top_p 1. On-policy steps need
    neither: the training forward gives them. Unset: ``sampler`` in the bypass mode of
    ``rollout_correction``, else ``trainer``."""
    rollout_correction: RolloutCorrection | None = None
    """The sampler/trainer mismatch correction stacked on the estimator (verl's keys and presets,
    :mod:`gmc.estimators.correction`; method.md section 3): truncated importance weights and
    rejection of the trainer-over-sampler ratio. None: no correction (the ``rollout_corr/``
    diagnostics are logged all the same)."""
    zero_variance_filter: bool = False
    """Drop the groups whose rewards are all equal (zero advantage: nothing to learn) and refill the
    batch with groups of the next prompts, in at most ``refill_calls`` more generation calls; a
    batch still short is made up with dropped groups (DAPO's dynamic sampling, SkyRL's
    ``zero_variance_filter``). Sources that generate in process (``sync``, ``fixed``,
    ``latency``, but not a fixed delay after a history, whose queue holds the prompts that come next
    after the history's); counted as ``rollout/groups_zero_variance`` and ``rollout/refill_calls``."""
    refill_calls: PositiveInt = 4
    """The most generation calls ``zero_variance_filter`` makes to refill one call's groups."""
    seed: NonNegativeInt = 0
    """Seed of sampling, data order and initialisation."""
    checkpoint_every: NonNegativeInt = 50
    """Write a checkpoint every N steps (and at the end); 0: only at the end."""
    checkpoint_minutes: NonNegative = 0.0
    """Also write one when this many minutes of wall clock passed since the last (bounds what a
    kill loses when steps are long); 0: off. A run also checkpoints when SIGTERM or SIGUSR1 stops
    it at a step boundary (exit status 75: continue with ``--resume``)."""
    keep_checkpoints: Literal["last", "all", "none"] = "last"
    """What a finished run keeps of its checkpoints beside its final model: ``last``, the final
    checkpoint (float32 masters, optimizer, queued rollouts: what continuing the run needs);
    ``all``, the previous one too; ``none``, neither (the run can then only be run again).
    docs/reference/run.md, "Disk"."""
    max_nonfinite_steps: PositiveInt = 3
    """Stop after this many consecutive optimizer updates with a non-finite loss or gradient."""
    compile_layers: bool = False
    """``torch.compile`` each decoder layer (dynamic shapes; :func:`gmc.policy.model.compile_layers`):
    fewer, fused kernels on a GPU; the first steps pay the compilation."""
    fp32_lm_head: bool = False
    """The LM head's matmul in float32 on both sides, the trainer's log-probs and the rollout
    engine's (the HF engine's decoding, vLLM's ``head_dtype``), whatever the compute dtype: TRL's
    ``cast_lm_head_to_fp32``, AReaL's ``enable_fp32_lm_head``. Below float32 it takes one
    mismatch of the sampler and the trainer away (logits rounded to bfloat16 on one side only)."""
    logprob_chunk_size: PositiveInt = 4096
    """Positions per chunk of the LM head in the log-prob computation."""
    micro_batch_tokens: NonNegativeInt = 0
    """Token budget of one forward over rollouts (training forward/backward, behaviour and
    reference passes): at most this many padded tokens (prompt + response) per forward, one row
    at least; gradients accumulate, and the step equals the whole-batch step (gmc.policy.update).
    0: no budget, the whole batch at once."""
    memory_limit_gib: Positive | None = None
    """Device memory the run's memory plan must fit (:mod:`gmc.policy.memory`), GiB; None: the CUDA
    device's total memory, and no check on a CPU. A plan that does not fit stops the run before
    anything large loads, naming the keys that would shrink it."""
    attention: Literal["causal", "masked"] = "causal"
    """How a micro-batch attends (gmc.policy.logprobs): ``causal``, right-padded rows with no attention
    mask (the fast path on every device: no 4-D mask, SDPA's flash kernels); ``masked``, an
    explicit padding mask (the reference; log-probs equal up to kernel rounding)."""
    reference_device: str = "auto"
    """Where the frozen reference policy of the KL term lives (``estimator.kl_coef > 0``):
    ``auto`` (the training device) or a device such as ``cpu``; loaded like the policy."""
    tracking_uri: str | None = None
    """MLflow tracking URI for live logging (e.g. ``sqlite:///results/mlflow.db``); None:
    ``$MLFLOW_TRACKING_URI`` if set, else no live logging."""
    experiment: str | None = None
    """MLflow experiment name; None: ``$MLFLOW_EXPERIMENT_NAME`` if set, else ``gmc``."""

    def __post_init__(self) -> None:
        bypass = self.rollout_correction is not None and self.rollout_correction.bypass
        if self.behaviour_logprobs is None:
            object.__setattr__(self, "behaviour_logprobs", "sampler" if bypass else "trainer")
        elif bypass and self.behaviour_logprobs != "sampler":
            raise ConfigError(
                "bypass mode takes the sampler's log-probs as the behaviour: 'sampler' (or unset)", "behaviour_logprobs"
            )
        elif self.rollout_correction is not None and not bypass and self.behaviour_logprobs != "trainer":
            raise ConfigError(
                "the decoupled correction needs the trainer's log-probs at the generating version: "
                "'trainer' (or unset); the sampler's as the behaviour is rollout_correction.bypass_mode",
                "behaviour_logprobs",
            )
        # training samples: a greedy policy has no log-probs to weight, so 0 is refused here; the
        # log-probs are those of softmax(logits / temperature)
        if not self.sampling.temperature > 0:
            raise ConfigError(
                "training needs a temperature > 0: a greedy policy has no log-probs to weight "
                f"(got {self.sampling.temperature})",
                "sampling.temperature",
            )
        if self.sampling.top_p != 1:
            raise ConfigError(
                "training needs 1: the ratios are of softmax(logits / temperature), and a "
                f"nucleus-truncated sampler is another distribution (got {self.sampling.top_p})",
                "sampling.top_p",
            )
        if (
            self.sampling.dtype is not None
            and not ENGINES[self.engine].shares_model
            and self.sampling.dtype != getattr(getattr(self, self.engine), "dtype", self.sampling.dtype)
        ):
            raise ConfigError(
                f"the {self.engine} engine samples in its own {self.engine}.dtype "
                f"({getattr(self, self.engine).dtype}); set that, or leave sampling.dtype unset",
                "sampling.dtype",
            )
        if (
            self.sampling.dtype == "float32"
            and self.model_dtype != "float32"
            and self.master_weights is not True
            and ENGINES[self.engine].shares_model
        ):
            raise ConfigError(
                f"the {self.engine} engine samples with the trainer's {self.model_dtype} parameters "
                f"(master_weights: {self.master_weights}): it cannot sample in float32",
                "sampling.dtype",
            )
        if self.prompts_per_step % self.updates_per_batch:
            raise ConfigError(
                f"prompts_per_step ({self.prompts_per_step}) must split into updates_per_batch "
                f"({self.updates_per_batch}) mini-batches of whole groups",
                "updates_per_batch",
            )
        if self.zero_variance_filter and self.delay.mode in ("ray", "trace"):
            raise ConfigError(
                f"the {self.delay.mode} mode does not generate its groups in process, where the filter "
                "refills a batch (sync, fixed, latency)",
                "zero_variance_filter",
            )
        if self.zero_variance_filter and self.delay.mode == "fixed" and self.delay.d and self.delay.warmup == "history":
            raise ConfigError(
                "a fixed delay after a history starts with the prompts that come next after the history's, "
                "generated by the history, which the filter's refills would move: turn the filter off or "
                "use delay.warmup: prefill",
                "zero_variance_filter",
            )
        if self.behaviour_logprobs == "sampler" and self.sampling.temperature != 1:
            raise ConfigError(
                "'sampler' needs sampling.temperature 1 and sampling.top_p 1, so that the sampler's "
                "log-probs are the policy's",
                "behaviour_logprobs",
            )


def history_values(cfg: TrainConfig) -> dict | None:
    """The settings of the on-policy run whose end a run with ``delay.warmup: history`` starts
    from, as plain values (None for a run without one): the run's settings trained by
    ``delay.history_algorithm`` for ``delay.history_length`` steps, synchronously, at a constant
    learning rate, keeping its last checkpoint, without the run's mismatch correction, and with
    the estimator settings that history algorithm reads (:func:`~gmc.estimators.settings_read_by`:
    a cap only the run's estimator reads is left at its default). Runs whose histories are equal
    (every setting but the estimator, its own settings and its correction, the delay and what only
    the measured run uses) share one: a run with a correction, or with a tuned cap, starts where
    the same run without it does. Plain values name a history without building its TrainConfig
    (:func:`history_config` builds it)."""
    steps = cfg.delay.history_length
    if steps == 0:
        return None
    return {
        **to_dict(cfg),
        "algorithm": cfg.delay.history_algorithm,
        "estimator": to_dict(settings_read_by(cfg.delay.history_algorithm, cfg.estimator)),
        "steps": steps,
        "delay": to_dict(DelayConfig(mode="sync")),
        "lr_schedule": "constant",
        "keep_checkpoints": "last",
        "tracking_uri": None,
        "experiment": None,
        "rollout_correction": None,
    }


def history_config(cfg: TrainConfig) -> TrainConfig | None:
    """The TrainConfig of the history a run starts from (:func:`history_values`); None without one."""
    values = history_values(cfg)
    return None if values is None else from_dict(TrainConfig, values)


def load_train_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML file of :class:`TrainConfig` keys, apply ``key=value`` overrides, validate."""
    return load_config(TrainConfig, path, overrides)
