"""Policy-gradient estimators for stale rollouts (method.md sections 2 and 3).

Every estimator is a pure function ``fn(logp, behaviour_logp, mask, advantages, cfg,
ref_logp=None, *, max_new_tokens=None, prox_logp=None)`` returning ``(loss, stats)``. Shapes:
``logp``, ``behaviour_logp``, ``mask`` are ``[B, G, T]`` (B prompts, G responses per prompt, T
response tokens), ``advantages`` is ``[B, G]``. ``logp`` carries the gradient; ``behaviour_logp``
is treated as a constant. ``cfg`` holds the estimator's resolved settings (its registry entry's
:meth:`~gmc.estimators.Estimator.resolved`: the aggregation and mask denominator filled in);
``max_new_tokens`` is the generation's token limit, the divisor of ``seq_sum_const``, which the
update passes (the run's ``sampling.max_new_tokens``); ``prox_logp`` is the proximal policy of
AReaL's decoupled losses (``m2po``, ``kpop``), which the others refuse.

:func:`estimator_loss` makes each of them from a body ``(x: LossInputs, cfg) -> (loss, stats)``
that holds the estimator's own math alone: the shapes are checked, the token and trajectory
log-ratios computed once (:class:`LossInputs`) and the ratio statistics every estimator reports
added in one place.

Each estimator is written as a *coefficient* on the per-token score: its gradient is
``-aggregate(coef * grad log pi)``, with ``coef`` detached. The loss is
``aggregate(-coef * exp(logp - sg(logp)))``: its value is the negative importance-weighted
advantage (terms that a clip switches off contribute 0 instead of a constant) and its
gradient is exactly the estimator's. Variants implemented:

* ``grpo``: token ratio ``r = exp(l)``, PPO clip ``min(r A, clip(r, 1-eps_low, 1+eps_high) A)``.
* ``tic`` (TIC-GRPO, arXiv 2508.02833): trajectory ratio ``rho = exp(sum_t l)`` with an
  upper-only cap. ``truncate``: ``w = min(rho, 1+eps)`` detached. ``ppo_min``:
  ``min(rho A, min(rho, 1+eps) A)`` differentiated through ``rho``.
* ``gmc`` (GMC-GRPO): ``w_i = rho_i * min(1, (1+eps)/m)`` with ``m`` the group mean of ``rho``,
  computed as ``(1+eps) * G * softmax(L)`` when capped, so it is exact for any finite ``L``.
* ``is``: uncapped trajectory importance sampling, ``w = exp(min(L, is_log_ratio_clamp))``.
* ``none``: ``w = 1`` (REINFORCE on stale samples).
* ``gspo`` (arXiv 2507.18071): length-normalised sequence ratio ``s = exp(L / |y|)``, clipped
  to ``[1-gspo_eps_low, 1+gspo_eps_high]`` PPO-style.
* ``tis``: token-level truncated importance sampling, ``w_t = min(r_t, 1+eps)`` detached.
* ``cispo``, ``icepop``, ``seq_mask``, ``m2po``, ``gmpo``, ``dppo``, ``sapo``, ``kpop``,
  ``dppo_kl``, ``prime_dppo``, ``opsm``: the off-policy corrections verl, TRL, AReaL, SkyRL and
  prime-rl ship, in their single-update form (their docstrings name the peers' config keys;
  method.md section 3).

All ratio arithmetic is float32 and in log space. KL to a reference policy (k3 estimator) is
added when ``kl_coef > 0`` and ``ref_logp`` is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from gmc.estimators.registry import AGGREGATIONS, DIVERGENCE_METRICS, EstimatorConfig

TRAJECTORY_ALGORITHMS: tuple[str, ...] = ("tic", "gmc", "is", "none")
ADV_EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Advantages and ratios


def group_advantages(rewards: Tensor, scale: bool = True) -> Tensor:
    """Group-normalised advantages ``(r - mean) / (std + 1e-6)`` per row of ``rewards [B, G]``.

    ``std`` is the population std (``unbiased=False``); ``scale=False`` only centres. Groups
    whose rewards are all equal get exactly zero.
    """
    r = rewards.float()
    centred = r - r.mean(dim=-1, keepdim=True)
    if not scale:
        return centred
    return centred / (r.std(dim=-1, unbiased=False, keepdim=True) + ADV_EPS)


def advantages_for(rewards: Tensor, lengths: Tensor, cfg: EstimatorConfig) -> Tensor:
    """Advantages as ``cfg`` asks: optional length correction, then :func:`group_advantages`."""
    r = rewards.float()
    if cfg.length_corrected:
        r = r / lengths.float().clamp(min=1)
    return group_advantages(r, scale=cfg.scale_advantages)


def token_log_ratios(logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> Tensor:
    """``l = logp - behaviour_logp`` per token, float32, exactly 0 on padding, ``[B, G, T]``."""
    diff = logp.detach().float() - behaviour_logp.float()
    return torch.where(mask.bool(), diff, torch.zeros_like(diff))


def trajectory_log_ratios(logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> Tensor:
    """``L = sum_t (logp - behaviour_logp)`` over response tokens, float32, ``[B, G]``."""
    return token_log_ratios(logp, behaviour_logp, mask).sum(dim=-1)


def log_group_mass(log_ratio: Tensor) -> Tensor:
    """``log m = logsumexp_G(L) - log G`` per group, ``[B]``."""
    return torch.logsumexp(log_ratio.float(), dim=-1) - math.log(log_ratio.shape[-1])


def trajectory_weights(algorithm: str, log_ratio: Tensor, eps: float, is_clamp: float = 20.0) -> Tensor:
    """Detached trajectory weights ``[B, G]`` from log-ratios ``L [B, G]``.

    ``tic``: ``min(rho, 1+eps)``; ``gmc``: ``rho * min(1, (1+eps)/m)``; ``is``:
    ``exp(min(L, is_clamp))``; ``none``: ones. ``tic`` and ``gmc`` are exact and finite for
    every finite ``L``.
    """
    L = log_ratio.detach().float()
    log_cap = math.log1p(eps)
    if algorithm == "tic":
        return torch.exp(torch.clamp(L, max=log_cap))
    if algorithm == "gmc":
        G = L.shape[-1]
        capped = (log_group_mass(L) > log_cap).unsqueeze(-1)
        rescaled = (1.0 + eps) * G * torch.softmax(L, dim=-1)
        # an untouched group has m <= 1+eps, so each of its rho <= G (1+eps): the clamp is inert
        untouched = torch.exp(torch.clamp(L, max=log_cap + math.log(G)))
        return torch.where(capped, rescaled, untouched)
    if algorithm == "is":
        return torch.exp(torch.clamp(L, max=is_clamp))
    if algorithm == "none":
        return torch.ones_like(L)
    raise ValueError(f"unknown trajectory-weight algorithm {algorithm!r}; expected one of {TRAJECTORY_ALGORITHMS}")


# ---------------------------------------------------------------------------------------------
# Shared machinery


@dataclass(frozen=True)
class LossInputs:
    """What an estimator's body sees of a batch (:func:`estimator_loss` builds it once a call, its
    shapes checked): the loss's arguments and the log-ratios every estimator starts from."""

    logp: Tensor  # [B, G, T] the current policy's, carries the gradient
    behaviour_logp: Tensor  # [B, G, T] the behaviour policy's, a constant
    mask: Tensor  # [B, G, T] the response tokens
    advantages: Tensor  # [B, G]
    l_tok: Tensor  # [B, G, T] logp - behaviour_logp per token (token_log_ratios): float32, detached, 0 on padding
    L: Tensor  # [B, G] trajectory log-ratios, sum_t l_tok
    ref_logp: Tensor | None  # [B, G, T] the reference policy's, for the KL term
    prox_logp: Tensor | None  # [B, G, T] a decoupled loss's proximal policy's; None: the current one
    max_new_tokens: int | None  # the generation's token limit, the divisor of seq_sum_const


