"""What tables, figures and training summaries show of each estimator, by config name: its
label, its colour and the names of its own diagnostics (method.md section 3).

Kept apart from :mod:`gmc.estimators` so that reading results (``gmc tables``, ``gmc figures``)
needs no torch. :data:`gmc.estimators.ESTIMATORS` maps the same names to the loss functions;
``tests/test_registries.py`` keeps the two in step and checks that every estimator reports the
diagnostics named here.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from gmc.settings import NonNegative, PositiveInt, settings

Aggregation = Literal["token_mean", "seq_mean", "seq_sum_const"]
AGGREGATIONS: tuple[str, ...] = typing.get_args(Aggregation)


@settings(prefix="estimator.")
class EstimatorConfig:
    """Hyper-parameters of the estimators (method.md section 3).

    Every field is part of a run's parameters, so a result names the variant that made it.
    """

    eps: NonNegative = 0.2
    """Trajectory cap: ``tic`` and ``gmc`` cap ratios at ``1+eps``; ``tis`` caps token ratios
    there too. The paper's threshold; default 0.2 (method.md section 6)."""
    eps_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """``grpo`` token clip, lower side: ratios below ``1-eps_low`` stop pulling. Default 0.2."""
    eps_high: NonNegative = 0.2
    """``grpo`` token clip, upper side: ratios above ``1+eps_high`` stop pushing. Default 0.2."""
    gspo_eps_low: NonNegative = 3e-4
    """``gspo`` sequence-ratio clip, lower side (GSPO paper's value)."""
    gspo_eps_high: NonNegative = 4e-4
    """``gspo`` sequence-ratio clip, upper side (GSPO paper's value)."""
    tic_mode: Literal["truncate", "ppo_min"] = "truncate"
    """TIC-GRPO semantics [choice]: ``truncate`` (detached ``min(rho, 1+eps)``) or ``ppo_min``
    (``min(rho A, min(rho, 1+eps) A)`` with the gradient through ``rho``)."""
    length_corrected: bool = False
    """Divide each reward by its response length before group normalisation (TIC option)."""
    scale_advantages: bool = True
    """Divide group-centred rewards by the group's std (+1e-6); False: centring only."""
    aggregation: Aggregation | None = None
    """``token_mean`` (all tokens of the batch), ``seq_mean`` (mean per sequence, then over
    sequences) or ``seq_sum_const`` (sum per sequence / ``max_new_tokens``, then mean over
    sequences). None: the estimator's default (``seq_mean`` for grpo, gspo, tis, gmpo;
    ``seq_sum_const`` for tic, gmc, is, none; ``token_mean`` for cispo, icepop, seq_mask, m2po,
    dppo, as their peers)."""
    max_new_tokens: PositiveInt = 512
    """The constant divisor of ``seq_sum_const``: the generation token limit (a training run
    sets it to its ``sampling.max_new_tokens``)."""
    is_log_ratio_clamp: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 20.0
    """Upper bound on ``L`` for ``is`` and for ``tic``'s ``ppo_min`` negative-advantage branch
    (``exp(20)`` ~ 4.9e8), so uncapped weights stay finite."""
    kl_coef: NonNegative = 0.0
    """Weight of the k3 KL penalty to the reference policy; 0 (off) by default."""
    cispo_eps_low: NonNegative = 10.0
    """``cispo`` lower clip of the token ratio at ``1-cispo_eps_low``: verl's CISPO recipe
    (``actor.clip_ratio_low=10``), i.e. no lower clip, as in MiniMax-M1."""
    cispo_eps_high: NonNegative = 0.2
    """``cispo`` upper clip of the token ratio at ``1+cispo_eps_high``: verl's CISPO recipe
    (``actor.clip_ratio_high=0.2``); TRL's ``epsilon_high`` is the absolute bound ``1+cispo_eps_high``."""
    icepop_low: NonNegative = 0.5
    """``icepop`` keeps a token only if its ratio is ``>= icepop_low``: IcePop's 0.5 (verl
    ``rollout_is_threshold="0.5_5.0"``, TRL ``vllm_importance_sampling_clip_min``)."""
    icepop_high: Annotated[float, Field(gt=0)] = 5.0
    """``icepop`` keeps a token only if its ratio is ``<= icepop_high``: IcePop's 5.0."""
    seq_mask_metric: Literal["rho", "geo_mean"] = "rho"
    """What ``seq_mask`` bounds [choice]: ``rho`` (the trajectory ratio; kept responses are weighted
    by rho, TRL ``vllm_importance_sampling_mode="sequence_mask"``, verl ``rollout_is="sequence"``
    with a ``lower_upper`` threshold) or ``geo_mean`` (``exp(L/|y|)``; kept responses get weight 1,
    a pure rejection as verl ``rollout_rs="seq_mean_k1"``, whose ``lower_upper`` bounds apply to
    ``1/exp(L/|y|)``, and SkyRL's ``sequence_mask_metric``)."""
    seq_mask_low: NonNegative = 0.0
    """``seq_mask`` drops a response whose metric is below this (TRL's
    ``vllm_importance_sampling_clip_min``: None, i.e. 0 here). For ``geo_mean`` set bounds near 1."""
    seq_mask_high: Annotated[float, Field(gt=0)] = 3.0
    """``seq_mask`` drops a response whose metric is above this (TRL's
    ``vllm_importance_sampling_clip_max``: 3.0)."""
    m2po_tau: Annotated[float, Field(gt=0)] = 0.04
    """``m2po`` masks the tokens of largest ``(log r)^2`` until the batch mean of the rest is below
    ``m2po_tau`` (AReaL ``actor.m2_threshold``; 0.04 in its M2PO example)."""
    gmpo_clip_low: NonNegative = 0.4
    """``gmpo`` clips each token's log-ratio from below at ``-gmpo_clip_low`` (for negative
    advantages) before the geometric mean: GMPO's ``(-0.4, 0.4)`` (verl ``loss_mode=geo_mean``
    with ``actor.clip_ratio_low``)."""
    gmpo_clip_high: NonNegative = 0.4
    """``gmpo`` clips each token's log-ratio from above at ``gmpo_clip_high`` (for positive
    advantages): GMPO's 0.4 (verl ``actor.clip_ratio_high``)."""
    dppo_delta_low: NonNegative = 0.2
    """``dppo`` masks a token of negative advantage whose probability fell by more than this
    (verl ``loss_mode=dppo_tv`` with ``actor.clip_ratio_low``; prime-rl's ``dppo_mask_low``: 0.2)."""
    dppo_delta_high: NonNegative = 0.2
    """``dppo`` masks a token of positive advantage whose probability rose by more than this
    (verl ``actor.clip_ratio_high``; prime-rl's ``dppo_mask_high``: 0.2)."""
    dppo_ratio_cap: Annotated[float, Field(gt=0)] = 20.0
    """``dppo`` truncates the kept tokens' ratio at this: verl ``dppo_tv``'s ``clip_ratio_c``
    fallback of 20, which it recommends large (its ``ActorConfig`` shares 3.0 with dual-clip PPO)."""



