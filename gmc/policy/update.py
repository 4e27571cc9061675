"""The update (method.md section 7): one step's gradient from a batch of rollouts, within a token
budget of padded tokens per forward. It forwards in the canonical micro-batches of
:mod:`gmc.policy.logprobs`, so a row's log-probs do not depend on the rows it is batched with;
:class:`Update` gives the gradient of the estimator's whole-batch loss with one forward and
backward per micro-batch, and a no-grad pass first only for losses that need the batch's
statistics before backward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from gmc.estimators import EstimatorConfig, advantages_for
from gmc.policy.logprobs import (
    Attention,
    Rows,
    micro_batch_logprobs,
    per_group,
    plan_indices,
    precision,
    sequence_logprobs,
)


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
        of the generating version is known (the current policy's in bypass mode, as verl's). In
        bypass mode under ``token_mean`` the rejected tokens stay in the denominator, as verl's,
        whose bypass loss rejects inside a loss divided by every valid token of the batch
        (:meth:`_current_correction`)."""
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
        prox = None if proximal is None else self._stack(proximal, T, device)
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
                weights, keep, extra = self._current_correction(current - sampler, mask)
            if weights is not None:
                logp.register_hook(lambda grad: grad * weights)
            loss, stats = self._loss(logp, current if on_policy else behaviour, keep, adv, ref, prox)
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
                    weights, keep, extra = self._current_correction(values - sampler, mask)
            leaf = values.clone().requires_grad_(True)
            loss, stats = self._loss(leaf, values if on_policy else behaviour, keep, adv, ref, prox)
            (coef,) = torch.autograd.grad(loss, leaf)
            if weights is not None:
                coef = coef * weights
            coef = coef.view(B * G, T)
            current = torch.zeros(B * G, T, device=device)
            plan = rows.plan(self.budget)
            for idx, at in zip(plan, plan_indices(plan, device)):
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

    def _current_correction(self, log_ratio: Tensor, mask: Tensor) -> tuple[Tensor | None, Tensor, dict]:
        """The correction of a ratio read from the step's own forward: in bypass mode (the
        sampler's log-probs the behaviour) :func:`gmc.estimators.mismatch.correct_bypass`, whose
        weights carry the share of tokens rejection keeps under ``token_mean``; else
        :func:`gmc.estimators.mismatch.correct`."""
        from gmc.estimators.mismatch import correct, correct_bypass

        if self.sampler_behaviour:
            return correct_bypass(log_ratio, mask, self.correction, self.cfg.aggregation)
        return correct(log_ratio, mask, self.correction)

    def _row_by_row(
        self,
        rows: Rows,
        behaviour: Tensor | None,
        mask: Tensor,
        adv: Tensor,
        ref: Tensor | None,
        weights: Tensor | None = None,
        prox: Tensor | None = None,
    ) -> tuple[Tensor, dict, Tensor]:
        """The micro-batched step of a loss that splits per row (``behaviour`` None: on-policy,
        the rows' own log-probs are their behaviour; ``weights``: each token's gradient is
        multiplied by its weight; ``prox``: the loss's proximal log-probs); returns the loss,
        statistics and every row's log-probs."""
        B, G, T = mask.shape
        values = torch.zeros(B * G, T, device=mask.device)  # every row's log-probs, filled as forwarded
        held = values if behaviour is None else behaviour.reshape(B * G, T)  # the other rows: any finite values
        flat_weights = None if weights is None else weights.reshape(B * G, T)
        plan = rows.plan(self.budget)
        for idx, at in zip(plan, plan_indices(plan, mask.device)):
            with precision(self.model, self.compute_dtype):
                lp = self._forward(rows, idx)
            if flat_weights is not None:
                lp.register_hook(lambda grad, w=flat_weights[at, : lp.shape[1]]: grad * w)
            logp = held.index_put((at,), torch.nn.functional.pad(lp, (0, T - lp.shape[1]))).view(B, G, T)
            loss, _ = self._loss(logp, logp.detach() if behaviour is None else behaviour, mask, adv, ref, prox)
            loss.backward()
            values[at, : lp.shape[1]] = lp.detach()
        logp = values.view(B, G, T)
        with torch.no_grad():
            loss, stats = self._loss(logp, logp if behaviour is None else behaviour, mask, adv, ref, prox)
        return loss, stats, logp

    def _loss(
        self,
        logp: Tensor,
        behaviour_logp: Tensor,
        mask: Tensor,
        adv: Tensor,
        ref: Tensor | None,
        prox: Tensor | None,
    ) -> tuple[Tensor, dict]:
        """The estimator's loss and statistics on the whole batch, ``[B, G, T]`` log-probs (``ref``:
        the reference policy's, for the KL term; ``prox``: the proximal policy's, given only to a
        loss that takes one), with the run's settings and token limit; statistics left on the
        device where the loss can leave them."""
        proximal = {} if prox is None else {"prox_logp": prox}
        return self.loss_fn(
            logp,
            behaviour_logp,
            mask,
            adv,
            self.cfg,
            ref_logp=ref,
            max_new_tokens=self.max_new_tokens,
            **proximal,
            **self.quiet,
        )

    def _forward(self, rows: Rows, idx: list[int]) -> Tensor:
        """The training forward of one canonical micro-batch, with gradient."""
        return micro_batch_logprobs(
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