def _aggregate(per_token: Tensor, mask: Tensor, how: str | None, max_new_tokens: int | None) -> Tensor:
    """Reduce a masked ``[B, G, T]`` tensor to a scalar (see ``EstimatorConfig.aggregation``);
    ``seq_sum_const`` divides each sequence's sum by ``max_new_tokens``, the generation's token
    limit. The mean over sequences counts every row, one ``mask`` keeps no token of too (its
    own mean is 0), as verl's ``global_batch_size``."""
    if how is None:
        raise ValueError(
            "aggregation is None: a loss takes its estimator's resolved settings, REGISTRY[algorithm].resolved(cfg)"
        )
    m = mask.float()
    x = per_token * m
    if how == "token_mean":
        return x.sum() / m.sum().clamp(min=1.0)
    if how == "seq_mean":
        per_row = x.sum(-1) / m.sum(-1).clamp(min=1.0)
    elif how == "seq_sum_const":
        if max_new_tokens is None:
            raise ValueError("seq_sum_const divides each sequence by the generation's token limit: pass max_new_tokens")
        per_row = x.sum(-1) / max_new_tokens
    else:
        raise ValueError(f"unknown aggregation {how!r}; expected one of {AGGREGATIONS}")
    return per_row.mean()


def _pg_loss(
    coef: Tensor, x: LossInputs, cfg: EstimatorConfig, kept: Tensor | None = None
) -> tuple[Tensor, dict[str, float]]:
    """``aggregate(-coef * exp(logp - sg(logp)))`` (+ k3 KL to ``x.ref_logp``); ``coef`` broadcasts
    to ``[B,G,T]``. ``cfg`` holds the estimator's resolved settings
    (:meth:`gmc.estimators.Estimator.resolved`): the aggregation is ``cfg.aggregation``. ``kept``
    (bool, broadcasting to ``[B,G,T]``): what a masking estimator keeps; its coefficient is 0
    elsewhere, and under ``cfg.mask_denominator == "kept"`` the policy-gradient term is aggregated
    over the kept tokens alone: ``token_mean`` divides by the kept tokens, ``seq_mean`` each
    response by its kept tokens (verl's decoupled mode, whose rejection shrinks ``response_mask``);
    ``seq_sum_const``, whose divisor is a constant, is the same under either."""
    how, logp, mask, max_new_tokens = cfg.aggregation, x.logp, x.mask, x.max_new_tokens
    m = mask.bool()
    lp = torch.where(m, logp.float(), torch.zeros_like(logp, dtype=torch.float32))
    unit = torch.exp(lp - lp.detach())  # value 1, gradient grad logp; padding never reaches it
    coef = torch.where(m, coef.detach().float().expand_as(lp), torch.zeros_like(lp))
    if kept is not None and cfg.mask_denominator is None:
        raise ValueError(
            "mask_denominator is None: a loss takes its estimator's resolved settings, "
            "REGISTRY[algorithm].resolved(cfg)"
        )
    if kept is not None and cfg.mask_denominator == "kept":
        pg = _aggregate(-coef * unit, m & kept.bool(), how, max_new_tokens)
    else:
        pg = _aggregate(-coef * unit, mask, how, max_new_tokens)
    stats = {"loss/pg": pg.detach()}
    loss = pg
    if cfg.kl_coef > 0:
        if x.ref_logp is None:
            raise ValueError("EstimatorConfig.kl_coef > 0 needs ref_logp (reference log-probs)")
        delta = torch.where(m, x.ref_logp.float() - lp, torch.zeros_like(lp))
        kl = _aggregate(torch.exp(delta) - delta - 1.0, mask, how, max_new_tokens)
        loss = loss + cfg.kl_coef * kl
        stats["loss/kl"] = kl.detach()
    stats["loss/total"] = loss.detach()
    return loss, stats


