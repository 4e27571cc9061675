"""The memory plan of a training run (method.md section 7): the predicted peak per phase on the
training device, item by item, for a config's model, token budget, dtypes, optimizer, vLLM share
and sleep mode; a run refuses to start when it does not fit (:func:`check_fits`).

Phases: *training* (forward/backward of one micro-batch of at most ``micro_batch_tokens`` padded
tokens, the optimizer's states resident; vLLM asleep or holding its share), *generation*
(weights and optimizer states resident, gradients freed and their cached blocks returned to the
driver before vLLM wakes, vLLM awake, the trainer's behaviour pass over the new groups) and
*resume* (a start or resume before vLLM's first sleep: vLLM awake as built, the weights and,
on resume, the optimizer's states loaded; the checkpoint itself is read into host memory,
:func:`checkpoint_host_bytes`, and its queued rollouts stay there). The limit is the device memory free when the run starts (or
``memory_limit_gib``). Items, in bytes:

- parameters ``P x 4`` (float32, or float32 masters below it) or ``P x 2`` (in place, or live
  beside the optimizer's masters);
- the optimizer's float32 masters (``master_weights: optimizer``): ``P x 4``;
- gradients, as the parameters (the masters' float32 gradients are made one tensor at a time
  after the backward pass, each live gradient freed as its copy is made);
- optimizer states: AdamW two moments in the dtype of what it steps; 8-bit AdamW 2 bytes per parameter;
- autocast copies of the weights in the compute dtype (masters below float32): ``P x 2``;
- saved activations (as under autocast over float32 masters: with bfloat16 live weights, whose
  residual stream is bfloat16, an upper bound): with checkpointing each layer's float32 input and the final norm's,
  ``tokens x (12 + 4 H (L + 2))`` (exact: ``tests/policy/test_memory.py`` counts what autograd saves);
  without, ``L`` times the per-layer set below; with ``k`` of the ``L`` layers checkpointed,
  ``tokens x (12 + 4 H (k + 2) + (L - k) x`` the per-layer set``)``;
- the layer recomputed in backward under checkpointing: ``tokens x (20 H + 10 q + 8 kv + 8 I)``
  with ``q``, ``kv`` the query and key widths (the tensors one Qwen3 layer saves under bfloat16
  autocast with flash attention; an estimate, measured on a GPU by ``bench/gpu.sh``);
- one LM-head chunk: ``logprob_chunk_size x vocab x 4 x 3`` (float32 logits, their softmax and
  gradient), and below float32 masters the head's weight gradient in the compute dtype with its
  float32 copy added to the masters' gradient, ``vocab x H x 6``; the LM head and the
  recomputed layer are not alive together, so the larger counts;
- the behaviour pass, in the generation phase (the trainer's no-grad log-prob pass over the
  new groups while vLLM is awake, ``behaviour_logprobs: trainer``): one layer's transients
  ``tokens x (12 H + 4 q + 4 kv + 6 I)`` or the LM-head chunk's float32 logits and log-softmax
  ``logprob_chunk_size x vocab x 8``, the larger, plus below float32 masters the widest weight
  cast to the compute dtype (the pass casts each weight where it is used, autocast's cache off:
  no copy of every weight, :func:`gmc.policy.logprobs.sequence_logprobs`);
- a frozen KL reference on the device (``estimator.kl_coef > 0``), as the parameters;
- vLLM: ``gpu_memory_utilization`` of the device when awake (its CUDA graphs included: vLLM
  profiles them inside its share), about 2 GiB asleep (sleep level 2: weights and KV cache
  discarded; its CUDA graphs and buffers stay);
- the CUDA context: 1 GiB;
- the caching allocator's reserve: blocks cached but not in use and fragmentation,
  :data:`ALLOCATOR_RESERVE` of what PyTorch holds in the phase (3.2 GiB for the paper preset's
  update; an estimate, measured on a GPU by ``bench/gpu.sh``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gmc.policy.preflight import looks_local

GIB = 2**30
RUNTIME_BYTES = 1 * GIB
"""CUDA context and kernels."""
VLLM_ASLEEP_BYTES = 2 * GIB
"""What vLLM keeps on the device asleep (CUDA graphs, buffers)."""
ALLOCATOR_RESERVE = 0.06
"""Share of the bytes PyTorch holds in a phase that its caching allocator keeps on top (cached
free blocks, fragmentation between micro-batches of different shapes)."""
PHASES = ("training", "generation", "resume")
AUTO_MARGIN = 0.05
"""Share of the device ``gradient_checkpointing: auto`` keeps free beyond its plan: what it
trades for fewer recomputed layers is sized by estimates (a layer's saved tensors, the
allocator's reserve) until the GPU check measures them."""

KNOWN_SHAPES: dict[str, dict] = {
    "Qwen/Qwen3-0.6B": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen/Qwen3-1.7B": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen/Qwen3-4B": dict(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen/Qwen3-8B": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
    ),
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
            raise ValueError(
                f"model {model!r}: no config.json to plan its memory from (a local folder, or one of "
                f"{sorted(KNOWN_SHAPES)})"
            )
        config = {
            **config,
            "head_dim": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        }
        return cls(**{k: config[k] for k in cls.__dataclass_fields__})

    @property
    def parameters(self) -> int:
        """Parameters of a ``Qwen3ForCausalLM`` of this shape (embedding, layers, final norm, head)."""
        H, mlp, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        layer = H * q + 2 * H * kv + q * H + 2 * hd + 3 * H * mlp + 2 * H
        head = 0 if self.tie_word_embeddings else self.vocab_size * H
        return self.vocab_size * H + self.num_hidden_layers * layer + H + head

    def saved_per_token(self, checkpointed: int) -> int:
        """Bytes autograd keeps per token of a micro-batch between forward and backward with
        ``checkpointed`` of the layers checkpointed (each keeps its float32 input; the others
        all that their backward needs, :attr:`recomputed_per_token`)."""
        H, L = self.hidden_size, self.num_hidden_layers
        return 12 + 4 * H * 2 + 4 * H * checkpointed + (L - checkpointed) * self.recomputed_per_token

    @property
    def no_grad_layer_per_token(self) -> int:
        """Bytes one layer's no-grad forward holds per token at its widest: the float32 residual
        in and out, the normed input and attention output, q, k and v, and the MLP's gate, up
        and product in the compute dtype (an estimate, measured on a GPU by ``bench/gpu.sh``)."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return 12 * self.hidden_size + 4 * q + 4 * kv + 6 * self.intermediate_size

    @property
    def recomputed_per_token(self) -> int:
        """Bytes one layer saves per token under bfloat16 autocast (an estimate, see the module docstring)."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return 20 * self.hidden_size + 10 * q + 8 * kv + 8 * self.intermediate_size


@dataclass(frozen=True)
class Plan:
    """Predicted bytes per item and phase (:data:`PHASES`), against the device's ``limit``."""

    items: dict[str, tuple[int, int, int]]
    """Item -> (training, generation, resume) bytes."""
    limit: int | None
    keys: dict[str, str]
    """Item -> the config keys that shrink it."""
    checkpointed_layers: int = 0
    """How many of the decoder's layers the update checkpoints (``auto`` resolved)."""

    @property
    def gradient_checkpointing(self) -> bool:
        return self.checkpointed_layers > 0

    def total(self, phase: str) -> int:
        return sum(b[PHASES.index(phase)] for b in self.items.values())

    @property
    def training(self) -> int:
        return self.total("training")

    @property
    def generation(self) -> int:
        return self.total("generation")

    @property
    def resume(self) -> int:
        return self.total("resume")

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self.total)

    @property
    def peak(self) -> int:
        return self.total(self.peak_phase)

    @property
    def fits(self) -> bool:
        return self.limit is None or self.peak <= self.limit

    def table(self) -> str:
        """The plan as a text table in GiB."""
        width = max(map(len, self.items)) + 2
        lines = [f"{'item':<{width}}" + "".join(f"{p:>12}" for p in PHASES) + "  GiB"]
        lines += [
            f"{name:<{width}}" + "".join(f"{b / GIB:>12.2f}" for b in bytes_) for name, bytes_ in self.items.items()
        ]
        lines.append(f"{'total':<{width}}" + "".join(f"{self.total(p) / GIB:>12.2f}" for p in PHASES))
        if self.limit is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(
                f"device {self.limit / GIB:.1f} GiB free: {verdict} (peak {self.peak / GIB:.2f} GiB, {self.peak_phase})"
            )
        return "\n".join(lines)

    def advice(self) -> str:
        """The largest items of the peak phase and the keys that shrink them."""
        phase = PHASES.index(self.peak_phase)
        ranked = sorted(self.items.items(), key=lambda kv: -kv[1][phase])
        return "; ".join(
            f"{name} {b[phase] / GIB:.1f} GiB ({self.keys[name]})"
            for name, b in ranked[:4]
            if name in self.keys and b[phase] > 0
        )


def device_limit(cfg, gib: float | None = None) -> int | None:
    """The bytes the plan of :class:`gmc.run.config.TrainConfig` ``cfg`` must fit: ``gib`` when given,
    else its ``memory_limit_gib``, else the memory of its CUDA device free now (what other
    processes hold is not the run's) plus what this process's allocator already caches; None on
    a CPU without either."""
    gib = gib or cfg.memory_limit_gib
    if gib:
        return int(gib * GIB)
    import torch

    from gmc.policy.model import resolve_device

    device = resolve_device(cfg.device)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device)


