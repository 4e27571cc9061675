"""Rollout engines: one interface, two engines (method.md sections 4 and 5).

``engine.generate(prompts, n, sampling) -> groups``: one group of ``n`` samples per prompt,
each :class:`Sample` with its token ids, text, the sampler's per-token log-probs, length and
finish reason (``stop`` at EOS, ``length`` at the token limit).

* :class:`HFEngine` runs on any machine: batched sampling with a KV cache over left-padded
  prompts (:mod:`gmc.decoding`: one prefill per prompt shared by its samples, finished answers
  leave the batch), temperature and top-p, seeded by the engine's own generator (same seed,
  same samples). The sampler's log-probs are those of the distribution actually sampled
  (after temperature and top-p); for training rollouts (temperature 1, top_p 1) they equal
  the policy's own log-probs.
* :class:`VLLMEngine` (GPU, the ``gpu`` extra) wraps an in-process ``vllm.LLM`` that returns
  log-probs and takes new weights from the trainer after each optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor

from gmc.decoding import make_decoder


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings. Training rollouts use temperature 1 and top_p 1 (method.md section 4)."""

    temperature: float = 1.0
    """In [0, 10]; 0 means greedy decoding (evaluation; training rollouts need > 0)."""
    top_p: float = 1.0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= 10):
            raise ValueError(f"sampling.temperature must be a finite number in [0, 10], got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")


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

    @property
    def length(self) -> int:
        return len(self.token_ids)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> list[list[Sample]]: ...

    def sync_weights(self, model) -> None: ...


def _sample_next(logits: Tensor, sampling: SamplingConfig, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Next tokens ``[N]`` and their log-probs under the distribution sampled from."""
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
    # inverse-CDF sampling: u in (0, total], so the chosen token always has positive probability
    cdf = logp.exp().cumsum(-1)
    u = (1 - torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device)) * cdf[:, -1:]
    tok = (cdf < u).sum(-1)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


class HFEngine:
    """Sampling with a Hugging Face causal LM and a KV cache, on any device; ``batch_size``
    answers (prompts x samples) are decoded together."""

    def __init__(self, model, tokenizer, seed: int = 0, batch_size: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))

    def sync_weights(self, model) -> None:
        """The HF engine samples with the trainer's own module: nothing to copy."""
        self.model = model

    def generator_state(self) -> Tensor:
        return self.generator.get_state()

    def set_generator_state(self, state: Tensor) -> None:
        self.generator.set_state(state)

    @torch.inference_mode()
    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        per_batch = max(1, self.batch_size // n)
        groups: list[list[Sample]] = []
        for start in range(0, len(prompts), per_batch):
            groups += self._generate_batch(prompts[start : start + per_batch], n, sampling)
        return groups

    def _generate_batch(self, prompts: list[str], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            decoder = make_decoder(self.model, capacity=ids.shape[1] + sampling.max_new_tokens)
            tokens, logps, lengths = self._decode(decoder, decoder.prefill(ids, mask, copies=n), sampling)
        finally:
            self.model.train(was_training)
        tok_rows, lp_rows, lengths = tokens.tolist(), logps.tolist(), lengths.tolist()
        prompt_ids = [[t for t, m in zip(r, k) if m] for r, k in zip(enc["input_ids"].tolist(), enc["attention_mask"].tolist())]
        samples = []
        for row, (toks, lps, end) in enumerate(zip(tok_rows, lp_rows, lengths)):
            reason = "stop" if toks[end - 1] in self.eos_ids else "length"
            samples.append(Sample(toks[:end], self.tokenizer.decode(toks[:end], skip_special_tokens=True), lps[:end],
                                  reason, prompt_ids[row // n]))
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _decode(self, decoder, logits: Tensor, sampling: SamplingConfig) -> tuple[Tensor, Tensor, Tensor]:
        """Sample until every row has ended (EOS) or the token limit; returns the tokens and
        log-probs ``[N, T]`` and each row's length (EOS included)."""
        N, T = logits.shape[0], sampling.max_new_tokens
        eos = torch.tensor(sorted(self.eos_ids), device=self.device)
        tokens = torch.full((N, T), self.pad_id, dtype=torch.long, device=self.device)
        logps = torch.zeros(N, T, device=self.device)
        lengths = torch.full((N,), T, dtype=torch.long, device=self.device)
        rows = torch.arange(N, device=self.device)  # the output row of each decoder row
        done = torch.zeros(N, dtype=torch.bool, device=self.device)
        for t in range(T):
            tok, lp = _sample_next(logits, sampling, self.generator)
            live = rows[~done]
            tokens[live, t], logps[live, t] = tok[~done], lp[~done]
            ended = ~done & torch.isin(tok, eos)
            lengths[rows[ended]] = t + 1
            done |= ended
            n_done = int(done.sum())
            if n_done == len(rows) or t + 1 == T:
                break
            if 4 * n_done >= len(rows):  # drop finished rows once they are a quarter of the batch
                keep = (~done).nonzero().squeeze(1)
                decoder.keep(keep)
                rows, done, tok = rows[keep], done[keep], tok[keep]
            logits = decoder.step(tok)
        return tokens, logps, lengths


class VLLMEngine:
    """An in-process ``vllm.LLM`` behind the same interface (needs a GPU and the ``gpu`` extra).

    Weights are pushed after each optimizer step with :meth:`sync_weights`, which calls
    ``load_weights`` on the worker's model through ``LLM.collective_rpc`` and then resets the
    prefix cache, so no stale KV entries survive an update.
    """

    def __init__(self, model_path: str, seed: int = 0, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.35, max_model_len: int | None = None, **llm_kwargs):
        try:
            import vllm
        except ImportError as e:
            raise ImportError(
                "VLLMEngine needs vLLM, which is not installed. Install the GPU extra on a CUDA "
                "machine: pip install 'gmc[gpu]' (or set engine: hf in the train or evaluate config)."
            ) from e
        import os

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights by reference
        self._vllm = vllm
        self.seed = seed
        self._calls = 0
        self.llm = vllm.LLM(model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                            max_model_len=max_model_len, enable_prefix_caching=True, **llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        self._calls += 1
        params = self._vllm.SamplingParams(
            n=n, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_new_tokens,
            logprobs=0, seed=self.seed * 1_000_003 + self._calls,
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        groups = []
        for out in outputs:
            group = []
            for c in out.outputs:
                lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs or [])]
                group.append(Sample(list(c.token_ids), c.text, lps,
                                    "stop" if c.finish_reason == "stop" else "length", list(out.prompt_token_ids)))
            groups.append(group)
        return groups

    def sync_weights(self, model) -> None:
        state = [(name, p.detach()) for name, p in model.state_dict().items()]
        self.llm.collective_rpc(_load_weights_on_worker, args=(state,))
        self.llm.reset_prefix_cache()


def _load_weights_on_worker(worker, weights) -> None:
    worker.model_runner.model.load_weights(weights=weights)


def make_engine(kind: str, model, tokenizer, model_path: str | None = None, seed: int = 0, **kwargs) -> RolloutEngine:
    """``hf`` (any machine) or ``vllm`` (GPU)."""
    if kind == "hf":
        return HFEngine(model, tokenizer, seed=seed, **kwargs)
    if kind == "vllm":
        if model_path is None:
            raise ValueError("the vllm engine needs model_path (a hub name or a saved folder)")
        return VLLMEngine(model_path, seed=seed, **kwargs)
    raise ValueError(f"rollout engine must be 'hf' or 'vllm', got {kind!r}")
