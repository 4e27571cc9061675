"""The memory plan of a training run (method.md section 7): the predicted peak per phase on the
training device, item by item, for a config's model, token budget, dtypes, optimizer, vLLM share
and sleep mode; a run refuses to start when it does not fit (:func:`check_fits`).

Phases: *training* (forward/backward of one micro-batch of at most ``micro_batch_tokens`` padded
tokens, the optimizer's states resident; vLLM asleep or holding its share) and *generation*
(weights and optimizer states resident, gradients freed, vLLM awake). Items, in bytes:

- parameters ``P x 4`` (float32, or float32 masters below it) or ``P x 2`` (in place);
- gradients, as the parameters;
- optimizer states: AdamW two moments in the parameters' dtype; 8-bit AdamW 2 bytes per parameter;
- autocast copies of the weights in the compute dtype (masters below float32): ``P x 2``;
- saved activations: with checkpointing each layer's float32 input and the final norm's,
  ``tokens x (12 + 4 H (L + 2))`` (exact: ``tests/test_memory.py`` counts what autograd saves);
  without, ``L`` times the per-layer set below;
- the layer recomputed in backward under checkpointing: ``tokens x (20 H + 10 q + 8 kv + 8 I)``
  with ``q``, ``kv`` the query and key widths (the tensors one Qwen3 layer saves under bfloat16
  autocast with flash attention; an estimate, measured on a GPU by ``bench/gpu.sh``);
- one LM-head chunk: ``logprob_chunk_size x vocab x 4 x 3`` (float32 logits, their softmax and
  gradient); the chunk and the recomputed layer are not alive together, so the larger counts;
- a frozen KL reference on the device (``estimator.kl_coef > 0``), as the parameters;
- vLLM: ``gpu_memory_utilization`` of the device when awake, about 1 GiB asleep (sleep level 1:
  weights in host memory, KV cache freed);
- the CUDA context and allocator slack: 1 GiB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gmc.preflight import looks_local

GIB = 2**30
RUNTIME_BYTES = 1 * GIB
"""CUDA context, kernels and allocator slack."""
VLLM_ASLEEP_BYTES = 1 * GIB
"""What vLLM keeps on the device at sleep level 1 (CUDA graphs, buffers)."""

KNOWN_SHAPES: dict[str, dict] = {
    "Qwen/Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "Qwen/Qwen3-1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "Qwen/Qwen3-4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "Qwen/Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}
"""``config.json`` fields of the Qwen3 models the presets name, so a plan needs no download."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a Qwen3-architecture model's ``config.json``."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool

    @classmethod
    def of(cls, model: str) -> ModelShape:
        """The shape of a local model folder (its ``config.json``) or of a known hub id."""
        if looks_local(model):
            config = json.loads((Path(model) / "config.json").read_text())
        elif model in KNOWN_SHAPES:
            config = KNOWN_SHAPES[model]
        else:
            raise ValueError(f"model {model!r}: no config.json to plan its memory from (a local folder, or one of "
                             f"{sorted(KNOWN_SHAPES)})")
        config = {**config, "head_dim": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]}
        return cls(**{k: config[k] for k in cls.__dataclass_fields__})

    @property
    def parameters(self) -> int:
        """Parameters of a ``Qwen3ForCausalLM`` of this shape (embedding, layers, final norm, head)."""
        H, mlp, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        layer = H * q + 2 * H * kv + q * H + 2 * hd + 3 * H * mlp + 2 * H
        head = 0 if self.tie_word_embeddings else self.vocab_size * H
        return self.vocab_size * H + self.num_hidden_layers * layer + H + head

    def saved_per_token(self, checkpointing: bool) -> int:
        """Bytes autograd keeps per token of a micro-batch between forward and backward."""
        H, L = self.hidden_size, self.num_hidden_layers
        if checkpointing:
            return 12 + 4 * H * (L + 2)
        return 12 + 4 * H * 2 + L * self.recomputed_per_token

    @property
    def recomputed_per_token(self) -> int:
        """Bytes one layer saves per token under bfloat16 autocast (an estimate, see the module docstring)."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return 20 * self.hidden_size + 10 * q + 8 * kv + 8 * self.intermediate_size


@dataclass(frozen=True)
class Plan:
    """Predicted bytes per item and phase, against the device's ``limit``."""

    items: dict[str, tuple[int, int]]
    """Item -> (training bytes, generation bytes)."""
    limit: int | None
    keys: dict[str, str]
    """Item -> the config keys that shrink it."""

    @property
    def training(self) -> int:
        return sum(t for t, _ in self.items.values())

    @property
    def generation(self) -> int:
        return sum(g for _, g in self.items.values())

    @property
    def peak(self) -> int:
        return max(self.training, self.generation)

    @property
    def fits(self) -> bool:
        return self.limit is None or self.peak <= self.limit

    def table(self) -> str:
        """The plan as a text table in GiB."""
        width = max(map(len, self.items)) + 2
        lines = [f"{'item':<{width}}{'training':>10}{'generation':>12}  GiB"]
        lines += [f"{name:<{width}}{t / GIB:>10.2f}{g / GIB:>12.2f}" for name, (t, g) in self.items.items()]
        lines.append(f"{'total':<{width}}{self.training / GIB:>10.2f}{self.generation / GIB:>12.2f}")
        if self.limit is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(f"device {self.limit / GIB:.1f} GiB: {verdict} (peak {self.peak / GIB:.2f} GiB)")
        return "\n".join(lines)

    def advice(self) -> str:
        """The largest items of the peak phase and the keys that shrink them."""
        phase = 0 if self.training >= self.generation else 1
        ranked = sorted(self.items.items(), key=lambda kv: -kv[1][phase])
        return "; ".join(f"{name} {b[phase] / GIB:.1f} GiB ({self.keys[name]})" for name, b in ranked[:4]
                         if name in self.keys and b[phase] > 0)


