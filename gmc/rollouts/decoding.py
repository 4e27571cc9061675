"""Incremental decoding with a KV cache, the inner loop of :class:`gmc.rollouts.hf_engine.HFEngine` (the
rollouts of training and evaluation, method.md sections 4 and 5).

A decoder holds the cache of a batch of left-padded sequences and advances them together:

* ``prefill(ids, mask, copies)`` runs each distinct prompt once and repeats its cache
  ``copies`` times, so the G samples of a group share one prefill of their prompt;
* ``step(tokens)`` appends one token to every row and returns the next-token logits;
* ``keep(rows)`` drops rows whose answers have ended, so the batch shrinks as they finish.

:class:`Qwen3Decoder` is a lean forward pass for Qwen3-architecture models (every model this
project trains), written on the module's own weights with a preallocated cache and fused
projections: the arithmetic of the Hugging Face forward (float32 logits agree within 1e-4,
tested) without its per-call dispatch, which dominates decoding on CPU. :class:`HFDecoder`
runs any other causal LM through its own forward and cache. :func:`make_decoder` picks.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from gmc.policy.model import head_logits, position_ids_from_mask


class Decoder(Protocol):
    def prefill(self, ids: Tensor, mask: Tensor, copies: int = 1) -> Tensor: ...

    def step(self, tokens: Tensor) -> Tensor: ...

    def keep(self, rows: Tensor) -> None: ...


class HFDecoder:
    """Any Hugging Face causal LM, through its own forward and dynamic cache; with ``fp32_head``,
    through its decoder and an FP32 LM head (:func:`gmc.policy.model.head_logits`)."""

    def __init__(self, model, fp32_head: bool = False):
        self.model, self.fp32_head = model, fp32_head

    def _logits(self, **inputs) -> tuple[Tensor, object]:
        """The last position's logits and the cache after ``inputs``."""
        if not self.fp32_head:
            out = self.model(**inputs, use_cache=True, logits_to_keep=1)
            return out.logits[:, -1], out.past_key_values
        out = self.model.get_decoder()(**inputs, use_cache=True)
        return head_logits(
            out.last_hidden_state[:, -1], self.model.get_output_embeddings().weight, True
        ), out.past_key_values

    def prefill(self, ids: Tensor, mask: Tensor, copies: int = 1) -> Tensor:
        logits, self.cache = self._logits(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
        self.mask = mask
        self.positions = mask.sum(-1, keepdim=True)
        rows = torch.arange(ids.shape[0], device=ids.device).repeat_interleave(copies)
        if copies > 1:
            self.keep(rows)
        return logits[rows]

    def step(self, tokens: Tensor) -> Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        logits, self.cache = self._logits(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=self.mask,
            position_ids=self.positions,
            past_key_values=self.cache,
        )
        self.positions = self.positions + 1
        return logits

    def keep(self, rows: Tensor) -> None:
        self.cache.reorder_cache(rows)
        self.mask, self.positions = self.mask[rows], self.positions[rows]


def _rms_norm(x: Tensor, norm) -> Tensor:
    """``Qwen3RMSNorm``: normalise in float32, scale in the input's dtype."""
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Qwen3Decoder:
    """Qwen3 decoding on the model's own weights with a preallocated KV cache of ``capacity``
    positions (prompt plus new tokens). The fused q/k/v and gate/up weights are built when the
    decoder is made, so make one per decoding pass: the trainer changes the weights between."""

    @staticmethod
    def supports(model) -> bool:
        c = model.config
        return (
            c.model_type == "qwen3"
            and not getattr(c, "attention_bias", False)
            and c.hidden_act == "silu"
            and all(t == "full_attention" for t in (getattr(c, "layer_types", None) or ["full_attention"]))
            and (getattr(c, "rope_parameters", None) or {}).get("rope_type", "default") not in ("dynamic", "longrope")
            and getattr(model.get_output_embeddings(), "bias", None) is None
        )

    def __init__(self, model, capacity: int, fp32_head: bool = False):
        c = model.config
        self.fp32_head = fp32_head
        inner = model.get_decoder()
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.embed, self.norm, self.layers, self.rotary = inner.embed_tokens, inner.norm, inner.layers, inner.rotary_emb
        self.head = model.get_output_embeddings().weight
        self.qkv = [
            torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight])
            for layer in self.layers
        ]
        self.gate_up = [torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]) for layer in self.layers]
        # q and k heads are normalised in one call: one weight row per head
        self.qk_norm = [
            torch.cat(
                [
                    layer.self_attn.q_norm.weight.expand(self.heads, -1),
                    layer.self_attn.k_norm.weight.expand(self.kv_heads, -1),
                ]
            )
            for layer in self.layers
        ]
        self.capacity = capacity

    def prefill(self, ids: Tensor, mask: Tensor, copies: int = 1) -> Tensor:
        n, P = ids.shape
        if P >= self.capacity:
            raise ValueError(f"prompt length {P} leaves no room in a cache of {self.capacity} positions")
        shape = (n, self.kv_heads, self.capacity, self.head_dim)
        self.keys = [self.head.new_zeros(shape) for _ in self.layers]
        self.values = [self.head.new_zeros(shape) for _ in self.layers]
        self.valid = torch.zeros(n, self.capacity, dtype=torch.bool, device=ids.device)
        self.valid[:, :P] = mask.bool()
        positions = position_ids_from_mask(mask)
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
        # a padding query attends to itself alone: its output is never read, and never NaN
        attend = (causal & self.valid[:, None, :P]) | torch.eye(P, dtype=torch.bool, device=ids.device)
        logits = self._forward(ids, positions, attend.unsqueeze(1), start=0)
        self.length, self.positions = P, positions[:, -1:] + 1
        rows = torch.arange(n, device=ids.device).repeat_interleave(copies)
        if copies > 1:
            self.keep(rows)
        return logits[rows]

    def step(self, tokens: Tensor) -> Tensor:
        start = self.length
        if start >= self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; no room for another token")
        self.valid[:, start] = True
        logits = self._forward(tokens.unsqueeze(-1), self.positions, self.valid[:, None, None, : start + 1], start)
        self.length, self.positions = start + 1, self.positions + 1
        return logits

    def keep(self, rows: Tensor) -> None:
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.valid, self.positions = self.valid[rows], self.positions[rows]

    def _forward(self, ids: Tensor, positions: Tensor, attend: Tensor, start: int) -> Tensor:
        """Logits of the last position of ``ids [N, q]``; writes the cache at ``start : start+q``."""
        N, q = ids.shape
        end = start + q
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        x = self.embed(ids)
        freqs = positions.unsqueeze(-1).float() * self.rotary.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * self.rotary.attention_scaling).to(x.dtype).unsqueeze(1)
        sin = (emb.sin() * self.rotary.attention_scaling).to(x.dtype).unsqueeze(1)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            qkv = F.linear(_rms_norm(x, layer.input_layernorm), self.qkv[i]).view(N, q, H + 2 * KV, D)
            qk = self.qk_norm[i] * F.rms_norm(qkv[:, :, : H + KV].float(), (D,), eps=attn.q_norm.variance_epsilon).to(
                x.dtype
            )
            qs, ks = _rotate(qk.transpose(1, 2), cos, sin).split([H, KV], dim=1)
            self.keys[i][:, :, start:end] = ks
            self.values[i][:, :, start:end] = qkv[:, :, H + KV :].transpose(1, 2)
            out = F.scaled_dot_product_attention(
                qs,
                self.keys[i][:, :, :end],
                self.values[i][:, :, :end],
                attn_mask=attend,
                scale=attn.scaling,
                enable_gqa=True,
            )
            x = x + attn.o_proj(out.transpose(1, 2).reshape(N, q, H * D))
            gate, up = F.linear(_rms_norm(x, layer.post_attention_layernorm), self.gate_up[i]).chunk(2, dim=-1)
            x = x + layer.mlp.down_proj(F.silu(gate) * up)
        return head_logits(_rms_norm(x[:, -1], self.norm), self.head, self.fp32_head)


def make_decoder(model, capacity: int, fp32_head: bool = False) -> Decoder:
    """The lean Qwen3 decoder where the architecture allows, else the model's own forward;
    ``fp32_head``: the LM head in float32 whatever the autocast."""
    if Qwen3Decoder.supports(model):
        return Qwen3Decoder(model, capacity, fp32_head)
    return HFDecoder(model, fp32_head)
