"""The log-prob pass shared by every pass over rollouts (method.md section 7): per-token
log-probs of a batch of rollout rows in *canonical micro-batches* (:func:`micro_batches`), within a
token budget of padded tokens per forward. The behaviour pass, the KL reference and the training
forward/backward (:mod:`gmc.policy.update`) all go through :func:`micro_batch_logprobs` on the same plan, so a
row's log-probs do not depend on the rows it is batched with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from gmc.policy.model import token_logprobs_from_hidden

MIN_QUANTUM = 8


def canonical_length(n: int) -> int:
    """The padded length of a row of ``n`` tokens: ``n`` rounded up to a multiple of
    ``max(8, 2**floor(log2 n) / 32)``, a function of ``n`` alone (under 3.2% padding, or 7 tokens:
    a 4,160-token row of the paper's shape pads to 4,224; ``bench/padding.py`` measures a batch's
    padding and forwards against a grid of eighths).

    A row is its prompt and response from position 0, right-padded to this length; rows of one
    length are forwarded together. So a row meets the same tensor shape, code path and kernels
    whichever rows share its batch, and with unchanged weights the behaviour log-probs of a stale
    group equal its training log-probs exactly (different padding alone moves a bfloat16
    trajectory by 3e-3 nats, enough to fire caps)."""
    if n < 1:
        raise ValueError(f"a row needs at least one token, got {n}")
    quantum = max(MIN_QUANTUM, 1 << max(0, n.bit_length() - 6))
    return -(-n // quantum) * quantum


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices per forward: rows of one canonical length together, at most ``budget`` padded
    tokens per forward (one row at least); ``budget = 0``: a whole bucket per forward. Rows keep
    their order within a bucket; buckets run shortest first."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        buckets.setdefault(canonical_length(n), []).append(i)
    plan = []
    for width in sorted(buckets):
        rows = buckets[width]
        per = len(rows) if budget == 0 else max(1, budget // width)
        plan += [rows[k : k + per] for k in range(0, len(rows), per)]
    return plan


@dataclass
class Rows:
    """Rollout rows as the passes see them: each row's prompt+response token ids from position
    0, with the prompt's length; ``lengths`` are response lengths (0 allowed: nothing to score)."""

    sequences: list[Tensor]  # [P_i + R_i] int64
    prompt_lengths: list[int]
    lengths: list[int]

    @classmethod
    def from_groups(cls, groups) -> Rows:
        """The rows of :class:`gmc.rollouts.groups.Group` s, group after group."""
        seqs, prompts, lengths = [], [], []
        for g in groups:
            for j in range(g.response_ids.shape[0]):
                n = int(g.response_mask[j].sum())
                seqs.append(torch.cat([g.prompt_ids, g.response_ids[j, :n]]))
                prompts.append(len(g.prompt_ids))
                lengths.append(n)
        return cls(seqs, prompts, lengths)

    def __len__(self) -> int:
        return len(self.sequences)

    def plan(self, budget: int) -> list[list[int]]:
        return micro_batches([len(s) for s in self.sequences], budget)


Attention = Literal["causal", "masked"]
"""How a canonical micro-batch attends [choice, ``attention``]. ``causal``: the right-padded rows
go through the model with no attention mask, so attention is plain causal attention (SDPA's
flash path, no ``[rows, 1, T, T]`` mask built); a real token attends only to the real tokens
before it, and the padding after a row never reaches it, so its log-probs are those of the
masked forward up to kernel rounding. ``masked``: an explicit padding mask (transformers builds
the 4-D mask; SDPA computes the full square), kept as the reference."""