def _ratio_stats(log_ratio: Tensor, token_l: Tensor, mask: Tensor) -> dict[str, float]:
    """Diagnostics every estimator reports: log-ratio and group-mass summaries, approx. KL."""
    L = log_ratio.detach().float()
    log_m = log_group_mass(L)
    m = mask.bool()
    l_tok = token_l.clamp(-50, 50)
    k3 = torch.where(m, torch.expm1(l_tok) - l_tok, torch.zeros_like(l_tok))
    q = torch.quantile(log_m, torch.tensor([0.5, 0.9], device=log_m.device))
    return {
        "ratio/log_ratio_mean": L.mean(),
        "ratio/log_ratio_max": L.max(),
        "ratio/log_ratio_min": L.min(),
        "ratio/log_group_mass_p50": q[0],
        "ratio/log_group_mass_p90": q[1],
        "ratio/log_group_mass_max": log_m.max(),
        "ratio/approx_kl": k3.sum() / m.sum().clamp(min=1),
    }


def _weight_stats(w: Tensor, log_ratio: Tensor, shortfall: bool = True) -> dict[str, float]:
    """ESS per group and, for weights that cap the ratios (``w <= rho``), the shortfall
    ``sum(rho - w) / sum(rho)`` (log space)."""
    w = w.float()
    ess = w.sum(-1) ** 2 / (w.pow(2).sum(-1)).clamp(min=torch.finfo(torch.float32).tiny)
    G = w.shape[-1]
    stats = {
        "ratio/ess": ess.mean(),
        "ratio/ess_frac": ess.mean() / G,
        "ratio/weight_mean": w.mean(),
        "ratio/weight_max": w.max(),
    }
    if shortfall:
        log_sum_w = torch.log(w.sum().clamp(min=torch.finfo(torch.float32).tiny))
        log_sum_rho = torch.logsumexp(log_ratio.detach().float().flatten(), dim=0)
        stats["ratio/shortfall"] = -torch.expm1(log_sum_w - log_sum_rho)
    return stats


def _frac(flags: Tensor, mask: Tensor) -> float:
    """Fraction of the valid tokens where ``flags`` holds."""
    m = mask.bool()
    return (flags & m).sum() / m.sum().clamp(min=1)


def _check_shapes(logp: Tensor, behaviour_logp: Tensor, mask: Tensor, advantages: Tensor) -> None:
    if logp.dim() != 3:
        raise ValueError(f"logp must be [B, G, T], got shape {tuple(logp.shape)}")
    if behaviour_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            "logp, behaviour_logp and mask must share a shape; got "
            f"{tuple(logp.shape)}, {tuple(behaviour_logp.shape)}, {tuple(mask.shape)}"
        )
    if advantages.shape != logp.shape[:2]:
        raise ValueError(f"advantages must be [B, G] = {tuple(logp.shape[:2])}, got {tuple(advantages.shape)}")


def estimator_loss(body: Callable | None = None, *, proximal: bool = False):
    """An estimator's loss from its body ``body(x: LossInputs, cfg) -> (loss, stats)``, which holds
    the estimator's own math alone. The loss,
    ``fn(logp, behaviour_logp, mask, advantages, cfg, ref_logp=None, *, max_new_tokens=None,
    prox_logp=None, floats=True) -> (loss, stats)``, checks the shapes, computes the token and
    trajectory log-ratios once (:class:`LossInputs`) and adds to the body's statistics those every
    estimator reports (:func:`_ratio_stats`: log-ratio and group-mass summaries, approx. KL).
    ``proximal``: the body reads a proximal policy (``prox_logp``, AReaL's decoupled losses);
    every other loss refuses one.

    The statistics, computed on the device as 0-dim tensors, are read back as floats all at once
    (one host sync a call); ``floats=False`` leaves them tensors, unread (the update's per-row
    micro-batches, which discard them, so the host never waits on the device between
    micro-batches)."""

    def make(body: Callable) -> Callable:
        def loss(
            logp: Tensor,
            behaviour_logp: Tensor,
            mask: Tensor,
            advantages: Tensor,
            cfg: EstimatorConfig,
            ref_logp: Tensor | None = None,
            *,
            max_new_tokens: int | None = None,
            prox_logp: Tensor | None = None,
            floats: bool = True,
        ) -> tuple[Tensor, dict]:
            if prox_logp is not None and not proximal:
                raise TypeError(f"{body.__name__} has no proximal policy: it takes no prox_logp")
            _check_shapes(logp, behaviour_logp, mask, advantages)
            l_tok = token_log_ratios(logp, behaviour_logp, mask)
            x = LossInputs(
                logp, behaviour_logp, mask, advantages, l_tok, l_tok.sum(-1), ref_logp, prox_logp, max_new_tokens
            )
            value, stats = body(x, cfg)
            stats.update(_ratio_stats(x.L, x.l_tok, x.mask))
            return value, (as_floats(stats) if floats else stats)

        # named and documented as its body; its signature stays its own (the update looks for floats)
        loss.__module__, loss.__name__, loss.__qualname__ = body.__module__, body.__name__, body.__qualname__
        loss.__doc__ = body.__doc__
        return loss

    return make if body is None else make(body)


