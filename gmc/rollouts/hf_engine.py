"""The HF engine (``engine: hf``, method.md section 4): sampling with the trainer's own module and
a KV cache (:mod:`gmc.rollouts.decoding`), on any device; the engine of every CPU run."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from gmc.rollouts.decoding import make_decoder
from gmc.rollouts.engines import HFConfig, SamplingConfig
from gmc.rollouts.streams import (
    RandomStreams,
    Sample,
    end_token_ids,
    sample_next,
    stream_keys,
    stream_uniforms,
)


class HFEngine(RandomStreams):
    """Sampling with a Hugging Face causal LM and a KV cache, on any device; ``batch_size``
    answers (prompts x samples) are decoded together. The samples of a call do not depend on
    ``batch_size``: each draws from its own stream. ``token_seconds`` of wall clock are added to
    every decoding step (:class:`gmc.rollouts.engines.HFConfig`); ``fp32_head``: the LM head in
    float32 whatever the autocast."""

    newer_weights: Callable[[], int | None] | None = None
    """Partial rollouts: called between two decoding steps, it loads newer weights into the model
    and returns their version (None: none arrived). The answers in progress then continue with
    them: their cache is computed again with the new weights from prompt and tokens so far (one
    prefill), so every token is sampled from one version's own distribution, and each sample
    records the version of each of its tokens (``Sample.versions``, from ``version``, the
    version the call started with)."""
    version: int = 0

    def __init__(
        self,
        model,
        tokenizer,
        seed: int = 0,
        batch_size: int = 256,
        token_seconds: float = 0.0,
        fp32_head: bool = False,
    ):
        self.model, self.fp32_head = model, fp32_head
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

    def _generate_batch(
        self, prompts: list[str], n: int, sampling: SamplingConfig, call: int, first: int
    ) -> list[list[Sample]]:
        """Prompts ``first, first+1, ...`` of call ``call``, decoded together."""
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        rows = torch.arange(len(prompts) * n, device=self.device)
        keys = stream_keys(self.seed, call, first + rows // n, rows % n)
        prompt_ids = [
            [t for t, m in zip(r, k) if m] for r, k in zip(enc["input_ids"].tolist(), enc["attention_mask"].tolist())
        ]
        was_training = self.model.training
        self.model.eval()
        try:
            decoder = make_decoder(self.model, ids.shape[1] + sampling.max_new_tokens, self.fp32_head)
            tokens, logps, lengths, versions = self._decode(
                decoder,
                decoder.prefill(ids, mask, copies=n),
                sampling,
                keys,
                [prompt_ids[row // n] for row in range(len(keys))],
            )
        finally:
            self.model.train(was_training)
        tok_rows, lp_rows, lengths = tokens.tolist(), logps.tolist(), lengths.tolist()
        version_rows = versions.tolist() if versions is not None else [None] * len(tok_rows)
        samples = []
        for row, (toks, lps, end, vs) in enumerate(zip(tok_rows, lp_rows, lengths, version_rows)):
            reason = "stop" if toks[end - 1] in self.eos_ids else "length"
            samples.append(
                Sample(
                    toks[:end],
                    self.tokenizer.decode(toks[:end], skip_special_tokens=True),
                    lps[:end],
                    reason,
                    prompt_ids[row // n],
                    vs[:end] if vs is not None else None,
                )
            )
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _decode(
        self, decoder, logits: Tensor, sampling: SamplingConfig, keys: Tensor, prompts: list[list[int]]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Sample until every row has ended (an end-of-turn id) or the token limit, row ``i``
        from the stream ``keys[i]`` after its prompt ``prompts[i]``; returns the tokens and
        log-probs ``[N, T]``, each row's length (end token included) and, where the weights may
        change mid-answer (:attr:`newer_weights`), each token's version ``[N, T]`` (else None)."""
        N, T = logits.shape[0], sampling.max_new_tokens
        eos = torch.tensor(sorted(self.eos_ids), device=self.device)
        tokens = torch.full((N, T), self.pad_id, dtype=torch.long, device=self.device)
        logps = torch.zeros(N, T, device=self.device)
        versions = (
            torch.full((N, T), self.version, dtype=torch.long, device=self.device) if self.newer_weights else None
        )
        lengths = torch.full((N,), T, dtype=torch.long, device=self.device)
        rows = torch.arange(N, device=self.device)  # the output row of each decoder row
        done = torch.zeros(N, dtype=torch.bool, device=self.device)
        for t in range(T):
            tok, lp = sample_next(logits, sampling, stream_uniforms(keys, t))
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
        decoder = make_decoder(self.model, width + room, self.fp32_head)
        return decoder, decoder.prefill(ids, mask)


def hf_engine(model, tokenizer, model_path, seed, settings: HFConfig, dtype, fp32_head: bool = False) -> HFEngine:
    """The ``hf`` entry of :data:`gmc.rollouts.engines.ENGINES`: sampling with the trainer's own module."""
    return HFEngine(model, tokenizer, seed=seed, token_seconds=settings.token_seconds, fp32_head=fp32_head)
