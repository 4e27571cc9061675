"""Run configuration: the documented :class:`TrainConfig` and strict loading from YAML with
``--set key=value`` overrides. Unknown keys and ill-typed values are errors that name the key.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from gmc.asynchrony import DelayConfig
from gmc.data import SyntheticTask
from gmc.estimators import ESTIMATORS, EstimatorConfig
from gmc.rollout import SamplingConfig


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names it."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run depends on (method.md sections 3, 4 and 6).

    Paper-scale values are in ``workflow/presets/paper.yaml``; the defaults here are the tiny
    CPU run's.
    """

    model: str = "results/models/tiny"
    """Hub name or local folder of the policy (``gmc build-tiny-model`` makes the default)."""
    model_dtype: str = "float32"
    """Compute dtype: ``float32``, ``bfloat16`` or ``float16``. Below float32, forwards run under
    autocast to this dtype while the parameters stay float32 (``master_weights``)."""
    master_weights: bool = True
    """Below float32: keep float32 parameters, so the optimizer updates float32 masters and an
    update of 1e-6 on a weight of 0.02 is not rounded away (bfloat16 keeps 8 mantissa bits);
    checkpoints hold the masters. False: parameters in ``model_dtype``, updated in place (half
    the parameter memory; small updates round away)."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``."""
    gradient_checkpointing: bool = False
    train_data: str = "synthetic"
    """``synthetic``, a registered training set (``math``) or a JSONL/JSON/Parquet file."""
    data_source: Literal["local", "hub"] = "local"
    """Registered training sets: read the local copy or the Hugging Face hub."""
    data_root: str | None = None
    """Local data root (default ``$GMC_DATA_ROOT`` or ``../shared/data``)."""
    synthetic: SyntheticTask = field(default_factory=SyntheticTask)
    """Difficulty knobs of the synthetic task."""
    thinking: bool = False
    """Qwen3 thinking mode in the chat template."""
    algorithm: str = "gmc"
    """Estimator name: grpo, tic, gmc, is, none, gspo, tis."""
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    group_size: int = 8
    """Responses per prompt, G."""
    prompts_per_step: int = 8
    """Prompts (groups) per optimizer step; the paper's [choice] is 32."""
    steps: int = 200
    """Optimizer steps."""
    lr: float = 2e-4
    """Peak learning rate (paper [choice]: 1e-6 for Qwen3)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    optimizer: Literal["auto", "adamw", "adamw8bit"] = "auto"
    """``auto``: 8-bit AdamW (bitsandbytes) on CUDA, torch AdamW on CPU."""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=48))
    """Training rollouts: temperature 1, top_p 1 so behaviour log-probs describe what was sampled."""
    engine: Literal["hf", "vllm"] = "hf"
    delay: DelayConfig = field(default_factory=DelayConfig)
    behaviour_logprobs: Literal["trainer", "sampler"] = "trainer"
    """Behaviour log-probs of a stale batch [choice]. ``trainer``: recomputed by the trainer model
    when the batch is generated (method.md section 4; one no-grad forward per batch).
    ``sampler``: the rollout engine's own log-probs, no extra pass; with the HF engine they come
    from the same weights (equal to float32 rounding), with vLLM from its own kernels, so the
    sampler/trainer mismatch enters the ratios (what ``tis`` corrects). Needs sampling at
    temperature 1, top_p 1. On-policy steps need neither: the training forward gives them."""
    seed: int = 0
    checkpoint_every: int = 50
    """Write a checkpoint every N steps (and at the end); 0: only at the end."""
    max_nonfinite_steps: int = 3
    """Stop after this many consecutive steps with a non-finite loss or gradient."""
    logprob_chunk_size: int = 4096
    """Positions per chunk of the LM head in the log-prob computation."""
    micro_batch_tokens: int = 0
    """Token budget of one forward over rollouts (training forward/backward, behaviour and
    reference passes): at most this many padded tokens (prompt + response) per forward, one row
    at least; gradients accumulate, and the step equals the whole-batch step (gmc.update).
    0: no budget, the whole batch at once."""
    reference_device: str = "auto"
    """Where the frozen reference policy of the KL term lives (``estimator.kl_coef > 0``):
    ``auto`` (the training device) or a device such as ``cpu``; loaded like the policy."""
    tracking_uri: str | None = None
    """MLflow tracking URI for live logging (e.g. ``sqlite:///results/mlflow.db``); None: off."""
    experiment: str = "gmc"
    """MLflow experiment name."""

    def __post_init__(self) -> None:
        if self.algorithm not in ESTIMATORS:
            raise ConfigError(f"algorithm: unknown estimator {self.algorithm!r}; known: {sorted(ESTIMATORS)}")
        for name in ("group_size", "prompts_per_step", "steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ConfigError("group_size: group-normalised advantages need at least 2 responses per prompt")
        if self.lr <= 0:
            raise ConfigError(f"lr: must be > 0, got {self.lr}")
        if self.checkpoint_every < 0 or self.max_nonfinite_steps < 1:
            raise ConfigError("checkpoint_every must be >= 0 and max_nonfinite_steps >= 1")
        choices = {"lr_schedule": ("constant", "linear", "cosine"), "optimizer": ("auto", "adamw", "adamw8bit"),
                   "engine": ("hf", "vllm"), "data_source": ("local", "hub"),
                   "model_dtype": ("float32", "bfloat16", "float16"), "behaviour_logprobs": ("trainer", "sampler")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}: must be one of {allowed}, got {getattr(self, name)!r}")
        if self.micro_batch_tokens < 0:
            raise ConfigError(f"micro_batch_tokens: must be >= 0 (0: no budget), got {self.micro_batch_tokens}")
        if self.sampling.temperature <= 0:
            raise ConfigError("sampling.temperature: training samples at a temperature > 0 (its log-probs are "
                              f"those of softmax(logits / temperature)), got {self.sampling.temperature}")
        if self.sampling.top_p != 1:
            raise ConfigError("sampling.top_p: training needs 1: the ratios are of softmax(logits / temperature), "
                              f"and a nucleus-truncated sampler is another distribution (got {self.sampling.top_p})")
        if self.behaviour_logprobs == "sampler" and (self.sampling.temperature != 1 or self.sampling.top_p != 1):
            raise ConfigError("behaviour_logprobs: 'sampler' needs sampling.temperature 1 and sampling.top_p 1, "
                              "so that the sampler's log-probs are the policy's")


# ---------------------------------------------------------------------------------------------
# strict loading


def _is_dataclass_type(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}: must be one of {typing.get_args(tp)}, got {value!r}")
        return value
    if origin is tuple:
        return tuple(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 2e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if _is_dataclass_type(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    return value


def from_dict(cls, data: dict[str, Any], prefix: str = ""):
    """Build dataclass ``cls`` from a (nested) mapping; unknown keys and bad values raise
    :class:`ConfigError` naming the dotted key."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]!s}; known keys of {prefix or 'the config'}: {sorted(known)}")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix or 'config'}: {e}") from e


def to_dict(obj) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], parsed YAML value)."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = dict(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        node[path[-1]] = value
    return out


def load_train_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML file of :class:`TrainConfig` keys, apply ``key=value`` overrides, validate."""
    return load_config(TrainConfig, path, overrides)


def load_config(cls, path: str | Path | None = None, overrides: list[str] | None = None):
    """Read a YAML file (a missing file is an error), apply ``key=value`` overrides, and build
    dataclass ``cls`` strictly (:func:`from_dict`)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"{p}: config file not found")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: invalid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level")
    data = apply_overrides(data, overrides or [])
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        where = f"{path}: " if path else ""
        raise ConfigError(f"{where}{e}") from None