def as_floats(stats: dict) -> dict[str, float]:
    """``stats`` with every tensor value read as a float, in one transfer from the device."""
    names = [k for k, v in stats.items() if isinstance(v, Tensor)]
    values = torch.stack([stats[k].detach().float().reshape(()) for k in names]).tolist() if names else []
    return {**stats, **dict(zip(names, values))}


# ---------------------------------------------------------------------------------------------
# The estimators: each a body ``(x: LossInputs, cfg) -> (loss, stats)`` made a loss by
# :func:`estimator_loss`


def _ppo_clip(l_tok: Tensor, advantages: Tensor, cfg: EstimatorConfig) -> tuple[Tensor, Tensor]:
    """GRPO's per-token coefficient and what its clip switches off: ``r A`` unless ``A > 0`` and
    ``r > 1 + eps_high`` or ``A < 0`` and ``r < 1 - eps_low`` (PPO's ``min(r A, clip(r) A)``).
    With ``grpo_delta`` (``d``) the objective is TRL's two-sided ``min(min(r, d) A, clip(r) A)``: a
    token of ``A > 0`` is switched off above ``min(d, 1 + eps_high)`` and one of ``A < 0`` also above
    ``max(d, 1 + eps_high)``; for ``d >= 1 + eps_high`` (TRL's recommendation) the first is PPO's
    and the second ``d``, INTELLECT-2's cap of a negative advantage's ratio."""
    r = torch.exp(l_tok.clamp(max=50.0))
    A = advantages.float().unsqueeze(-1).expand_as(r)
    upper, negative_upper = 1 + cfg.eps_high, math.inf
    if cfg.grpo_delta is not None:
        upper, negative_upper = min(cfg.grpo_delta, upper), max(cfg.grpo_delta, upper)
    clipped = ((A > 0) & (r > upper)) | ((A < 0) & ((r < 1 - cfg.eps_low) | (r > negative_upper)))
    return torch.where(clipped, torch.zeros_like(r), r * A), clipped


@estimator_loss
def grpo_loss(x: LossInputs, cfg: EstimatorConfig):
    """Vanilla GRPO: per-token PPO clip of ``r = exp(l)`` (:func:`_ppo_clip`; two-sided with
    ``grpo_delta``)."""
    coef, clipped = _ppo_clip(x.l_tok, x.advantages, cfg)
    loss, stats = _pg_loss(coef, x, cfg)
    stats["ratio/frac_tokens_clipped"] = _frac(clipped, x.mask)
    return loss, stats


def _trajectory_loss(algorithm: str):
    def body(x: LossInputs, cfg: EstimatorConfig):
        L = x.L
        A = x.advantages.float()
        w = trajectory_weights(algorithm, L, cfg.eps, cfg.is_log_ratio_clamp)
        coef = w * A
        stats: dict[str, float] = {}
        if algorithm == "tic":
            capped = L > math.log1p(cfg.eps)
            if cfg.tic_mode == "ppo_min":
                # min(rho A, min(rho,1+eps) A): gradient rho A grad L unless A > 0 and rho capped.
                rho = torch.exp(L.clamp(max=cfg.is_log_ratio_clamp))
                coef = torch.where(capped & (A > 0), torch.zeros_like(A), rho * A)
            stats["ratio/frac_traj_capped"] = capped.float().mean()
        elif algorithm == "gmc":
            capped = log_group_mass(L) > math.log1p(cfg.eps)
            stats["ratio/frac_groups_capped"] = capped.float().mean()
        loss, pg_stats = _pg_loss(coef.unsqueeze(-1), x, cfg)
        stats.update(pg_stats)
        # unit weights (none) are no cap of rho: they have no shortfall
        stats.update(_weight_stats(w, L, shortfall=algorithm != "none"))
        return loss, stats

    body.__name__ = body.__qualname__ = f"{algorithm}_loss"
    body.__doc__ = (
        f"Trajectory estimator ``{algorithm}``: detached weights from :func:`trajectory_weights`"
        " times the advantage on every response token."
        + (" ``cfg.tic_mode`` picks ``truncate`` or ``ppo_min``." if algorithm == "tic" else "")
    )
    return estimator_loss(body)


tic_loss = _trajectory_loss("tic")
gmc_loss = _trajectory_loss("gmc")
is_loss = _trajectory_loss("is")
none_loss = _trajectory_loss("none")


@estimator_loss
def gspo_loss(x: LossInputs, cfg: EstimatorConfig):
    """GSPO: ``s = exp(L/|y|)`` with PPO clip at sequence level; under ``seq_mean`` (its registry
    default) the coefficient ``s A`` on every token is GSPO's ``s A grad(L/|y|)``."""
    lengths = x.mask.float().sum(-1).clamp(min=1.0)
    s = torch.exp((x.L / lengths).clamp(max=50.0))
    A = x.advantages.float()
    clipped = ((A > 0) & (s > 1 + cfg.gspo_eps_high)) | ((A < 0) & (s < 1 - cfg.gspo_eps_low))
    coef = torch.where(clipped, torch.zeros_like(s), s * A)
    loss, stats = _pg_loss(coef.unsqueeze(-1), x, cfg)
    stats["ratio/frac_seq_clipped"] = clipped.float().mean()
    return loss, stats


@estimator_loss
def tis_loss(x: LossInputs, cfg: EstimatorConfig):
    """Token-level truncated IS: ``min(r_t, 1+eps)`` detached times ``A``."""
    log_cap = math.log1p(cfg.eps)
    w_tok = torch.exp(x.l_tok.clamp(max=log_cap))
    coef = w_tok * x.advantages.float().unsqueeze(-1)
    loss, stats = _pg_loss(coef, x, cfg)
    stats["ratio/frac_tokens_clipped"] = _frac(x.l_tok > log_cap, x.mask)
    return loss, stats


