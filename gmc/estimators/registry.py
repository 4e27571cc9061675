"""The estimator registry and settings (method.md section 3), torch-free: :class:`EstimatorConfig`
(every estimator's hyper-parameters) and :data:`REGISTRY`, one :class:`Estimator` entry per
estimator: where its loss is, its defaults (aggregation, mask denominator), what it reduces to
on-policy, whether it needs batch statistics, and what tables, figures and training summaries
show of it (label, colour, diagnostics).

An entry resolves its estimator's defaults once (:meth:`Estimator.resolved`) and the loss
receives those resolved settings; no loss looks itself up here. The loss is named as
``module:function`` and imported only when it is needed (:meth:`Estimator.loss_function`,
:func:`get_estimator`), so that reading results needs no torch.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from gmc.settings import NonNegative, Positive, load_named, settings

Aggregation = Literal["token_mean", "seq_mean", "seq_sum_const"]
AGGREGATIONS: tuple[str, ...] = typing.get_args(Aggregation)
MaskDenominator = Literal["all", "kept"]
SeqMaskMetric = Literal[
    "rho",
    "geo_mean",
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
]
DIVERGENCE_METRICS: tuple[str, ...] = typing.get_args(SeqMaskMetric)[2:]
"""verl's rejection metrics (``rollout_rs``): per token ``k1 = -l``, ``k2 = l^2 / 2``,
``k3 = exp(l) - 1 - l``, or their sum, mean or maximum over a response."""


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
    sequences) or ``seq_sum_const`` (sum per sequence / the run's ``sampling.max_new_tokens``,
    then mean over sequences). None: the estimator's default, the ``aggregation`` of its
    :data:`REGISTRY` entry."""
    mask_denominator: MaskDenominator | None = None
    """Where an estimator drops tokens or responses (``icepop``, ``seq_mask``, ``m2po``, ``dppo``,
    ``kpop``, ``dppo_kl``, ``prime_dppo``, ``opsm``), what the aggregation divides by [choice]:
    ``all``, every valid token, the dropped ones contributing 0 (TRL's masks, verl's IcePop and
    sequence masks, ``dppo_tv`` and, under ``token_mean``, its bypass mode's rejection, prime-rl's
    DPPO, AReaL's ``rejection_sampling``); ``kept``, only the tokens the mask keeps: ``token_mean``
    divides by the kept tokens, ``seq_mean`` each response by its kept tokens (a response that
    keeps none adds 0 and still counts among the responses), ``seq_sum_const`` is the same under
    either (AReaL's M2PO; verl's rejection ``rollout_rs`` in its decoupled mode under every
    aggregation, and in its bypass mode under ``seq_mean``). None: the estimator's default, the
    ``mask_denominator`` of its :data:`REGISTRY` entry. Estimators that drop nothing ignore it;
    the KL term and ``prime_dppo``'s penalty always divide by every valid token."""
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
    seq_mask_metric: SeqMaskMetric = "rho"
    """What ``seq_mask`` bounds [choice]: ``rho`` (the trajectory ratio; kept responses are weighted
    by rho, TRL ``vllm_importance_sampling_mode="sequence_mask"``, verl ``rollout_is="sequence"``
    with a ``lower_upper`` threshold), ``geo_mean`` (``exp(L/|y|)``; kept responses get weight 1,
    a pure rejection as verl ``rollout_rs="seq_mean_k1"``, whose ``lower_upper`` bounds apply to
    ``1/exp(L/|y|)``, and SkyRL's ``sequence_mask_metric``), or one of verl's ``rollout_rs``
    divergences by its name (:data:`DIVERGENCE_METRICS`; a pure rejection, kept tokens get weight
    1): ``token_*`` drop single tokens, ``seq_*`` whole responses; a ``*_k1`` metric is kept when
    ``exp(k1)`` lies in ``[seq_mask_low, seq_mask_high]`` (verl's ``"low_high"`` threshold), a
    ``*_k2`` / ``*_k3`` one when it is at most ``seq_mask_high`` (verl's single threshold)."""
    seq_mask_low: NonNegative = 0.0
    """``seq_mask`` drops a response whose metric is below this (TRL's
    ``vllm_importance_sampling_clip_min``: None, i.e. 0 here). For ``geo_mean`` set bounds near 1;
    the k2 and k3 divergences have no lower bound."""
    seq_mask_high: Annotated[float, Field(gt=0)] = 3.0
    """``seq_mask`` drops a response (a token, for ``token_*`` metrics) whose metric is above this
    (TRL's ``vllm_importance_sampling_clip_max``: 3.0)."""
    m2po_tau: Annotated[float, Field(gt=0)] = 0.04
    """``m2po`` masks the tokens of largest ``(log r)^2`` until the batch mean of the rest is below
    ``m2po_tau`` (AReaL ``actor.m2_threshold``; 0.04 in AReaL 1.0.4's
    ``examples/math/gsm8k_m2po.yaml``)."""
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
    """``dppo`` and ``dppo_kl`` truncate the kept tokens' ratio at this (verl's ``clip_ratio_c`` in
    ``loss_mode=dppo_tv`` and ``dppo_kl``). 20 is gmc's choice: verl 0.9.1's ``ActorConfig``
    (``verl/workers/config/actor.py``) sets 3.0, shared with dual-clip PPO, its losses fall back to
    20 only for a config without the key, and its DPPO example
    (``examples/dppo_trainer/run_qwen30b_dppo.sh``) sets 1e4, no cap."""
    dppo_kl_low: NonNegative = 0.05
    """``dppo_kl`` masks a token of negative advantage whose probability fell while the binary KL
    between its behaviour and current probabilities exceeds this (verl ``loss_mode=dppo_kl`` with
    ``actor.clip_ratio_low``: 0.05 in verl's DPPO recipe)."""
    dppo_kl_high: NonNegative = 0.05
    """``dppo_kl`` masks a token of positive advantage whose probability rose while the binary KL
    exceeds this (verl ``actor.clip_ratio_high``: 0.05 in verl's DPPO recipe)."""
    prime_kl_tau: NonNegative = 1e-3
    """``prime_dppo``'s weight of the squared log-ratio penalty ``(log r)^2`` on every valid token
    (prime-rl ``loss.kl_tau``: 1e-3)."""
    kpop_threshold: Annotated[float, Field(gt=0)] = 2.0
    """``kpop`` masks a token where the larger of the two binary KL divergences between its current
    and behaviour probabilities exceeds this (AReaL 2.0.0 ``actor.rejection_sampling.upper`` with
    ``metric=binary_kl``: 2.0 in its ``examples/math/gsm8k_kpop.yaml``)."""
    opsm_threshold: Annotated[float, Field(gt=0)] = 0.5
    """``opsm`` drops a response of negative advantage whose mean per-token ``log mu - log pi``
    exceeds this (TRL ``off_policy_mask_threshold``, the ``delta`` of DeepSeek-V3.2's off-policy
    sequence mask; TRL's example value 0.5, its default None leaves the mask off)."""
    grpo_delta: Annotated[float, Field(gt=1)] | None = None
    """Two-sided clipping of ``grpo`` and ``opsm``, TRL's ``delta`` (INTELLECT-2): the objective
    ``min(min(r, grpo_delta) A, clip(r) A)`` of TRL 1.16's ``GRPOTrainer._compute_loss``. Above
    ``1 + eps_high`` (TRL's recommendation) a token of negative advantage whose ratio exceeds it
    stops pulling too, so no single stale token's ratio can scale the loss without bound; below,
    it is the upper clip of a positive advantage's ratio and a negative one's is clipped at
    ``1 + eps_high``. None (TRL's default): the one-sided PPO clip."""
    sapo_tau_pos: Positive = 1.0
    """``sapo``'s gate temperature for tokens of positive advantage: verl ``actor.tau_pos``, TRL
    ``sapo_temperature_pos``, AReaL ``actor.sapo_tau_pos`` (all 1.0)."""
    sapo_tau_neg: Positive = 1.05
    """``sapo``'s gate temperature for the other tokens (``A <= 0``): verl ``actor.tau_neg``, TRL
    ``sapo_temperature_neg``, AReaL ``actor.sapo_tau_neg`` (all 1.05)."""


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: its loss, what it declares of itself, and how results show it."""

    loss: str
    """``module:function`` of its loss ``fn(logp, behaviour_logp, mask, advantages, cfg,
    ref_logp=None, *, max_new_tokens=None, prox_logp=None) -> (loss, stats)`` (``prox_logp`` given
    to a :attr:`proximal` one alone), with ``cfg`` the settings :meth:`resolved` gives; imported
    when the loss is needed (:meth:`loss_function`)."""
    label: str
    """Name in figure legends and reports."""
    color: str
    """Matplotlib colour of its lines."""
    diagnostics: tuple[str, ...]
    """Its own clip/cap statistics among the stats its loss returns (tables and summaries report them)."""
    aggregation: Aggregation
    """Its default aggregation (``EstimatorConfig.aggregation`` None: this one, :meth:`resolved`)."""
    on_policy: Hashable | None
    """What its loss reduces to when every ratio is exactly 1 (default hyper-parameters):
    ``("pg", aggregation)``, the plain policy gradient ``-aggregate(A grad log pi)``; None when
    it does not reduce to a plain policy gradient. Estimators of one class give equal losses and
    gradients on-policy under every aggregation (``tests/estimators/test_losses.py``)."""
    needs_batch_stats: bool
    """Its weights need statistics of a group or of the batch before the backward pass (gmc's
    group mass, m2po's batch second moment); False: every response's weights follow from its
    own row, so a row's gradient does not depend on the rows batched with it."""
    mask_denominator: MaskDenominator | None = None
    """For an estimator that drops tokens or responses, its default ``EstimatorConfig.mask_denominator``:
    that of the peer it follows; None: it drops nothing (both denominators are then the same)."""
    proximal: bool = False
    """Its loss also sees a proximal policy, the policy at the first update of the batch
    (``prox_logp``, AReaL's decoupled PPO): with several updates per batch the trainer computes it
    with one no-grad pass before the batch's first update; False: its ratios are the current
    policy's over the behaviour's on every update."""

    def resolved(self, cfg: EstimatorConfig) -> EstimatorConfig:
        """``cfg`` with this estimator's defaults where it leaves them None: its
        :attr:`aggregation` and, for an estimator that drops tokens or responses, its
        :attr:`mask_denominator`. What its loss and everything that reasons about it takes."""
        return dataclasses.replace(
            cfg,
            aggregation=cfg.aggregation or self.aggregation,
            mask_denominator=cfg.mask_denominator or self.mask_denominator,
        )

    def needs_batch_stats_under(self, cfg: EstimatorConfig) -> bool:
        """Whether its loss under the resolved settings ``cfg`` needs statistics of the batch
        before the backward pass: its own (:attr:`needs_batch_stats`), or, for an estimator that
        drops tokens or responses, a ``kept`` denominator under ``token_mean`` (the tokens every
        row keeps; under the other aggregations each row's denominator is its own)."""
        kept_tokens = cfg.mask_denominator == "kept" and cfg.aggregation == "token_mean"
        return self.needs_batch_stats or (self.mask_denominator is not None and kept_tokens)

    def on_policy_class(self, cfg: EstimatorConfig) -> Hashable | None:
        """The class of runs its loss joins on-policy under the resolved settings ``cfg``: its
        declared :attr:`on_policy` kind with the aggregation ``cfg`` uses; None when it does not
        reduce to a plain policy gradient."""
        if self.on_policy is None:
            return None
        return (self.on_policy[0], cfg.aggregation)

    def loss_function(self) -> Callable:
        """The loss function named by :attr:`loss` (imports its module)."""
        return load_named(self.loss)


PG_TOKEN_MEAN = ("pg", "token_mean")
PG_SEQ_MEAN = ("pg", "seq_mean")
PG_SEQ_SUM_CONST = ("pg", "seq_sum_const")
"""The on-policy classes: the plain policy gradient ``-aggregate(A grad log pi)`` under one aggregation."""

REGISTRY: dict[str, Estimator] = {
    "grpo": Estimator(
        "gmc.estimators.losses:grpo_loss",
        "GRPO",
        "tab:blue",
        ("ratio/frac_tokens_clipped",),
        aggregation="seq_mean",
        on_policy=PG_SEQ_MEAN,
        needs_batch_stats=False,
    ),
    "tic": Estimator(
        "gmc.estimators.losses:tic_loss",
        "TIC-GRPO",
        "tab:orange",
        ("ratio/frac_traj_capped",),
        aggregation="seq_sum_const",
        on_policy=PG_SEQ_SUM_CONST,
        needs_batch_stats=False,
    ),
    "gmc": Estimator(
        "gmc.estimators.losses:gmc_loss",
        "GMC-GRPO",
        "tab:green",
        ("ratio/frac_groups_capped",),
        aggregation="seq_sum_const",
        on_policy=PG_SEQ_SUM_CONST,
        needs_batch_stats=True,
    ),
    "is": Estimator(
        "gmc.estimators.losses:is_loss",
        "IS (uncapped)",
        "tab:red",
        (),
        aggregation="seq_sum_const",
        on_policy=PG_SEQ_SUM_CONST,
        needs_batch_stats=False,
    ),
    "none": Estimator(
        "gmc.estimators.losses:none_loss",
        "no correction",
        "tab:gray",
        (),
        aggregation="seq_sum_const",
        on_policy=PG_SEQ_SUM_CONST,
        needs_batch_stats=False,
    ),
    "gspo": Estimator(
        "gmc.estimators.losses:gspo_loss",
        "GSPO",
        "tab:purple",
        ("ratio/frac_seq_clipped",),
        aggregation="seq_mean",
        on_policy=PG_SEQ_MEAN,
        needs_batch_stats=False,
    ),
    "tis": Estimator(
        "gmc.estimators.losses:tis_loss",
        "token TIS",
        "tab:brown",
        ("ratio/frac_tokens_clipped",),
        aggregation="seq_mean",
        on_policy=PG_SEQ_MEAN,
        needs_batch_stats=False,
    ),
    "cispo": Estimator(
        "gmc.estimators.losses:cispo_loss",
        "CISPO",
        "tab:pink",
        ("ratio/frac_tokens_clipped",),
        aggregation="token_mean",
        on_policy=PG_TOKEN_MEAN,
        needs_batch_stats=False,
    ),
    "icepop": Estimator(
        "gmc.estimators.losses:icepop_loss",
        "IcePop (token mask)",
        "tab:olive",
        ("ratio/frac_tokens_masked",),
        aggregation="token_mean",
        on_policy=PG_TOKEN_MEAN,
        needs_batch_stats=False,
        mask_denominator="all",
    ),
    "seq_mask": Estimator(
        "gmc.estimators.losses:seq_mask_loss",
        "sequence mask",
        "tab:cyan",
        ("ratio/frac_seq_masked",),
        aggregation="token_mean",
        on_policy=PG_TOKEN_MEAN,
        needs_batch_stats=False,
        mask_denominator="all",
    ),
    "m2po": Estimator(
        "gmc.estimators.losses:m2po_loss",
        "M2PO",
        "goldenrod",
        ("ratio/frac_tokens_masked",),
        aggregation="token_mean",
        on_policy=PG_TOKEN_MEAN,
        needs_batch_stats=True,
        mask_denominator="kept",
        proximal=True,
    ),
    "gmpo": Estimator(
        "gmc.estimators.losses:gmpo_loss",
        "GMPO",
        "black",
        ("ratio/frac_tokens_clipped",),
        aggregation="seq_mean",
        on_policy=PG_SEQ_MEAN,
        needs_batch_stats=False,
    ),
    "dppo": Estimator(
        "gmc.estimators.losses:dppo_loss",
        "DPPO (TV)",
        "teal",
        ("ratio/frac_tokens_masked",),
        aggregation="token_mean",
        on_policy=PG_TOKEN_MEAN,
        needs_batch_stats=False,
        mask_denominator="all",
    ),
    "sapo": Estimator(
        "gmc.estimators.losses:sapo_loss",
        "SAPO",
        "mediumvioletred",
        ("ratio/frac_tokens_damped",),
        aggregation="seq_mean",
        on_policy=PG_SEQ_MEAN,
        needs_batch_stats=False,
    ),
    "kpop": Estimator(
        "gmc.estimators.losses:kpop_loss",
        "KPop (binary-KL token mask)",
        "slateblue",
        ("ratio/frac_tokens_masked",),
        aggregation="token_mean",
        on_policy=PG_TOKEN_MEAN,
        needs_batch_stats=False,
        mask_denominator="all",
        proximal=True,
    ),
    "dppo_kl": Estimator(
        "gmc.estimators.losses:dppo_kl_loss",
        "DPPO (binary KL)",
        "darkcyan",
        ("ratio/frac_tokens_masked",),
        aggregation="token_mean",
        on_policy=PG_TOKEN_MEAN,
        needs_batch_stats=False,
        mask_denominator="all",
    ),
    "prime_dppo": Estimator(
        "gmc.estimators.losses:prime_dppo_loss",
        "DPPO (TV) + KL penalty",
        "sienna",
        ("ratio/frac_tokens_masked",),
        aggregation="token_mean",
        on_policy=PG_TOKEN_MEAN,
        needs_batch_stats=False,
        mask_denominator="all",
    ),
    "opsm": Estimator(
        "gmc.estimators.losses:opsm_loss",
        "GRPO + OPSM",
        "navy",
        ("ratio/frac_seq_masked",),
        aggregation="seq_mean",
        on_policy=PG_SEQ_MEAN,
        needs_batch_stats=False,
        mask_denominator="all",
    ),
}
"""Every estimator by config name (``algorithm``), in the order tables and figures use: the one
place an estimator is registered."""

OWN_SETTINGS: dict[str, tuple[str, ...]] = {"eps": ("tic", "gmc", "tis")}
"""Fields of :class:`EstimatorConfig` that only the named estimators' losses read (every other
estimator's loss is the same whatever their value, ``tests/estimators/test_losses.py``): an
on-policy history trained by another estimator takes the field's default, so that runs which
differ only in such a field (a tuned cap) start from one history."""


def settings_read_by(algorithm: str, cfg: EstimatorConfig) -> EstimatorConfig:
    """``cfg`` with every field that ``algorithm``'s loss does not read (:data:`OWN_SETTINGS`) at
    its default."""
    unread = {
        k: EstimatorConfig.__dataclass_fields__[k].default
        for k, owners in OWN_SETTINGS.items()
        if algorithm not in owners
    }
    return dataclasses.replace(cfg, **unread)


SHARED_DIAGNOSTICS: tuple[str, ...] = ("ratio/ess_frac", "ratio/shortfall")
"""Statistics of the trajectory weights that the tables report for every estimator that has them."""


def diagnostic_names() -> list[str]:
    """Every registered estimator's own diagnostics, then the shared ones, without repeats."""
    return list(dict.fromkeys([*(d for e in REGISTRY.values() for d in e.diagnostics), *SHARED_DIAGNOSTICS]))


def get_estimator(algorithm: str) -> Callable:
    """The loss of ``algorithm`` (its :data:`REGISTRY` entry's, imported now), with an error that
    lists the known ones."""
    if algorithm not in REGISTRY:
        raise ValueError(f"unknown estimator {algorithm!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[algorithm].loss_function()
