"""The mismatch correction's arithmetic (:mod:`gmc.estimators.correction` holds its settings):
truncated importance weights and rejection of the ratio between the trainer's policy and the
sampler, and the off-policy diagnostics verl logs under ``rollout_corr/``. Same formulas as verl's
``rollout_corr_helper`` (``make test-peers`` holds them to it), on tensors of any leading shape
``[..., T]``; log-ratios clamped to ``[-20, 20]`` before ``exp``, as verl's.

Statistics are 0-dim tensors (:func:`gmc.estimators.losses.as_floats` reads them once).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gmc.estimators.correction import parse_is_threshold, parse_rs
from gmc.estimators.losses import divergence_keep_mask

SAFETY_BOUND = 20.0
PREFIX = "rollout_corr/"


def _mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the valid tokens."""
    return torch.where(mask, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1)


def _row_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Each response's mean over its valid tokens (0 for an empty one)."""
    return torch.where(mask, x, torch.zeros_like(x)).sum(-1) / mask.sum(-1).clamp(min=1)


def correct(log_ratio: Tensor, mask: Tensor, settings: dict) -> tuple[Tensor | None, Tensor, dict[str, Tensor]]:
    """The correction of ``log_ratio = log pi_trainer - log mu_sampler`` ``[..., T]`` under
    ``settings`` (:meth:`gmc.estimators.correction.RolloutCorrection.resolved`): the importance
    weights (detached, 0 at padding; None without ``rollout_is``), the tokens rejection keeps
    (``mask`` without ``rollout_rs``) and the statistics, named as verl's under ``rollout_corr/``."""
    mask = mask.bool()
    lr = log_ratio.detach().float()
    stats: dict[str, Tensor] = {}
    weights = None
    if settings["rollout_is"] is not None:
        weights, stats = importance_weights(lr, mask, settings["rollout_is"], settings["rollout_is_threshold"])
    keep = mask
    if settings["rollout_rs"] is not None:
        keep, rs = rejection_mask(lr, mask, settings["rollout_rs"], settings["rollout_rs_threshold"])
        stats.update(rs)
    return weights, keep, {PREFIX + k: v for k, v in stats.items()}


def correct_bypass(
    log_ratio: Tensor, mask: Tensor, settings: dict, aggregation: str
) -> tuple[Tensor | None, Tensor, dict[str, Tensor]]:
    """:func:`correct` in bypass mode, where the sampler's log-probs are the loss's behaviour and
    ``log_ratio`` is the current policy's over the sampler's. With rejection under ``token_mean``
    (``aggregation``), every weight is also multiplied by the share of valid tokens rejection
    keeps: the loss on the kept tokens, divided by their count and so weighted, is divided by every
    valid token's count, as verl's bypass loss (``compute_policy_loss_bypass_mode``, whose
    ``batch_num_tokens`` counts the unrejected ``response_mask``). The weights are then a 0-dim
    tensor where ``settings`` set no importance weights."""
    weights, keep, stats = correct(log_ratio, mask, settings)
    if settings["rollout_rs"] is not None and aggregation == "token_mean":
        kept_share = keep.sum() / mask.sum().clamp(min=1)
        weights = kept_share if weights is None else weights * kept_share
    return weights, keep, stats


def importance_weights(
    lr: Tensor, mask: Tensor, level: str, threshold: float | str
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated (or IcePop-banded) importance weights of the mismatch ratio, per token or per
    response (the product of its tokens' ratios on each of its tokens), and their statistics."""
    upper, lower = parse_is_threshold(threshold)
    zero = torch.zeros_like(lr)
    if level == "token":
        log_w = lr
        raw = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_w = torch.where(mask, lr, zero).sum(-1, keepdim=True)
        raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(lr)
    raw = torch.where(mask, raw, zero)
    if lower is None:
        w = raw.clamp(max=upper)
    else:
        w = torch.where((raw >= lower) & (raw <= upper), raw, zero)
    low = 1.0 / upper if lower is None else lower
    stats = {"rollout_is_mean": _mean(w, mask)}
    if level == "token":
        stats["rollout_is_max"] = w.masked_fill(~mask, -math.inf).max()
        stats["rollout_is_min"] = w.masked_fill(~mask, math.inf).min()
        stats["rollout_is_ratio_fraction_high"] = _mean((raw > upper).float(), mask)
        stats["rollout_is_ratio_fraction_low"] = _mean((raw < low).float(), mask)
    else:
        stats["rollout_is_max"] = torch.exp(log_w.max().clamp(max=SAFETY_BOUND))
        stats["rollout_is_min"] = torch.exp(log_w.min())
        stats["rollout_is_ratio_fraction_high"] = (log_w > math.log(upper)).float().mean()
        stats["rollout_is_ratio_fraction_low"] = (log_w < math.log(low)).float().mean()
    bounded = w.clamp(0.0, upper)
    stats["rollout_is_eff_sample_size"] = 1.0 / _mean((bounded / (_mean(bounded, mask) + 1e-8)).square(), mask)
    if lower is not None:
        stats["rollout_is_oob_ratio"] = _mean(((raw < lower) | (raw > upper)).float(), mask)
    return w.detach(), stats


def rejection_mask(
    lr: Tensor, mask: Tensor, options: str, threshold: float | str | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The tokens that pass every rejection criterion of ``options`` (verl's ``rollout_rs``,
    :func:`gmc.estimators.losses.divergence_keep_mask` each), and the fractions rejected: of
    tokens and of responses, per criterion and in all."""
    keep = mask
    valid = mask.any(-1)
    stats = {}
    for name, low, high in parse_rs(options, threshold):
        kept = divergence_keep_mask(lr, mask, name, low, high)
        stats[f"rollout_rs_{name}_masked_fraction"] = _mean((~kept).float(), mask)
        hit = (mask & ~kept).any(-1)
        stats[f"rollout_rs_{name}_seq_masked_fraction"] = (hit & valid).float().sum() / valid.sum().clamp(min=1)
        keep = keep & kept
    stats["rollout_rs_masked_fraction"] = _mean((~keep).float(), mask)
    stats["rollout_rs_seq_masked_fraction"] = (mask & ~keep).any(-1).float().mean()
    return keep, stats


def offpolicy_metrics(trainer: Tensor, sampler: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """verl's off-policy diagnostics of a batch (``compute_offpolicy_metrics``), under
    ``rollout_corr/``: the trainer's and the sampler's perplexities (the batch mean of each
    response's) and their log difference and ratio, ``KL(sampler || trainer)`` by the direct and
    k3 estimators, and the chi-square divergence of the ratio per token and per response."""
    mask = mask.bool()
    trainer, sampler = trainer.detach().float(), sampler.detach().float()
    lr = trainer - sampler
    mean_trainer, mean_sampler = _row_mean(trainer, mask), _row_mean(sampler, mask)
    log_ppl_diff = mean_sampler - mean_trainer
    seq_lr = torch.where(mask, lr, torch.zeros_like(lr)).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    stats = {
        "training_ppl": torch.exp(-mean_trainer).mean(),
        "training_log_ppl": (-mean_trainer).mean(),
        "kl": _mean(-lr, mask),
        "k3_kl": _mean(torch.exp(lr) - lr - 1, mask),
        "rollout_ppl": torch.exp(-mean_sampler).mean(),
        "rollout_log_ppl": (-mean_sampler).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": _mean(torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(), mask) - 1.0,
        "chi2_seq": torch.exp(2.0 * seq_lr).mean() - 1.0,
    }
    return {PREFIX + k: v for k, v in stats.items()}
