"""What tables, figures and training summaries show of each estimator, by config name: its
label, its colour and the names of its own diagnostics (method.md section 3).

Kept apart from :mod:`gmc.estimators` so that reading results (``gmc tables``, ``gmc figures``)
needs no torch. :data:`gmc.estimators.ESTIMATORS` maps the same names to the loss functions;
``tests/test_registries.py`` keeps the two in step and checks that every estimator reports the
diagnostics named here.
"""

from __future__ import annotations

from dataclasses import dataclass


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
