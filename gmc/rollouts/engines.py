"""Rollout engines by name: their settings and how to build them (method.md sections 4 and 5).

:data:`ENGINES` is the one place an engine is registered: ``engine:`` in a train or evaluate
config names an entry, whose ``make`` names the factory that builds the engine (in
its own module, imported only then, so reading a config needs no torch) and whose
``settings`` class is the config section of the same name (``vllm:``). The sampling settings
every engine takes are :class:`SamplingConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from gmc.settings import ConfigError, Fraction, NonNegative, PositiveInt, load_named, settings

Dtype = Literal["float32", "bfloat16", "float16"]


@settings(prefix="sampling.")
class SamplingConfig:
    """Sampling settings. Training rollouts use temperature 1 and top_p 1 (method.md section 4)."""

    temperature: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)] = 1.0
    """In [0, 10]; 0 is greedy decoding (evaluation; training rollouts need > 0)."""
    top_p: Fraction = 1.0
    """Nucleus sampling threshold in (0, 1]; 1 samples from the whole distribution."""
    max_new_tokens: PositiveInt = 48
    """Token limit of a response; in training also the constant divisor of the ``seq_sum_const``
    aggregation (:mod:`gmc.policy.update` passes it to the loss). The one home of the limit."""
    dtype: Dtype | None = None
    """Training rollouts of the HF engine: the dtype it samples in, under autocast (a
    ``bfloat16`` sampler beside a ``float32`` trainer makes the sampler/trainer mismatch of an
    inference engine real on any machine, method.md section 3); None: the trainer's
    ``model_dtype``. vLLM samples in ``vllm.dtype``."""


@settings(prefix="hf.")
class HFConfig:
    """Settings of the HF engine (``engine: hf``); vLLM ignores them."""

    token_seconds: NonNegative = 0.0
    """Wall-clock seconds added to every decoding step: a stand-in for a slower model, so that a
    benchmark of overlap (``bench/asynchrony.py``) sees generation dominate on any machine; 0: none."""


@settings(prefix="vllm.")
class VLLMConfig:
    """Settings of the vLLM engine (``engine: vllm``, in training and evaluation); the HF engine
    ignores them."""

    gpu_memory_utilization: Fraction = 0.35
    """Share of the GPU's memory vLLM takes for its weights and KV cache; the trainer (policy,
    gradients, optimizer state) needs the rest. Ignored on CPU, where vLLM sizes its KV cache
    by ``VLLM_CPU_KVCACHE_SPACE`` (GiB)."""
    sleep: bool = False
    """Sleep mode (CUDA only): before every update vLLM discards its weights and KV cache
    (``LLM.sleep(level=2)``: the weights are reloaded after the update anyway) while the trainer
    holds the GPU; the weights wake for the reload, the KV cache for the next generation, each
    after the trainer's cached blocks went back to the driver."""
    max_model_len: PositiveInt | None = None
    """Longest prompt plus answer in tokens; None: the model's own limit."""
    enforce_eager: bool = False
    """Run the model eagerly (no compilation, no CUDA graphs): slower decoding, quicker start."""
    dtype: Dtype | None = None
    """vLLM's dtype; None: the dtype of the trainer's model."""


@dataclass(frozen=True)
class Engine:
    """A registered rollout engine."""

    make: str
    """``module:function`` of its factory, imported when an engine is made (so that reading a
    config needs no torch): ``function(model, tokenizer, model_path, seed, settings, dtype, fp32_head)``
    gives the engine for the policy ``model`` (loaded from ``model_path``) with its ``settings``
    (None without a settings class) in the compute ``dtype``."""
    label: str
    """Name in reports."""
    devices: tuple[str, ...]
    """Device types it runs on."""
    settings: type | None = None
    """Its settings class; a train or evaluate config holds them under the engine's name."""
    shares_model: bool = False
    """It samples with the trainer's own module (no copy of the weights: nothing to sync, and
    generation runs under the trainer's autocast); otherwise it holds its own copy, updated by
    ``sync_weights`` after every optimizer step."""
    own_threads: bool = False
    """It runs threads of its own in the process (vLLM's engine core, CUDA's): the grading pool
    of a process that holds it starts its workers from a forkserver rather than by forking that
    process (:data:`gmc.tasks.grading.StartMethod`)."""

    @property
    def grading_start(self) -> str:
        """The start method of the grading pool beside this engine."""
        return "forkserver" if self.own_threads else "fork"


ENGINES: dict[str, Engine] = {
    "hf": Engine(
        "gmc.rollouts.hf_engine:hf_engine",
        "Hugging Face KV-cache decoding",
        ("cpu", "cuda"),
        settings=HFConfig,
        shares_model=True,
    ),
    "vllm": Engine(
        "gmc.rollouts.vllm_engine:vllm_engine", "vLLM", ("cuda", "cpu"), settings=VLLMConfig, own_threads=True
    ),
}
"""Every rollout engine by config name (``engine``); the one place to add one. ``vllm`` runs on
CPU only with vLLM's CPU build (``make test-vllm``)."""


def make_engine(
    name: str,
    model,
    tokenizer,
    model_path: str | None = None,
    seed: int = 0,
    settings=None,
    dtype: str | None = None,
    fp32_head: bool = False,
):
    """The engine ``name`` for ``model`` (see :class:`Engine`); ``settings`` default to the
    engine's settings class's defaults; ``fp32_head``: its LM head in float32."""
    if name not in ENGINES:
        raise ConfigError(f"unknown rollout engine {name!r}; known: {list(ENGINES)}", "engine")
    entry = ENGINES[name]
    if entry.settings is not None:
        settings = settings if settings is not None else entry.settings()
    if not entry.shares_model and model_path is None:
        raise ValueError(f"the {name} engine loads its own copy of the weights: it needs model_path")
    return load_named(entry.make)(model, tokenizer, model_path, seed, settings, dtype, fp32_head)