# ---------------------------------------------------------------------------------------------
# Corrections the field's RL systems ship (each with its peers' config keys). Their ratio is the
# current policy's over the behaviour's, on every update of a batch (verl's bypass mode), except
# for AReaL's decoupled losses (``m2po``, ``kpop``), which also see a proximal policy: the policy
# at the batch's first update (:func:`_decoupled_weight`).


def _token_ratio(l_tok: Tensor) -> Tensor:
    """``r = exp(l)`` with ``l`` clamped to ``[-20, 20]`` as verl does, so ratios stay finite."""
    return torch.exp(l_tok.clamp(-20.0, 20.0))


def _decoupled_weight(x: LossInputs, cfg: EstimatorConfig) -> tuple[Tensor, Tensor]:
    """AReaL's decoupled PPO (``use_decoupled_loss``) per token, before the advantage: the
    behaviour weight ``exp(l_b)``, ``l_b = log pi_prox - log mu`` (clamped as :func:`_token_ratio`),
    times the proximal ratio ``pi / pi_prox``, or 0 where PPO's clip (:func:`_ppo_clip`, ``eps_low``,
    ``eps_high``) switches that ratio off. AReaL's ``ppo_actor_loss_fn`` (1.0.4, 2.0.0) multiplies
    by the behaviour weight only when ``actor.rejection_sampling`` is set; here it always does.
    ``x.prox_logp`` None: the proximal policy is the current one (the batch's first update), whose
    ratio is exactly 1 and never clipped. Returns the weight and ``l_b``, what AReaL's masks
    measure."""
    prox = x.logp.detach() if x.prox_logp is None else x.prox_logp
    l_behaviour = token_log_ratios(prox, x.behaviour_logp, x.mask)
    l_prox = token_log_ratios(x.logp, prox, x.mask)
    _, clipped = _ppo_clip(l_prox, x.advantages, cfg)
    proximal = torch.where(clipped, torch.zeros_like(l_prox), torch.exp(l_prox.clamp(max=50.0)))
    return _token_ratio(l_behaviour) * proximal, l_behaviour


def _token_mask_loss(weight: Tensor, kept: Tensor, x: LossInputs, cfg: EstimatorConfig) -> tuple[Tensor, dict]:
    """The loss of a correction that masks tokens: ``weight A`` on the tokens ``kept`` keeps and
    nothing on the others (divided as ``cfg.mask_denominator`` says), with the fraction of tokens
    masked."""
    coef = torch.where(kept, weight, torch.zeros_like(weight)) * x.advantages.float().unsqueeze(-1)
    loss, stats = _pg_loss(coef, x, cfg, kept=kept)
    stats["ratio/frac_tokens_masked"] = _frac(~kept, x.mask)
    return loss, stats


@estimator_loss
def cispo_loss(x: LossInputs, cfg: EstimatorConfig):
    """CISPO (MiniMax-M1, arXiv 2506.13585): ``-sg(clip(r, 1-cispo_eps_low, 1+cispo_eps_high)) A
    log pi``; no token's gradient is ever zeroed. verl ``loss_mode=cispo`` (``clip_ratio_low``,
    ``clip_ratio_high``), TRL ``loss_type="cispo"`` (``epsilon_high`` = ``1+cispo_eps_high``)."""
    r = _token_ratio(x.l_tok)
    w = r.clamp(1.0 - cfg.cispo_eps_low, 1.0 + cfg.cispo_eps_high)
    loss, stats = _pg_loss(w * x.advantages.float().unsqueeze(-1), x, cfg)
    stats["ratio/frac_tokens_clipped"] = _frac(w != r, x.mask)
    return loss, stats


@estimator_loss
def icepop_loss(x: LossInputs, cfg: EstimatorConfig):
    """Token-level masked IS (IcePop): ``r A`` on the tokens with ``icepop_low <= r <= icepop_high``,
    0 elsewhere. verl ``rollout_is="token"`` with ``rollout_is_threshold="0.5_5.0"``, TRL
    ``vllm_importance_sampling_mode="token_mask"``. Denominator ``all`` by default: both peers
    zero the weight of a dropped token and keep it in the token count."""
    r = _token_ratio(x.l_tok)
    kept = (r >= cfg.icepop_low) & (r <= cfg.icepop_high)
    return _token_mask_loss(r, kept, x, cfg)


def divergence_keep_mask(l_tok: Tensor, mask: Tensor, metric: str, low: float, high: float) -> Tensor:
    """The valid tokens ``[B, G, T]`` that verl's rejection ``rollout_rs=metric`` keeps
    (:data:`gmc.estimators.registry.DIVERGENCE_METRICS`, ``rollout_corr_helper``): with ``l`` clamped to
    ``[-20, 20]`` as verl does, ``k1 = -l``, ``k2 = l^2 / 2`` and ``k3 = exp(l) - 1 - l`` per token,
    taken per token (``token_*``) or summed, averaged or maximised over each response
    (``seq_sum_*``, ``seq_mean_*``, ``seq_max_*``); a ``k1`` statistic is kept when
    ``log(low) <= stat <= log(high)`` (no lower bound for ``low = 0``), a ``k2`` or ``k3`` one when
    ``stat <= high``."""
    m = mask.bool()
    lr = l_tok.float().clamp(-20.0, 20.0)
    level, k = metric.rsplit("_", 1)
    per_token = {"k1": -lr, "k2": 0.5 * lr.pow(2), "k3": torch.exp(lr) - 1.0 - lr}[k]
    if level == "token":
        stat = per_token
    elif level == "seq_max":
        top = torch.where(m, per_token, torch.full_like(per_token, -math.inf)).amax(-1, keepdim=True)
        stat = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    else:
        total = torch.where(m, per_token, torch.zeros_like(per_token)).sum(-1, keepdim=True)
        stat = total if level == "seq_sum" else total / m.sum(-1, keepdim=True).clamp(min=1)
    if k == "k1":
        keep = stat <= math.log(high)
        if low > 0:
            keep = keep & (stat >= math.log(low))
    else:
        keep = stat <= high
    return m & keep