def plan(cfg, device_bytes: int | None = None, shape: ModelShape | None = None) -> Plan:
    """The memory plan of :class:`gmc.run.config.TrainConfig` ``cfg`` against ``device_bytes`` (the
    limit; None: no limit), for ``shape`` (default: read from ``cfg.model``). With
    ``gradient_checkpointing: auto`` the update checkpoints the fewest layers with which the plan
    leaves :data:`AUTO_MARGIN` of the device free (none where everything fits; all where nothing
    else does): each checkpointed layer costs one more forward of itself in the backward, so a
    larger card recomputes less."""
    shape = shape or ModelShape.of(cfg.model)
    L = shape.num_hidden_layers
    if cfg.gradient_checkpointing == "auto":
        for k in range(L + 1):
            candidate = _plan(cfg, device_bytes, shape, k)
            if device_bytes is None or candidate.peak <= (1 - AUTO_MARGIN) * device_bytes:
                return candidate
        return candidate
    return _plan(cfg, device_bytes, shape, L if cfg.gradient_checkpointing else 0)


def _bytes(cfg, P: int) -> tuple[int, int, int]:
    """Bytes of the parameters, of the optimizer's float32 masters and of its states."""
    below = cfg.model_dtype != "float32"
    param_bytes = 4 if (not below or cfg.master_weights is True) else 2
    masters = 4 * P if below and cfg.master_weights == "optimizer" else 0
    optimizer = cfg.optimizer if cfg.optimizer != "auto" else "adamw8bit"  # auto on CUDA
    optim = 2 * P if optimizer == "adamw8bit" else 2 * P * (4 if masters else param_bytes)
    return P * param_bytes, masters, optim


