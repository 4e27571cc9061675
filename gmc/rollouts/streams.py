"""What every rollout engine shares (method.md sections 4 and 5): ``engine.generate(prompts, n,
sampling)`` (:class:`RolloutEngine`) returns one group of ``n`` :class:`Sample` s per prompt, each
with its token ids, text, the sampler's log-probs of the distribution it sampled (after
temperature and top-p) and its finish reason. Every sample draws from its own random stream
(:func:`stream_keys`), and answers end at every end-of-turn id (:func:`end_token_ids`). The
engines are :class:`~gmc.rollouts.hf_engine.HFEngine` (any machine) and
:class:`~gmc.rollouts.vllm_engine.VLLMEngine` (GPUs), registered in
:data:`gmc.rollouts.engines.ENGINES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor

from gmc.rollouts.engines import SamplingConfig


@dataclass
class Sample:
    """One generated response."""

    token_ids: list[int]
    """Response tokens, EOS included when the response stopped there."""
    text: str
    """Decoded response, special tokens removed."""
    logprobs: list[float]
    """The sampler's log-prob of each response token."""
    finish_reason: Literal["stop", "length"]
    prompt_ids: list[int] = field(default_factory=list)
    versions: list[int] | None = None
    """The policy version that sampled each token, where the weights may change mid-answer
    (partial rollouts, :attr:`HFEngine.newer_weights`); None: one version for the whole call."""

    @property
    def length(self) -> int:
        return len(self.token_ids)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> list[list[Sample]]: ...

    def sync_weights(self, model) -> None: ...

    def release_memory(self) -> None:
        """Hand the device to the trainer until the next :meth:`sync_weights` (the trainer calls
        it before every update; the next generation comes after the sync)."""


# ---------------------------------------------------------------------------------------------
# random streams and end-of-turn ids

_MASK64 = (1 << 64) - 1


def _int64(x: int) -> int:
    """The two's-complement int64 of a 64-bit word."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


_GOLDEN, _M1, _M2 = _int64(0x9E3779B97F4A7C15), _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 words (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: Tensor) -> Tensor:
    """splitmix64 (Steele et al., 2014) on int64 tensors, products wrapping modulo 2**64: a
    bijection of 64-bit words whose outputs on a counter pass BigCrush."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def stream_keys(seed: int, call: int, prompts: Tensor, samples: Tensor) -> Tensor:
    """The int64 key of each sample's random stream: a hash of (run seed, engine call, prompt
    index, sample index); ``prompts`` and ``samples`` are int64 tensors of one shape.

    The HF engine draws the uniform of position ``t`` as a hash of (key, t)
    (:func:`stream_uniforms`), so a sample does not depend on which rows share its batch; the
    vLLM engine submits each sample as its own request seeded with its key. No two samples of a
    run share a stream, and an engine's whole random state is its call counter
    (:meth:`HFEngine.generator_state`), which a checkpoint keeps."""
    h = _mix(torch.full_like(prompts, _int64(seed)))
    for part in (torch.full_like(prompts, _int64(call)), prompts, samples):
        h = _mix(h ^ part)
    return h


def stream_uniforms(keys: Tensor, position: int) -> Tensor:
    """Uniform draws in (0, 1] (float32, 24 random bits) of position ``position`` of each stream."""
    bits = _shr(_mix(keys ^ position), 40)
    return (bits + 1).float() * 2.0**-24


def end_token_ids(tokenizer, model=None) -> set[int]:
    """Every id that ends an answer: the tokenizer's EOS, the model's
    ``generation_config.eos_token_id`` (an int or a list) and the chat template's end-of-turn
    token (the special token that follows an assistant message, e.g. Qwen3's ``<|im_end|>``)."""
    ids: set[int] = set()

    def add(value) -> None:
        if value is not None:
            ids.update(value if isinstance(value, (list, tuple)) else [value])

    add(tokenizer.eos_token_id)
    add(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    if getattr(tokenizer, "chat_template", None):
        marker = "GMC_END_OF_ANSWER"
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}], tokenize=False
            )
        except Exception:  # a template that cannot render an assistant turn names no end token
            text = ""
        if marker in text:
            after = tokenizer(text.split(marker, 1)[1], add_special_tokens=False)["input_ids"]
            if after and after[0] in set(tokenizer.all_special_ids):
                ids.add(after[0])
    if not ids:
        raise ValueError("the tokenizer and the model name no end-of-turn token (eos_token_id)")
    return ids


def sample_next(logits: Tensor, sampling: SamplingConfig, u: Tensor) -> tuple[Tensor, Tensor]:
    """Next tokens ``[N]`` and their log-probs under the distribution sampled from, by inverse
    CDF with the uniforms ``u [N]`` in (0, 1] (unused when greedy)."""
    logits = logits.float()
    if sampling.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_logp.exp().cumsum(-1)
        drop_sorted = (cum - sorted_logp.exp()) >= sampling.top_p  # keep the smallest nucleus
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    # u in (0, 1] scaled to (0, total]: the chosen token always has positive probability
    cdf = logp.exp().cumsum(-1)
    tok = (cdf < u.to(cdf.device).unsqueeze(-1) * cdf[:, -1:]).sum(-1)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


class RandomStreams:
    """The random state both engines share: the run seed and the number of calls made so far,
    which, with the prompt and sample indices, key every sample's stream (:func:`stream_keys`)."""

    seed: int = 0
    calls: int = 0

    def _next_call(self) -> int:
        self.calls += 1
        return self.calls - 1

    def generator_state(self) -> dict[str, int]:
        """The engine's whole random state, for a checkpoint."""
        return {"seed": self.seed, "calls": self.calls}

    def set_generator_state(self, state: dict[str, int]) -> None:
        if not isinstance(state, dict) or set(state) != {"seed", "calls"}:
            raise ValueError(f"engine state must be a mapping with keys 'seed' and 'calls', got {state!r:.80}")
        self.seed, self.calls = int(state["seed"]), int(state["calls"])