@estimator_loss
def seq_mask_loss(x: LossInputs, cfg: EstimatorConfig):
    """Sequence-level masked IS: a response is dropped when its metric leaves
    ``[seq_mask_low, seq_mask_high]``. ``seq_mask_metric="rho"``: the metric is the trajectory ratio
    and a kept response is weighted by it (TRL ``vllm_importance_sampling_mode="sequence_mask"``,
    verl ``rollout_is="sequence"`` with a ``lower_upper`` threshold); ``"geo_mean"``: the metric is
    ``exp(L/|y|)`` and a kept response gets weight 1 (verl ``rollout_rs="seq_mean_k1"``, SkyRL
    ``sequence_mask_metric``); one of verl's ``rollout_rs`` divergences (``token_k2``,
    ``seq_mean_k3``, ``seq_max_k2``, ...): what :func:`divergence_keep_mask` keeps gets weight 1, the
    ``token_*`` ones dropping single tokens. Denominator ``all`` by default, as TRL's
    ``sequence_mask``, verl's sequence IS band and, under ``token_mean``, verl's bypass-mode
    rejection (which divides by the batch's valid tokens); verl's decoupled mode rejects by
    shrinking ``response_mask``, i.e. ``mask_denominator="kept"``, which is also its bypass mode
    under ``seq_mean`` (each response divided by its kept tokens)."""
    L, mask = x.L, x.mask
    m = mask.bool()
    A = x.advantages.float()
    if cfg.seq_mask_metric in DIVERGENCE_METRICS:
        kept_tok = divergence_keep_mask(x.l_tok, mask, cfg.seq_mask_metric, cfg.seq_mask_low, cfg.seq_mask_high)
        kept = ~(m & ~kept_tok).any(-1)  # the responses that keep every token
        loss, stats = _pg_loss(kept_tok.float() * A.unsqueeze(-1), x, cfg, kept=kept_tok)
        stats["ratio/frac_seq_masked"] = (~kept).float().mean()
        stats["ratio/frac_tokens_masked"] = _frac(~kept_tok, mask)
        if not cfg.seq_mask_metric.startswith("token_"):
            stats.update(_weight_stats(kept.float(), L, shortfall=False))
        return loss, stats
    lengths = mask.float().sum(-1).clamp(min=1.0)
    log_low = math.log(cfg.seq_mask_low) if cfg.seq_mask_low > 0 else -math.inf
    log_high = math.log(cfg.seq_mask_high)
    stat = L if cfg.seq_mask_metric == "rho" else L / lengths
    kept = (stat >= log_low) & (stat <= log_high)
    if cfg.seq_mask_metric == "rho":
        w = torch.where(kept, torch.exp(L.clamp(max=log_high)), torch.zeros_like(L))
    else:
        w = kept.float()
    loss, stats = _pg_loss((w * A).unsqueeze(-1), x, cfg, kept=kept.unsqueeze(-1))
    stats["ratio/frac_seq_masked"] = (~kept).float().mean()
    stats["ratio/frac_tokens_masked"] = _frac(~kept.unsqueeze(-1).expand_as(m), mask)
    stats.update(_weight_stats(w, L, shortfall=cfg.seq_mask_metric == "rho"))
    return loss, stats


def m2po_keep_mask(l_tok: Tensor, mask: Tensor, tau: float) -> Tensor:
    """M2PO's token mask ``[B, G, T]`` over the whole batch: sort the valid tokens by ``(log r)^2``
    descending and drop the first ``k``, the least for which the mean of the rest is ``< tau``; if
    no ``k`` gets there, all but the smallest one are dropped (AReaL's ``_apply_m2po_masking``).
    Ties keep their order (stable sort)."""
    m = mask.bool()
    m2 = l_tok.float().pow(2)[m]
    if m2.numel() == 0:
        return m
    sorted_m2, order = torch.sort(m2, descending=True, stable=True)
    n = sorted_m2.numel()
    counts = torch.arange(n, 0, -1, dtype=sorted_m2.dtype, device=m2.device)
    suffix_mean = sorted_m2.flip(0).cumsum(0).flip(0) / counts
    below = torch.nonzero(suffix_mean < tau)
    k = int(below[0]) if below.numel() else n - 1
    keep_sorted = torch.arange(n, device=m2.device) >= k
    keep = torch.empty_like(keep_sorted)
    keep[order] = keep_sorted
    out = torch.zeros_like(m)
    out[m] = keep
    return out


@estimator_loss(proximal=True)
def m2po_loss(x: LossInputs, cfg: EstimatorConfig):
    """M2PO (arXiv 2510.01161) in AReaL's decoupled loss: the tokens :func:`m2po_keep_mask` keeps
    (threshold ``m2po_tau``, AReaL ``actor.m2_threshold``) by ``(log r)^2`` between the behaviour and
    the proximal policy ``prox_logp`` (the policy at the batch's first update; None: the current
    one), weighted by :func:`_decoupled_weight`. At a batch's first update that is ``r A`` on the
    kept tokens, no clip. Denominator ``kept`` by default, as AReaL: its ``grpo_loss_fn`` narrows
    ``loss_mask`` to the kept tokens before the loss divides by that mask's count. AReaL 1.0.4's
    M2PO with ``use_decoupled_loss`` and a ``rejection_sampling`` that rejects nothing (without one
    AReaL leaves the behaviour weight out; its example's ``{metric: ratio, upper: 5.0}`` also drops
    the tokens of behaviour weight above 5); AReaL masks each micro-batch, this the whole batch."""
    weight, l_behaviour = _decoupled_weight(x, cfg)
    kept = m2po_keep_mask(l_behaviour, x.mask, cfg.m2po_tau)
    loss, stats = _token_mask_loss(weight, kept, x, cfg)
    m = x.mask.bool()
    stats["ratio/m2"] = torch.where(m, l_behaviour.float().pow(2), 0.0).sum() / m.sum().clamp(min=1)
    return loss, stats