def _plan(cfg, device_bytes: int | None, shape: ModelShape, checkpointed: int) -> Plan:
    P = shape.parameters
    params, masters, optim = _bytes(cfg, P)
    below = cfg.model_dtype != "float32"
    tokens = cfg.micro_batch_tokens or (cfg.prompts_per_step * cfg.group_size * (cfg.sampling.max_new_tokens + 512))
    saved = tokens * shape.saved_per_token(checkpointed)
    masters_below = below and cfg.master_weights is True  # float32 live weights under autocast
    head_weight_grad = shape.vocab_size * shape.hidden_size * 6 if masters_below else 0
    transient = max(
        cfg.logprob_chunk_size * shape.vocab_size * 4 * 3 + head_weight_grad,
        tokens * shape.recomputed_per_token if checkpointed else 0,
    )
    behaviour = (
        max(tokens * shape.no_grad_layer_per_token, cfg.logprob_chunk_size * shape.vocab_size * 8)
        + (shape.vocab_size * shape.hidden_size * 2 if masters_below else 0)
        if cfg.behaviour_logprobs == "trainer"
        else 0
    )
    vllm_awake = int(cfg.vllm.gpu_memory_utilization * device_bytes) if cfg.engine == "vllm" and device_bytes else 0
    vllm_training = (VLLM_ASLEEP_BYTES if cfg.vllm.sleep else vllm_awake) if cfg.engine == "vllm" else 0
    reference = params if cfg.estimator.kl_coef > 0 and cfg.reference_device == "auto" else 0
    items = {  # (training, generation, resume)
        "parameters": (params,) * 3,
        "float32 masters": (masters,) * 3,
        "gradients": (params, 0, 0),
        "optimizer states": (optim,) * 3,
        "autocast weight copies": (P * 2 if masters_below else 0, 0, 0),
        "saved activations": (saved, 0, 0),
        "LM-head chunk or recomputed layer": (transient, 0, 0),
        "behaviour pass": (0, behaviour, 0),
        "KL reference": (reference,) * 3,
    }
    held = [sum(b[k] for b in items.values()) for k in range(3)]
    items |= {
        "allocator reserve": tuple(int(ALLOCATOR_RESERVE * h) for h in held),
        "vLLM": (vllm_training, vllm_awake, vllm_awake),
        "CUDA runtime": (RUNTIME_BYTES,) * 3,
    }
    keys = {
        "parameters": "master_weights, model_dtype",
        "float32 masters": "master_weights: false",
        "gradients": "master_weights",
        "optimizer states": "optimizer: adamw8bit",
        "autocast weight copies": "model_dtype",
        "saved activations": "micro_batch_tokens, gradient_checkpointing: true",
        "LM-head chunk or recomputed layer": "logprob_chunk_size, micro_batch_tokens",
        "behaviour pass": "micro_batch_tokens, logprob_chunk_size, behaviour_logprobs: sampler",
        "KL reference": "reference_device: cpu",
        "vLLM": "vllm.sleep: true, vllm.gpu_memory_utilization",
    }
    return Plan(items, device_bytes, keys, checkpointed)


