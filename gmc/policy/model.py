"""The policy: loading a causal LM and memory-aware token log-probs.

``token_logprobs_from_hidden`` computes ``log softmax(h W^T / temperature)[y]`` without
materialising a ``[N, T, vocab]`` float32 log-softmax: the LM head and the log-softmax run over
chunks of positions under activation checkpointing, so peak memory grows with the chunk, not
the vocabulary times the sequence (the passes over rollouts that use it are in
:mod:`gmc.policy.logprobs`).

The tiny CPU policy is built in ``gmc.run.tiny_model``.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from gmc.policy.preflight import MODEL_KEY, check_model_dir, hub_reachable, looks_local

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_policy(
    name_or_path: str, dtype: str = "float32", device: str = "auto", gradient_checkpointing: bool | int = False
):
    """Load ``(model, tokenizer)`` by hub name or local path; the tokenizer pads on the left.
    ``gradient_checkpointing``: True checkpoints every decoder layer, a number that many (the
    first ones, :func:`checkpoint_layers`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"model dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    check_model_dir(name_or_path)  # a local folder lacking weights or tokenizer is named before loading
    cache_only = not looks_local(name_or_path) and not hub_reachable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=cache_only)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype], local_files_only=cache_only)
    except OSError as e:
        why = "not a local folder, not in the Hugging Face cache, and the hub cannot be reached" if cache_only else e
        raise OSError(
            f"cannot load model {name_or_path!r}: {why}. Name a local folder instead ({MODEL_KEY}; "
            "`gmc build-tiny-model --out FOLDER` makes one)."
        ) from e
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    checkpoint_layers(model, None if gradient_checkpointing is True else int(gradient_checkpointing))
    return model.to(resolve_device(device)), tokenizer


def checkpoint_layers(model, count: int | None = None) -> None:
    """Checkpoint the first ``count`` of ``model``'s decoder layers (None: all of them): each
    keeps only its input for the backward pass, which runs its forward again; the others keep
    what their backward needs. A layer's gradient is the same either way."""
    if count == 0:
        return
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    for layer in model.get_decoder().layers[count:] if count is not None else ():
        layer.gradient_checkpointing = False


def compile_layers(model) -> None:
    """``torch.compile`` each of ``model``'s decoder layers in place, with dynamic shapes (the
    micro-batches' canonical lengths vary): a layer's many small kernels fused into few on a GPU,
    its numerics those of the eager layer up to the fused kernels' rounding; the first passes of a
    run pay the compilation. The HF engine's decoder calls the layers' weights, not the layers."""
    for layer in model.get_decoder().layers:
        layer.compile(dynamic=True)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that start at 0 on the first real token of each left-padded row."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def head_logits(hidden: Tensor, head_weight: Tensor, fp32: bool = False) -> Tensor:
    """``hidden @ W^T``: in the dtype autocast gives it, or with ``fp32`` in float32 whatever the
    autocast (an FP32 LM head: TRL's ``cast_lm_head_to_fp32``, AReaL's ``enable_fp32_lm_head``,
    vLLM's ``head_dtype``), so that trainer and sampler round logits alike."""
    if not fp32:
        return hidden @ head_weight.T
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return hidden.float() @ head_weight.float().T


def _chunk_logprobs(
    head_weight: Tensor, hidden: Tensor, targets: Tensor, temperature: float, fp32_head: bool = False
) -> Tensor:
    logits = head_logits(hidden, head_weight, fp32_head).float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_logprobs_from_hidden(
    head_weight: Tensor,
    hidden: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    fp32_head: bool = False,
) -> Tensor:
    """``log softmax(hidden @ W^T / temperature)[targets]`` for ``hidden [N, T, H]``, float32
    ``[N, T]``, computed ``chunk_size`` positions at a time (checkpointed when it needs a gradient);
    ``fp32_head``: the matmul in float32 (:func:`head_logits`)."""
    N, T, H = hidden.shape
    flat_h, flat_t = hidden.reshape(N * T, H), targets.reshape(N * T)
    pieces = []
    for start in range(0, N * T, chunk_size):
        h, t = flat_h[start : start + chunk_size], flat_t[start : start + chunk_size]
        if torch.is_grad_enabled() and (h.requires_grad or head_weight.requires_grad):
            pieces.append(checkpoint(_chunk_logprobs, head_weight, h, t, temperature, fp32_head, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(head_weight, h, t, temperature, fp32_head))
    return torch.cat(pieces).reshape(N, T)


def parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