@estimator_loss
def gmpo_loss(x: LossInputs, cfg: EstimatorConfig):
    """GMPO (arXiv 2507.20673): ``-A exp(mean_t clip(l_t))`` with each token's log-ratio clipped
    sign-aware before the geometric mean (to at most ``gmpo_clip_high`` for ``A > 0``, at least
    ``-gmpo_clip_low`` for ``A < 0``); unlike ``gspo``, which clips the geometric mean itself.
    verl ``loss_mode=geo_mean`` (``clip_ratio_low``, ``clip_ratio_high``). Gradient ``A s / |y|`` on
    every unclipped token, which ``seq_mean`` (its registry default: verl takes the mean over
    sequences) turns into GMPO's ``A s / |y|``."""
    l_tok = x.l_tok
    A = x.advantages.float().unsqueeze(-1).expand_as(l_tok)
    clipped = ((A > 0) & (l_tok > cfg.gmpo_clip_high)) | ((A < 0) & (l_tok < -cfg.gmpo_clip_low))
    l_clip = torch.where(clipped, l_tok.clamp(-cfg.gmpo_clip_low, cfg.gmpo_clip_high), l_tok)
    lengths = x.mask.float().sum(-1).clamp(min=1.0)
    s = torch.exp((l_clip.sum(-1) / lengths).clamp(max=50.0))
    coef = torch.where(clipped, torch.zeros_like(A), A * s.unsqueeze(-1))
    loss, stats = _pg_loss(coef, x, cfg)
    stats["ratio/frac_tokens_clipped"] = _frac(clipped, x.mask)
    return loss, stats


@estimator_loss
def dppo_loss(x: LossInputs, cfg: EstimatorConfig):
    """DPPO, total-variation form (arXiv 2602.04879): mask a token whose probability moved more
    than ``dppo_delta_high`` up (``A > 0``) or ``dppo_delta_low`` down (``A <= 0``); the rest get
    ``min(r, dppo_ratio_cap) A``. verl ``loss_mode=dppo_tv`` (``clip_ratio_low``,
    ``clip_ratio_high``, ``clip_ratio_c``, 3.0 in verl's ``ActorConfig`` where ``dppo_ratio_cap``
    is 20); prime-rl's default loss is the same mask without the cap and with a penalty
    (``prime_dppo``). Denominator ``all`` by default: verl multiplies the masked tokens' loss by 0
    under the unchanged ``response_mask``."""
    weight = _token_ratio(x.l_tok).clamp(max=cfg.dppo_ratio_cap)
    return _token_mask_loss(weight, _tv_keeps(x, cfg), x, cfg)


def _tv_keeps(x: LossInputs, cfg: EstimatorConfig) -> Tensor:
    """DPPO's total-variation trust region: the tokens whose probability rose by at most
    ``dppo_delta_high`` (``A > 0``) or fell by at most ``dppo_delta_low`` (``A <= 0``)."""
    dp = torch.where(x.mask.bool(), torch.exp(x.logp.detach().float()) - torch.exp(x.behaviour_logp.float()), 0.0)
    A = x.advantages.float().unsqueeze(-1).expand_as(dp)
    return torch.where(A > 0, dp <= cfg.dppo_delta_high, dp >= -cfg.dppo_delta_low)


def _binary_kl(log_p: Tensor, log_q: Tensor, eps: float) -> Tensor:
    """``KL(Bern(p) || Bern(q))`` from log-probabilities, ``p`` and ``q`` clamped to ``[eps, 1 - eps]``
    (AReaL's ``compute_binary_kl_divergence``), in float64: in float32 ``1 - 1e-8`` rounds to 1,
    and two near-certain tokens would give ``0 / 0``."""
    p = torch.exp(log_p.double()).clamp(eps, 1.0 - eps)
    q = torch.exp(log_q.double()).clamp(eps, 1.0 - eps)
    return p * torch.log(p / q) + (1.0 - p) * torch.log((1.0 - p) / (1.0 - q))