def device_limit(cfg, gib: float | None = None) -> int | None:
    """The bytes the plan of :class:`gmc.config.TrainConfig` ``cfg`` must fit: ``gib`` when given,
    else its ``memory_limit_gib``, else the total memory of its CUDA device; None on a CPU without
    either."""
    gib = gib or cfg.memory_limit_gib
    if gib:
        return int(gib * GIB)
    import torch

    from gmc.policy import resolve_device

    device = resolve_device(cfg.device)
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def plan(cfg, device_bytes: int | None = None, shape: ModelShape | None = None) -> Plan:
    """The memory plan of :class:`gmc.config.TrainConfig` ``cfg`` against ``device_bytes`` (the
    limit; None: no limit), for ``shape`` (default: read from ``cfg.model``)."""
    shape = shape or ModelShape.of(cfg.model)
    P = shape.parameters
    param_bytes = 4 if (cfg.model_dtype == "float32" or cfg.master_weights) else 2
    below = cfg.model_dtype != "float32"
    optimizer = cfg.optimizer if cfg.optimizer != "auto" else "adamw8bit"  # auto on CUDA
    optim = 2 * P if optimizer == "adamw8bit" else 2 * P * param_bytes
    tokens = cfg.micro_batch_tokens or (cfg.prompts_per_step * cfg.group_size * (cfg.sampling.max_new_tokens + 512))
    ckpt = cfg.gradient_checkpointing
    saved = tokens * shape.saved_per_token(ckpt)
    transient = max(cfg.logprob_chunk_size * shape.vocab_size * 4 * 3,
                    tokens * shape.recomputed_per_token if ckpt else 0)
    vllm_awake = int(cfg.vllm.gpu_memory_utilization * device_bytes) if cfg.engine == "vllm" and device_bytes else 0
    vllm_training = (VLLM_ASLEEP_BYTES if cfg.vllm.sleep else vllm_awake) if cfg.engine == "vllm" else 0
    reference = P * param_bytes if cfg.estimator.kl_coef > 0 and cfg.reference_device == "auto" else 0
    items = {
        "parameters": (P * param_bytes, P * param_bytes),
        "gradients": (P * param_bytes, 0),
        "optimizer states": (optim, optim),
        "autocast weight copies": (P * 2 if below and cfg.master_weights else 0, 0),
        "saved activations": (saved, 0),
        "LM-head chunk or recomputed layer": (transient, 0),
        "KL reference": (reference, reference),
        "vLLM": (vllm_training, vllm_awake),
        "CUDA runtime": (RUNTIME_BYTES, RUNTIME_BYTES),
    }
    keys = {
        "parameters": "master_weights, model_dtype",
        "gradients": "master_weights",
        "optimizer states": "optimizer: adamw8bit",
        "autocast weight copies": "model_dtype",
        "saved activations": "micro_batch_tokens, gradient_checkpointing: true",
        "LM-head chunk or recomputed layer": "logprob_chunk_size, micro_batch_tokens",
        "KL reference": "reference_device: cpu",
        "vLLM": "vllm.sleep: true, vllm.gpu_memory_utilization",
    }
    return Plan(items, device_bytes, keys)


class MemoryPlanError(RuntimeError):
    """A run's memory plan exceeds its device; the message names the keys that would bring it under."""


def check_fits(p: Plan) -> None:
    if not p.fits:
        raise MemoryPlanError(f"the memory plan needs {p.peak / GIB:.3g} GiB, more than the device's "
                              f"{p.limit / GIB:.3g} GiB; largest items: {p.advice()} "
                              f"(gmc plan-memory prints the whole plan)")
