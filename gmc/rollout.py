"""Rollout engines: one interface, two engines (method.md sections 4 and 5).

``engine.generate(prompts, n, sampling) -> groups``: one group of ``n`` samples per prompt,
each :class:`Sample` with its token ids, text, the sampler's per-token log-probs, length and
finish reason (``stop`` at EOS, ``length`` at the token limit).

* :class:`HFEngine` runs on any machine: batched sampling with a KV cache over left-padded
  prompts, temperature and top-p, seeded by the engine's own generator (same seed, same
  samples). The sampler's log-probs are those of the distribution actually sampled (after
  temperature and top-p); for training rollouts (temperature 1, top_p 1) they equal the
  policy's own log-probs.
* :class:`VLLMEngine` (GPU, the ``gpu`` extra) wraps an in-process ``vllm.LLM`` that returns
  log-probs and takes new weights from the trainer after each optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor

from gmc.policy import position_ids_from_mask


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings. Training rollouts use temperature 1 and top_p 1 (method.md section 4)."""

    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
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
    probs = logp.exp()
    tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


class HFEngine:
    """Sampling with a Hugging Face causal LM and its KV cache, on any device."""

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
        flat = [p for p in prompts for _ in range(n)]
        samples: list[Sample] = []
        for start in range(0, len(flat), self.batch_size):
            samples += self._generate_batch(flat[start : start + self.batch_size], sampling)
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[str], sampling: SamplingConfig) -> list[Sample]:
        was_training = self.model.training
        self.model.eval()
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc["input_ids"].to(self.device)
        mask = enc["attention_mask"].to(self.device)
        N = ids.shape[0]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                         use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        logits = out.logits[:, -1]
        next_pos = mask.sum(-1, keepdim=True)
        eos = torch.tensor(sorted(self.eos_ids), device=self.device)
        tokens, logps = [], []
        done = torch.zeros(N, dtype=torch.bool, device=self.device)
        for _ in range(sampling.max_new_tokens):
            tok, lp = _sample_next(logits, sampling, self.generator)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            tokens.append(tok)
            logps.append(lp)
            done = done | torch.isin(tok, eos)
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones(N, 1, dtype=mask.dtype, device=self.device)], dim=1)
            out = self.model(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=next_pos,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1]
            next_pos = next_pos + 1
        if was_training:
            self.model.train()
        tok_mat = torch.stack(tokens, 1).tolist()
        lp_mat = torch.stack(logps, 1).tolist()
        samples = []
        prompt_rows = enc["input_ids"].tolist()
        prompt_masks = enc["attention_mask"].tolist()
        for row in range(N):
            toks, lps = tok_mat[row], lp_mat[row]
            end = next((i + 1 for i, t in enumerate(toks) if t in self.eos_ids), None)
            reason = "stop" if end is not None else "length"
            end = end or len(toks)
            prompt_ids = [t for t, m in zip(prompt_rows[row], prompt_masks[row]) if m]
            samples.append(Sample(toks[:end], self.tokenizer.decode(toks[:end], skip_special_tokens=True),
                                  lps[:end], reason, prompt_ids))
        return samples


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
                "machine: pip install 'gmc[gpu]' (or use rollout.engine: hf)."
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