def checkpoint_host_bytes(cfg, shape: ModelShape | None = None) -> int:
    """Host memory a resume reads the checkpoint into: the float32 (or in-place) weights, the
    optimizer's states and the queued groups at most (``d`` step batches under a fixed delay,
    ``slots`` groups in the latency model, ``(max_staleness + 1) x prompts_per_step`` under Ray)
    of full-length answers: token ids, mask and two log-prob tensors, 17 bytes per padded token."""
    shape = shape or ModelShape.of(cfg.model)
    params, masters, optim = _bytes(cfg, shape.parameters)
    groups = {
        "fixed": cfg.delay.d * cfg.prompts_per_step,
        "latency": cfg.delay.slots,
        "ray": (cfg.delay.max_staleness + 1) * cfg.prompts_per_step,
    }.get(cfg.delay.mode, 0)
    return params + masters + optim + groups * cfg.group_size * cfg.sampling.max_new_tokens * 17


class MemoryPlanError(RuntimeError):
    """A run's memory plan exceeds its device; the message names the keys that would bring it under."""


def check_fits(p: Plan) -> None:
    if not p.fits:
        raise MemoryPlanError(
            f"the memory plan needs {p.peak / GIB:.3g} GiB, more than the device's "
            f"{p.limit / GIB:.3g} GiB; largest items: {p.advice()} "
            f"(gmc plan-memory prints the whole plan)"
        )
