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
    sequences). None: the estimator's default (``seq_mean`` for grpo, gspo, tis;
    ``seq_sum_const`` for tic, gmc, is, none)."""
    max_new_tokens: PositiveInt = 512
    """The constant divisor of ``seq_sum_const``: the generation token limit (a training run
    sets it to its ``sampling.max_new_tokens``)."""
    is_log_ratio_clamp: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 20.0
    """Upper bound on ``L`` for ``is`` and for ``tic``'s ``ppo_min`` negative-advantage branch
    (``exp(20)`` ~ 4.9e8), so uncapped weights stay finite."""
    kl_coef: NonNegative = 0.0
    """Weight of the k3 KL penalty to the reference policy; 0 (off) by default."""



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
}
"""Every estimator by config name (``algorithm``), in the order tables and figures use."""

SHARED_DIAGNOSTICS: tuple[str, ...] = ("ratio/ess_frac", "ratio/shortfall")
"""Statistics of the trajectory weights that the tables report for every estimator that has them."""


def diagnostic_names() -> list[str]:
    """Every registered estimator's own diagnostics, then the shared ones, without repeats."""
    return list(dict.fromkeys([*(d for e in REGISTRY.values() for d in e.diagnostics), *SHARED_DIAGNOSTICS]))
