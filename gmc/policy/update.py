"""The update (method.md section 7): per-token log-probs of a batch of rollouts and one step's
gradient, within a token budget of padded tokens per forward. Every pass over rollouts (the
behaviour pass, the KL reference, the training forward/backward) runs in *canonical
micro-batches* (:func:`micro_batches`), so a row's log-probs do not depend on the rows it is
batched with; :class:`Update` gives the gradient of the estimator's whole-batch loss with one
forward and backward per micro-batch, and a no-grad pass first only for losses that need the
batch's statistics before backward.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from gmc.estimators import EstimatorConfig, advantages_for
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


def _forward(
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


def _plan_indices(plan: list[list[int]], device: torch.device) -> list[Tensor]:
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
        for idx, at in zip(plan, _plan_indices(plan, device)):
            lp = _forward(model, rows, idx, pad_id, temperature, chunk_size, attention, fp32_head)
            out[at, : lp.shape[1]] = lp
    return out


@dataclass
class TokenLogprobs:
    """The three log-probs of a step's tokens, ``[B, G, T]`` (zero past each end): the sampler's,
    the trainer's at the generating version (the current policy's in bypass mode, which has no
    other) and the current policy's before the step's update."""

    mask: Tensor
    sampler: Tensor
    generating: Tensor
    current: Tensor

    def packed(self) -> dict[str, Tensor]:
        """The valid tokens only, on the host: each log-prob flattened row after row, and the
        response lengths ``[B, G]`` that unflatten them."""
        m = self.mask.cpu()
        return {
            "lengths": m.sum(-1),
            **{k: getattr(self, k).detach().float().cpu()[m] for k in ("sampler", "generating", "current")},
        }


class Update:
    """The gradient of one optimizer step from a batch of groups, within ``budget`` padded tokens
    per forward. :meth:`backward` leaves the gradient in the parameters' ``.grad`` and returns the
    loss and the estimator's statistics.

    The estimators' group-level quantities (``L``, the group mass, weights, advantages,
    normalisers) depend on every row of a group, so a micro-batch cannot compute its own loss.
    But every loss depends on the policy only through the per-token log-probs ``logp [B, G, T]``,
    so its gradient is ``sum_t g_t grad logp_t`` with ``g = d loss / d logp``. With a budget the
    step runs (1) a no-grad pass for every row's ``logp`` (skipped on-policy without KL, where
    the ratios are exactly 1 and ``g`` does not depend on ``logp``), (2) the estimator on the
    whole batch with ``logp`` as a leaf, giving the loss, its statistics and ``g``, (3) one
    forward/backward per micro-batch of ``sum(g * logp)``. With ``per_row`` (the loss needs no
    statistics of the batch: a row's ``g`` follows from its own log-probs,
    :meth:`gmc.estimators.registry.Estimator.needs_batch_stats_under`) there is no pass (1): each
    micro-batch's forward enters the whole-batch loss in place of its rows, the other rows held
    at fixed values, and its backward gives those rows' gradient; the loss and statistics then
    come from every row's log-probs of those forwards. So a step costs one forward and one
    backward per token, not two forwards and one backward. Loss, statistics and gradient equal
    the whole-batch step's (float32, to rounding). Without a budget (0) every canonical bucket
    is forwarded with its graph kept and the loss back-propagated once."""

    def __init__(
        self,
        model,
        loss_fn: Callable,
        est_cfg: EstimatorConfig,
        budget: int,
        pad_id: int,
        temperature: float = 1.0,
        chunk_size: int = 4096,
        reference=None,
        compute_dtype: torch.dtype | None = None,
        attention: Attention = "causal",
        per_row: bool = False,
        max_new_tokens: int | None = None,
        correction: dict | None = None,
        sampler_behaviour: bool = False,
        fp32_head: bool = False,
    ):
        if est_cfg.kl_coef > 0 and reference is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        self.model, self.loss_fn, self.cfg, self.per_row = model, loss_fn, est_cfg, per_row
        # gmc's losses can leave their statistics on the device (estimator_loss): a step reads them,
        # with the mismatch's, in one transfer at its end, and never waits on the device between
        # micro-batches
        self.quiet = (
            {"floats": False} if "floats" in inspect.signature(loss_fn, follow_wrapped=False).parameters else {}
        )
        self.max_new_tokens = max_new_tokens
        self.budget, self.pad_id, self.temperature, self.chunk_size = budget, pad_id, temperature, chunk_size
        self.reference = reference if est_cfg.kl_coef > 0 else None
        self.compute_dtype, self.attention = compute_dtype, attention
        self.correction, self.sampler_behaviour, self.fp32_head = correction, sampler_behaviour, fp32_head
        self.tokens: TokenLogprobs | None = None  # the last step's

    @classmethod
    def from_config(cls, cfg, model, pad_id: int, reference=None) -> Update:
        """The update of a run's :class:`~gmc.run.config.TrainConfig` ``cfg`` for ``model``: its
        estimator's loss with the settings its registry entry resolves, the token limit of
        ``seq_sum_const`` (``sampling.max_new_tokens``), budget, temperature, LM-head chunk,
        compute dtype and attention, whether its loss splits per row, its mismatch correction
        (``rollout_correction``) and whether its behaviour log-probs are the sampler's; every pass over
        rollouts of a run (the trainer's, a rollout worker's behaviour pass) goes through one of these."""
        from gmc.estimators import REGISTRY
        from gmc.policy.model import DTYPES

        estimator = REGISTRY[cfg.algorithm]
        settings = estimator.resolved(cfg.estimator)
        return cls(
            model,
            estimator.loss_function(),
            settings,
            cfg.micro_batch_tokens,
            pad_id,
            temperature=cfg.sampling.temperature,
            chunk_size=cfg.logprob_chunk_size,
            reference=reference,
            compute_dtype=DTYPES[cfg.model_dtype],
            attention=cfg.attention,
            per_row=not estimator.needs_batch_stats_under(settings),
            max_new_tokens=cfg.sampling.max_new_tokens,
            correction=cfg.rollout_correction.resolved() if cfg.rollout_correction else None,
            sampler_behaviour=cfg.behaviour_logprobs == "sampler",
            fp32_head=cfg.fp32_lm_head,
        )

    def logprobs(self, model, rows: Rows) -> Tensor:
        return sequence_logprobs(
            model,
            rows,
            self.budget,
            self.pad_id,
            self.temperature,
            self.chunk_size,
            self.compute_dtype,
            self.attention,
            self.fp32_head,
        )

    def backward(
        self, groups, on_policy: bool, proximal: list[Tensor] | None = None
    ) -> tuple[Tensor, dict[str, float], Tensor]:
        """Back-propagate the estimator's loss on ``groups``; returns ``(loss, stats, rewards)``.
        ``on_policy``: the groups were generated by the current weights and carry no behaviour
        log-probs (the training forward gives them). ``proximal``: each group's log-probs ``[G, T]``
        under the proximal policy (:meth:`group_logprobs` before the batch's first update), for an
        estimator that takes one (``prox_logp``); None: the current policy is the proximal one.

        With a mismatch correction (``correction``, :mod:`gmc.estimators.correction`) the loss sees
        only the tokens its rejection keeps, and each token's gradient is multiplied by its
        importance weight. Its ratio is the trainer's log-prob at the generating version over the
        sampler's: the behaviour log-probs of a stale batch (decoupled mode), known before any
        forward; the current policy's, read from this step's forward, for an on-policy batch
        (whose generating version is the current one) and in bypass mode. The statistics gain the
        correction's and the mismatch diagnostics (``rollout_corr/``) whenever a trainer log-prob
        of the generating version is known (the current policy's in bypass mode, as verl's)."""
        from gmc.estimators.losses import as_floats
        from gmc.estimators.mismatch import correct, offpolicy_metrics

        device = next(self.model.parameters()).device
        rows = Rows.from_groups(groups)
        B, G = len(groups), groups[0].response_ids.shape[0]
        T = max(1, max(rows.lengths))
        lengths = torch.tensor(rows.lengths, device=device).view(B, G)
        mask = torch.arange(T, device=device).view(1, 1, T) < lengths.unsqueeze(-1)
        rewards = torch.stack([g.rewards for g in groups]).to(device)
        adv = advantages_for(rewards, lengths, self.cfg)
        behaviour = None if on_policy else self._per_token(groups, "behaviour_logp", T, device)
        sampler = self._per_token(groups, "sampler_logp", T, device)
        prox = {} if proximal is None else {"prox_logp": self._stack(proximal, T, device)}
        corr = self.correction
        reads_current = corr is not None and (self.sampler_behaviour or on_policy)
        weights, keep, extra = None, mask, {}
        if corr is not None and not reads_current:
            weights, keep, extra = correct(behaviour - sampler, mask, corr)
        ref = self.logprobs(self.reference, rows).to(device).view(B, G, T) if self.reference is not None else None
        self.model.train()
        if self.budget == 0:
            logp = self._whole_batch_logprobs(rows, T).view(B, G, T)
            current = logp.detach()
            if reads_current:
                weights, keep, extra = correct(current - sampler, mask, corr)
            if weights is not None:
                logp.register_hook(lambda grad: grad * weights)
            loss, stats = self.loss_fn(
                logp,
                current if on_policy else behaviour,
                keep,
                adv,
                self.cfg,
                ref_logp=ref,
                max_new_tokens=self.max_new_tokens,
                **prox,
                **self.quiet,
            )
            loss.backward()
            loss = loss.detach()
        elif self.per_row and not reads_current and not (on_policy and ref is None):
            loss, stats, current = self._row_by_row(rows, behaviour, keep, adv, ref, weights, prox)
        else:
            if on_policy and ref is None and not reads_current:
                values = torch.zeros(B, G, T, device=device)  # ratios are exactly 1: g needs no log-probs
            else:
                values = self.logprobs(self.model, rows).view(B, G, T)
                if reads_current:
                    weights, keep, extra = correct(values - sampler, mask, corr)
            leaf = values.clone().requires_grad_(True)
            loss, stats = self.loss_fn(
                leaf,
                values if on_policy else behaviour,
                keep,
                adv,
                self.cfg,
                ref_logp=ref,
                max_new_tokens=self.max_new_tokens,
                **prox,
                **self.quiet,
            )
            (coef,) = torch.autograd.grad(loss, leaf)
            if weights is not None:
                coef = coef * weights
            coef = coef.view(B * G, T)
            current = torch.zeros(B * G, T, device=device)
            plan = rows.plan(self.budget)
            for idx, at in zip(plan, _plan_indices(plan, device)):
                with precision(self.model, self.compute_dtype):
                    lp = self._forward(rows, idx)
                (lp * coef[at, : lp.shape[1]]).sum().backward()
                current[at, : lp.shape[1]] = lp.detach()
            current = current.view(B, G, T)
            loss = loss.detach()
        generating = current if behaviour is None or self.sampler_behaviour else behaviour
        extra.update(offpolicy_metrics(generating, sampler, mask))
        self.tokens = TokenLogprobs(mask, sampler, generating, current)
        return loss, as_floats({**stats, **extra}), rewards  # every statistic read from the device at once

    def _row_by_row(
        self,
        rows: Rows,
        behaviour: Tensor | None,
        mask: Tensor,
        adv: Tensor,
        ref: Tensor | None,
        weights: Tensor | None = None,
        prox: dict | None = None,
    ) -> tuple[Tensor, dict, Tensor]:
        """The micro-batched step of a loss that splits per row (``behaviour`` None: on-policy,
        the rows' own log-probs are their behaviour; ``weights``: each token's gradient is
        multiplied by its weight; ``prox``: the loss's proximal log-probs, as a keyword); returns
        the loss, statistics and every row's log-probs."""
        prox = prox or {}
        B, G, T = mask.shape
        values = torch.zeros(B * G, T, device=mask.device)  # every row's log-probs, filled as forwarded
        held = values if behaviour is None else behaviour.reshape(B * G, T)  # the other rows: any finite values
        flat_weights = None if weights is None else weights.reshape(B * G, T)
        plan = rows.plan(self.budget)
        for idx, at in zip(plan, _plan_indices(plan, mask.device)):
            with precision(self.model, self.compute_dtype):
                lp = self._forward(rows, idx)
            if flat_weights is not None:
                lp.register_hook(lambda grad, w=flat_weights[at, : lp.shape[1]]: grad * w)
            logp = held.index_put((at,), torch.nn.functional.pad(lp, (0, T - lp.shape[1]))).view(B, G, T)
            loss, _ = self.loss_fn(
                logp,
                logp.detach() if behaviour is None else behaviour,
                mask,
                adv,
                self.cfg,
                ref_logp=ref,
                max_new_tokens=self.max_new_tokens,
                **prox,
                **self.quiet,
            )
            loss.backward()
            values[at, : lp.shape[1]] = lp.detach()
        logp = values.view(B, G, T)
        with torch.no_grad():
            loss, stats = self.loss_fn(
                logp,
                logp if behaviour is None else behaviour,
                mask,
                adv,
                self.cfg,
                ref_logp=ref,
                max_new_tokens=self.max_new_tokens,
                **prox,
                **self.quiet,
            )
        return loss, stats, logp

    def _forward(self, rows: Rows, idx: list[int]) -> Tensor:
        """The training forward of one canonical micro-batch, with gradient."""
        return _forward(
            self.model, rows, idx, self.pad_id, self.temperature, self.chunk_size, self.attention, self.fp32_head
        )

    def _per_token(self, groups, name: str, T: int, device) -> Tensor:
        """The groups' per-token tensor ``name`` (``behaviour_logp``, ``sampler_logp``) as ``[B, G, T]``."""
        return self._stack([getattr(g, name) for g in groups], T, device)

    @staticmethod
    def _stack(tensors: list[Tensor], T: int, device) -> Tensor:
        """Per-group ``[G, T_k]`` tensors as one ``[B, G, T]`` on ``device``, cut or zero-padded to ``T``."""
        out = torch.zeros(len(tensors), tensors[0].shape[0], T, device=device)
        for k, lp in enumerate(tensors):
            out[k, :, : lp.shape[1]] = lp[:, :T].to(device)
        return out

    def group_logprobs(self, groups) -> list[Tensor]:
        """No-grad log-probs of the current policy for each group (:func:`per_group`), in canonical
        micro-batches: what a batch's later updates take as its first update's policy (the
        behaviour of an on-policy batch, the proximal policy of a decoupled loss)."""
        return per_group(self.logprobs(self.model, Rows.from_groups(groups)), groups) if groups else []

    def _whole_batch_logprobs(self, rows: Rows, T: int) -> Tensor:
        """``[N, T]`` with the graph of every canonical bucket kept (no budget)."""
        pieces, order = [], []
        for idx in rows.plan(0):
            with precision(self.model, self.compute_dtype):
                lp = self._forward(rows, idx)
            pieces.append(torch.nn.functional.pad(lp, (0, T - lp.shape[1])))
            order += idx
        device = pieces[0].device
        inverse = torch.empty(len(order), dtype=torch.long, device=device)
        inverse[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)
        return torch.cat(pieces).index_select(0, inverse)


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