@dataclass(frozen=True)
class Estimator:
    """How results show one registered estimator."""

    label: str
    """Name in figure legends and reports."""
    diagnostics: tuple[str, ...]
    """Its own clip/cap statistics among the stats its loss returns (tables and summaries report them)."""
    color: str
    """Matplotlib colour of its lines."""


REGISTRY: dict[str, Estimator] = {
    "grpo": Estimator("GRPO", ("ratio/frac_tokens_clipped",), "tab:blue"),
    "tic": Estimator("TIC-GRPO", ("ratio/frac_traj_capped",), "tab:orange"),
    "gmc": Estimator("GMC-GRPO", ("ratio/frac_groups_capped",), "tab:green"),
    "is": Estimator("IS (uncapped)", (), "tab:red"),
    "none": Estimator("no correction", (), "tab:gray"),
    "gspo": Estimator("GSPO", ("ratio/frac_seq_clipped",), "tab:purple"),
    "tis": Estimator("token TIS", ("ratio/frac_tokens_clipped",), "tab:brown"),
    "cispo": Estimator("CISPO", ("ratio/frac_tokens_clipped",), "tab:pink"),
    "icepop": Estimator("IcePop (token mask)", ("ratio/frac_tokens_masked",), "tab:olive"),
    "seq_mask": Estimator("sequence mask", ("ratio/frac_seq_masked",), "tab:cyan"),
    "m2po": Estimator("M2PO", ("ratio/frac_tokens_masked",), "goldenrod"),
    "gmpo": Estimator("GMPO", ("ratio/frac_tokens_clipped",), "black"),
    "dppo": Estimator("DPPO (TV)", ("ratio/frac_tokens_masked",), "teal"),
}
"""Every estimator by config name (``algorithm``), in the order tables and figures use."""

SHARED_DIAGNOSTICS: tuple[str, ...] = ("ratio/ess_frac", "ratio/shortfall")
"""Statistics of the trajectory weights that the tables report for every estimator that has them."""


def diagnostic_names() -> list[str]:
    """Every registered estimator's own diagnostics, then the shared ones, without repeats."""
    return list(dict.fromkeys([*(d for e in REGISTRY.values() for d in e.diagnostics), *SHARED_DIAGNOSTICS]))
