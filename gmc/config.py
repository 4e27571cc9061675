"""Run configuration: the documented :class:`TrainConfig` and strict loading from YAML with
``--set key=value`` overrides. Unknown keys and ill-typed values are errors that name the key.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from gmc.asynchrony import DelayConfig
from gmc.data import SyntheticTask
from gmc.estimators import ESTIMATORS, EstimatorConfig
from gmc.rollout import SamplingConfig, VLLMConfig


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names it (``key``: the dotted key,
    when one is to blame)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def check_number(owner, name: str, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, prefix: str = "") -> None:
    """Raise :class:`ConfigError` naming ``prefix + name`` unless ``getattr(owner, name)`` is a
    finite number within ``[low, high]`` (``(low, high]`` when ``low_open``)."""
    value = getattr(owner, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low is None or (value > low if low_open else value >= low)) and (high is None or value <= high)
    if not ok:
        bounds = []
        if low is not None:
            bounds.append(f"{'>' if low_open else '>='} {low:g}")
        if high is not None:
            bounds.append(f"<= {high:g}")
        raise ConfigError(f"{prefix}{name}: must be a finite number {' and '.join(bounds)}, got {value!r}".rstrip(),
                          key=f"{prefix}{name}")


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run depends on (method.md sections 3, 4 and 6).

    Paper-scale values are in ``workflow/presets/paper.yaml``; the defaults here are the tiny
    CPU run's.
    """

    model: str = "results/models/tiny"
    """Hub name or local folder of the policy (``gmc build-tiny-model`` makes the default)."""
    model_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
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
    """Recompute activations in the backward pass (less memory, more time)."""
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
    algorithm: str = "gmc"
    """Estimator name, a key of :data:`gmc.estimators.REGISTRY` (grpo, tic, gmc, is, none, gspo, tis)."""
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    """Estimator hyper-parameters; ``estimator.max_new_tokens`` is set from ``sampling.max_new_tokens``."""
    group_size: int = 8
    """Responses per prompt, G."""
    prompts_per_step: int = 8
    """Prompts (groups) per optimizer step; the paper's [choice] is 32."""
    steps: int = 200
    """Optimizer steps."""
    lr: float = 2e-4
    """Peak learning rate (paper [choice]: 1e-6 for Qwen3)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, in optimizer steps."""
    optimizer: Literal["auto", "adamw", "adamw8bit"] = "auto"
    """``auto``: 8-bit AdamW (bitsandbytes) on CUDA, torch AdamW on CPU."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Clip the gradient norm to this value."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=48))
    """Training rollouts: temperature 1, top_p 1 so behaviour log-probs describe what was sampled."""
    engine: Literal["hf", "vllm"] = "hf"
    """Rollout engine: ``hf`` (any machine) or ``vllm`` (GPU)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """Settings of the vLLM engine (memory share, sleep mode, context length, eager mode, dtype)."""
    delay: DelayConfig = field(default_factory=DelayConfig)
    """How stale the rollouts are: delay mode and its settings (method.md section 4)."""
    behaviour_logprobs: Literal["trainer", "sampler"] = "trainer"
    """Behaviour log-probs of a stale batch [choice]. ``trainer``: recomputed by the trainer model
    when the batch is generated (method.md section 4; one no-grad forward per batch).
    ``sampler``: the rollout engine's own log-probs, no extra pass; with the HF engine they come
    from the same weights (equal to float32 rounding), with vLLM from its own kernels, so the
    sampler/trainer mismatch enters the ratios (what ``tis`` corrects). Needs sampling at
    temperature 1, top_p 1. On-policy steps need neither: the training forward gives them."""
    seed: int = 0
    """Seed of sampling, data order and initialisation."""
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
    """MLflow tracking URI for live logging (e.g. ``sqlite:///results/mlflow.db``); None:
    ``$MLFLOW_TRACKING_URI`` if set, else no live logging."""
    experiment: str | None = None
    """MLflow experiment name; None: ``$MLFLOW_EXPERIMENT_NAME`` if set, else ``gmc``."""

    def __post_init__(self) -> None:
        if self.algorithm not in ESTIMATORS:
            raise ConfigError(f"algorithm: unknown estimator {self.algorithm!r}; known: {sorted(ESTIMATORS)}",
                              key="algorithm")
        for name in ("group_size", "prompts_per_step", "steps", "max_nonfinite_steps", "logprob_chunk_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}", key=name)
        if self.group_size < 2:
            raise ConfigError("group_size: group-normalised advantages need at least 2 responses per prompt",
                              key="group_size")
        for name in ("seed", "warmup_steps", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)}", key=name)
        check_number(self, "lr", 0, low_open=True)
        check_number(self, "max_grad_norm", 0, low_open=True)
        check_number(self, "weight_decay", 0)
        # training samples: a greedy policy has no log-probs to weight, so 0 is refused here; the
        # log-probs are those of softmax(logits / temperature)
        check_number(self.sampling, "temperature", 0, 10, low_open=True, prefix="sampling.")
        for name, allowed in literal_choices(type(self)).items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}: must be one of {allowed}, got {getattr(self, name)!r}", key=name)
        if self.micro_batch_tokens < 0:
            raise ConfigError(f"micro_batch_tokens: must be >= 0 (0: no budget), got {self.micro_batch_tokens}",
                              key="micro_batch_tokens")
        if self.sampling.top_p != 1:
            raise ConfigError("sampling.top_p: training needs 1: the ratios are of softmax(logits / temperature), "
                              f"and a nucleus-truncated sampler is another distribution (got {self.sampling.top_p})",
                              key="sampling.top_p")
        if self.behaviour_logprobs == "sampler" and (self.sampling.temperature != 1 or self.sampling.top_p != 1):
            raise ConfigError("behaviour_logprobs: 'sampler' needs sampling.temperature 1 and sampling.top_p 1, "
                              "so that the sampler's log-probs are the policy's", key="behaviour_logprobs")
        # the normaliser of seq_sum_const is the generation limit: one value, set here
        object.__setattr__(self, "estimator",
                           dataclasses.replace(self.estimator, max_new_tokens=self.sampling.max_new_tokens))

    derived_keys: ClassVar[dict[str, str]] = {"estimator.max_new_tokens": "sampling.max_new_tokens"}
    """Keys set from another key; :func:`from_dict` rejects a given value that differs."""