@estimator_loss
def dppo_kl_loss(x: LossInputs, cfg: EstimatorConfig):
    """DPPO, binary-KL form (arXiv 2602.04879; verl ``loss_mode=dppo_kl``): each token's
    behaviour and current probabilities ``q`` and ``p`` as two Bernoulli distributions, ``D =
    q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))`` (verl's form); a token of positive
    advantage is masked where ``D > dppo_kl_high`` and its probability rose, one of negative
    advantage where ``D > dppo_kl_low`` and it fell; the rest get ``min(r, dppo_ratio_cap) A``.
    Denominator ``all``, as verl's."""
    l_tok = x.l_tok
    m = x.mask.bool()
    p = torch.where(m, torch.exp(x.logp.detach().float()), 0.0)
    q = torch.where(m, torch.exp(x.behaviour_logp.float()), 0.0)
    D = q * -l_tok + (1.0 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
    A = x.advantages.float().unsqueeze(-1).expand_as(l_tok)
    valid = torch.where(A > 0, (D <= cfg.dppo_kl_high) | (p <= q), (D <= cfg.dppo_kl_low) | (p >= q))
    weight = _token_ratio(l_tok).clamp(max=cfg.dppo_ratio_cap)
    return _token_mask_loss(weight, valid, x, cfg)


@estimator_loss
def prime_dppo_loss(x: LossInputs, cfg: EstimatorConfig):
    """prime-rl's default loss (``loss.type=default``): DPPO's total-variation mask
    (``dppo_delta_low``, ``dppo_delta_high``; prime-rl's ``dppo_mask_low``, ``dppo_mask_high``), the
    kept tokens' ``r A`` with no cap, and Kimi K2.5's penalty ``prime_kl_tau (log r)^2`` on every
    valid token, kept or masked (``kl_tau``), which pulls a stale token back towards its behaviour
    probability with a gradient ``2 prime_kl_tau log r``. Denominator ``all``: prime-rl sums the
    per-token loss over the batch's loss-mask tokens and divides by their count."""
    loss, stats = _token_mask_loss(_token_ratio(x.l_tok), _tv_keeps(x, cfg), x, cfg)
    log_r = torch.where(x.mask.bool(), x.logp.float() - x.behaviour_logp.float(), 0.0)  # with its gradient
    penalty = _aggregate(log_r.pow(2), x.mask, cfg.aggregation, x.max_new_tokens)
    loss = loss + cfg.prime_kl_tau * penalty
    stats["loss/ratio_penalty"] = penalty.detach()
    stats["loss/total"] = loss.detach()
    return loss, stats


@estimator_loss(proximal=True)
def kpop_loss(x: LossInputs, cfg: EstimatorConfig):
    """KPop (AReaL 2.0.0 ``actor.rejection_sampling`` with ``metric=binary_kl``, ``level=token``,
    ``action=mask``) in AReaL's decoupled loss: each token's proximal (``prox_logp``, the policy at
    the batch's first update; None: the current one) and behaviour probabilities as two Bernoulli
    distributions (clamped to ``[1e-8, 1 - 1e-8]``), a token masked where the larger of the forward
    and reverse binary KL exceeds ``kpop_threshold``; the rest weighted by
    :func:`_decoupled_weight`, which at a batch's first update is ``r A``. Denominator ``all``: AReaL
    divides by the loss mask's count before the rejection."""
    weight, _ = _decoupled_weight(x, cfg)
    lp, lb = (x.logp.detach() if x.prox_logp is None else x.prox_logp), x.behaviour_logp
    divergence = torch.maximum(_binary_kl(lp, lb, 1e-8), _binary_kl(lb, lp, 1e-8))
    kept = x.mask.bool() & (divergence <= cfg.kpop_threshold)
    return _token_mask_loss(weight, kept, x, cfg)


@estimator_loss
def opsm_loss(x: LossInputs, cfg: EstimatorConfig):
    """GRPO with DeepSeek-V3.2's off-policy sequence mask (TRL ``off_policy_mask_threshold``):
    GRPO's clipped coefficient (:func:`_ppo_clip`, two-sided with ``grpo_delta``), and a response
    of negative advantage whose mean per-token ``log mu - log pi`` exceeds ``opsm_threshold``
    dropped whole. Denominator ``all``: TRL multiplies the dropped responses' loss by 0."""
    coef, clipped = _ppo_clip(x.l_tok, x.advantages, cfg)
    lengths = x.mask.float().sum(-1).clamp(min=1.0)
    kept_rows = (x.advantages.float() >= 0) | (-x.L / lengths <= cfg.opsm_threshold)
    kept = kept_rows.unsqueeze(-1).expand_as(x.l_tok)
    loss, stats = _pg_loss(torch.where(kept, coef, 0.0), x, cfg, kept=kept)
    stats["ratio/frac_seq_masked"] = (~kept_rows).float().mean()
    stats["ratio/frac_tokens_clipped"] = _frac(clipped & kept, x.mask)
    return loss, stats


@estimator_loss
def sapo_loss(x: LossInputs, cfg: EstimatorConfig):
    """SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): a smooth sigmoid gate on the token
    ratio in place of PPO's hard clip. The peers' loss is ``-f(r) A`` with
    ``f(r) = sigmoid(tau (r - 1)) 4 / tau``, ``tau = sapo_tau_pos`` where ``A > 0`` and
    ``sapo_tau_neg`` elsewhere; its gradient ``4 s (1 - s) r A grad log pi`` (``s = sigmoid(tau (r -
    1))``) is the plain one at ``r = 1`` and fades smoothly, never to exactly 0, as ``r`` leaves 1.
    verl ``loss_mode=sapo`` (``actor.tau_pos``, ``actor.tau_neg``; it takes the mean per sequence
    whatever its ``loss_agg_mode``), TRL ``loss_type="sapo"`` (``sapo_temperature_pos``,
    ``sapo_temperature_neg``; mean per sequence), AReaL ``actor.use_sapo_loss`` (which averages over
    the batch's tokens instead). ``ratio/frac_tokens_damped``: the tokens whose gradient the gate at
    least halves (``4 s (1 - s) <= 1/2``; at the default temperatures, ratios above about 2.76)."""
    r = _token_ratio(x.l_tok)
    A = x.advantages.float().unsqueeze(-1).expand_as(r)
    tau = torch.where(A > 0, torch.full_like(r, cfg.sapo_tau_pos), torch.full_like(r, cfg.sapo_tau_neg))
    z = tau * (r - 1.0)
    damp = 4.0 * torch.sigmoid(z) * torch.sigmoid(-z)  # f'(r) = 4 s (1 - s), exact in both tails
    loss, stats = _pg_loss(damp * r * A, x, cfg)
    stats["ratio/frac_tokens_damped"] = _frac(damp <= 0.5, x.mask)
    return loss, stats