def micro_batch_logprobs(
    model,
    rows: Rows,
    idx: list[int],
    pad_id: int,
    temperature: float,
    chunk_size: int,
    attention: Attention = "causal",
    fp32_head: bool = False,
) -> Tensor:
    """Response log-probs ``[len(idx), max response length]`` (float32; zero past each end) of
    one canonical micro-batch; differentiable when grad is enabled."""
    device = next(model.parameters()).device
    width = canonical_length(len(rows.sequences[idx[0]]))
    T = max(1, max(rows.lengths[i] for i in idx))
    ids, start, length, filled = _to_device(_host_batch(rows, idx, pad_id, width), device)
    span = torch.arange(width, device=device).unsqueeze(0)
    attn = (span < filled.unsqueeze(1)).long() if attention == "masked" else None
    # the hidden state at position p - 1 predicts token p: response token t of row k sits at
    # start_k + t (clamped into the row; positions past the response end are masked by callers)
    pos = (start.unsqueeze(1) + span[:, :T]).clamp(max=width - 1)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError("log-probs expect an LM head without bias")
    h = hidden.gather(1, (pos - 1).unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    logp = token_logprobs_from_hidden(head.weight, h, ids.gather(1, pos), temperature, chunk_size, fp32_head)
    live = span[:, :T] < length.unsqueeze(1)
    return torch.where(live, logp, torch.zeros_like(logp))


def _host_batch(rows: Rows, idx: list[int], pad_id: int, width: int) -> Tensor:
    """One micro-batch built on the host as a single int64 tensor ``[len(idx), width + 3]``: each
    row's token ids right-padded to ``width``, then its prompt length, its response length and
    its length in tokens."""
    batch = torch.full((len(idx), width + 3), pad_id, dtype=torch.long, device="cpu")
    for k, i in enumerate(idx):
        batch[k, : len(rows.sequences[i])] = rows.sequences[i]
    batch[:, width:] = torch.tensor(
        [[rows.prompt_lengths[i], rows.lengths[i], len(rows.sequences[i])] for i in idx], device="cpu"
    )
    return batch


def _transfer(host: Tensor, device: torch.device) -> Tensor:
    """A host tensor on ``device``; to a GPU from pinned memory without waiting on it, so the host
    goes on building the next micro-batch."""
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


def _to_device(batch: Tensor, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`_host_batch` on ``device`` in one transfer, split into ids, prompt lengths, response
    lengths and row lengths."""
    batch = _transfer(batch, device)
    width = batch.shape[1] - 3
    return batch[:, :width], batch[:, width], batch[:, width + 1], batch[:, width + 2]


def plan_indices(plan: list[list[int]], device: torch.device) -> list[Tensor]:
    """Each micro-batch's row indices as a tensor on ``device``, all from one transfer."""
    if not plan:
        return []
    flat = _transfer(torch.tensor([i for idx in plan for i in idx], dtype=torch.long, device="cpu"), device)
    return list(torch.split(flat, [len(idx) for idx in plan]))


def precision(model, compute_dtype: torch.dtype | None, cache: bool = True):
    """Autocast to ``compute_dtype`` when the model keeps wider (float32 master) parameters;
    nothing when they already are in ``compute_dtype`` (or it is None). Without ``cache``, each
    weight is cast where it is used instead of once per pass: a no-grad pass then never holds a
    compute-dtype copy of every weight (7.5 GiB at 4B) beside vLLM; the values are the same."""
    params = next(model.parameters())
    if compute_dtype is None or compute_dtype == params.dtype:
        return contextlib.nullcontext()
    return torch.autocast(device_type=params.device.type, dtype=compute_dtype, cache_enabled=cache)


@contextlib.contextmanager
def training_mode(model):
    """Every pass over rollouts runs in training mode (the mode of the training forward),
    restoring the model's mode afterwards."""
    was = model.training
    model.train()
    try:
        yield
    finally:
        model.train(was)


def sequence_logprobs(
    model,
    rows: Rows,
    budget: int,
    pad_id: int,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    compute_dtype: torch.dtype | None = None,
    attention: Attention = "causal",
    fp32_head: bool = False,
) -> Tensor:
    """No-grad response log-probs ``[N, T]`` (float32, on the model's device, zero past each
    end; ``T`` the longest response, at least 1) in canonical micro-batches."""
    device = next(model.parameters()).device
    out = torch.zeros(len(rows), max(1, max(rows.lengths, default=1)), device=device)
    plan = rows.plan(budget)
    with torch.no_grad(), training_mode(model), precision(model, compute_dtype, cache=False):
        for idx, at in zip(plan, plan_indices(plan, device)):
            lp = micro_batch_logprobs(model, rows, idx, pad_id, temperature, chunk_size, attention, fp32_head)
            out[at, : lp.shape[1]] = lp
    return out


def per_group(values: Tensor, groups) -> list[Tensor]:
    """Per-row values ``[N, T]`` of :meth:`Rows.from_groups` ``(groups)`` as each group's own
    ``[G, T']`` (copies, cut to the group's ``response_ids`` width; zero past each end)."""
    out, at = [], 0
    for g in groups:
        G, T = g.response_ids.shape
        out.append(values[at : at + G, :T].clone())
        at += G
    return out


def padded_tokens(rows: Rows, budget: int) -> list[int]:
    """Padded tokens of each forward of the plan (for tests and memory reports)."""
    return [len(idx) * canonical_length(len(rows.sequences[idx[0]])) for idx in rows.plan(budget)]