def literal_choices(cls) -> dict[str, tuple]:
    """The allowed values of every ``Literal``-typed field of dataclass ``cls`` (``X | None``
    included): the one place they are declared."""
    out = {}
    for name, tp in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
        if len(args) == 1 and typing.get_origin(args[0]) is Literal:
            out[name] = typing.get_args(args[0])
    return out


def _is_union(tp) -> bool:
    origin = typing.get_origin(tp)
    return origin is typing.Union or origin is types.UnionType


# ---------------------------------------------------------------------------------------------
# strict loading


def _is_dataclass_type(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp, key: str) -> Any:
    origin = typing.get_origin(tp)
    if _is_union(tp):
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
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}", key=key)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}: must be one of {typing.get_args(tp)}, got {value!r}", key=key)
        return value
    if origin is tuple:
        return tuple(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}", key=key)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}", key=key)
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 2e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}", key=key)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}", key=key)
        return value
    if _is_dataclass_type(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}", key=key)
        return from_dict(tp, value, prefix=f"{key}.")
    return value


def from_dict(cls, data: dict[str, Any], prefix: str = ""):
    """Build dataclass ``cls`` from a (nested) mapping; unknown keys and bad values raise
    :class:`ConfigError` naming the dotted key."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]!s}; known keys of {prefix or 'the config'}: {sorted(known)}",
                          key=f"{prefix}{unknown[0]!s}")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    try:
        obj = cls(**kwargs)
    except ConfigError as e:
        if prefix and e.key:
            raise ConfigError(f"{prefix}{e}", key=f"{prefix}{e.key}") from None
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {e}", key=prefix.rstrip(".") or None) from e
    for key, source in getattr(cls, "derived_keys", {}).items():
        given = _lookup(data, key)
        if given is not _MISSING and given != _lookup(to_dict(obj), source):
            raise ConfigError(f"{prefix}{key}: set from {prefix}{source} ({_lookup(to_dict(obj), source)!r}); "
                              f"remove it (got {given!r})")
    return obj


_MISSING = object()


def _lookup(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def to_dict(obj) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], parsed YAML value)."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item}: invalid YAML value: {e}") from None
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = dict(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for i, part in enumerate(path[:-1]):
            inner = node.get(part)
            if inner is not None and not isinstance(inner, dict):
                raise ConfigError(f"--set {item}: {'.'.join(path[: i + 1])} is not a mapping")
            node[part] = dict(inner or {})
            node = node[part]
        node[path[-1]] = value
    return out


def _blame(error: ConfigError, path, overrides: list[str]) -> str:
    """Where a bad value came from: the last ``--set`` item of its key, else the file."""
    if error.key:
        for item in reversed(overrides):
            key = item.split("=", 1)[0].strip()
            if key == error.key or key.startswith(f"{error.key}.") or error.key.startswith(f"{key}."):
                return f"--set {item}: "
    return f"{path}: " if path else ""


def load_train_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML file of :class:`TrainConfig` keys, apply ``key=value`` overrides, validate."""
    return load_config(TrainConfig, path, overrides)


def load_config(cls, path: str | Path | None = None, overrides: list[str] | None = None):
    """Read a YAML file (a missing file is an error), apply ``key=value`` overrides, and build
    dataclass ``cls`` strictly (:func:`from_dict`). An error names the ``--set`` item that gave
    the bad value, or else the file."""
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
        raise ConfigError(f"{_blame(e, path, overrides or [])}{e}", key=e.key) from None
