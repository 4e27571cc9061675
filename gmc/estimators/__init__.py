"""The estimators (method.md sections 2 and 3), by one import path.

The torch-free part, imported with the package: :class:`EstimatorConfig`, the registry
:data:`REGISTRY` of :class:`Estimator` entries and :func:`get_estimator` (:mod:`.registry`).
The losses and the ratio arithmetic they share (``group_advantages``, ``trajectory_weights``,
``trajectory_log_ratios``, every ``<name>_loss``; :mod:`.losses`) need torch and are imported
on first use, so that reading results never loads it.
"""

from __future__ import annotations

from gmc.estimators.registry import (
    AGGREGATIONS,
    DIVERGENCE_METRICS,
    OWN_SETTINGS,
    REGISTRY,
    SHARED_DIAGNOSTICS,
    Aggregation,
    Estimator,
    EstimatorConfig,
    diagnostic_names,
    get_estimator,
    settings_read_by,
)

LOSSES = (
    "group_advantages",
    "advantages_for",
    "token_log_ratios",
    "trajectory_log_ratios",
    "log_group_mass",
    "trajectory_weights",
    "divergence_keep_mask",
    "m2po_keep_mask",
    "TRAJECTORY_ALGORITHMS",
    *(f"{name}_loss" for name in REGISTRY),
)
"""The names :mod:`.losses` gives this package (imported when one is first used)."""

__all__ = [
    "AGGREGATIONS",
    "DIVERGENCE_METRICS",
    "OWN_SETTINGS",
    "REGISTRY",
    "SHARED_DIAGNOSTICS",
    "Aggregation",
    "Estimator",
    "EstimatorConfig",
    "diagnostic_names",
    "get_estimator",
    "settings_read_by",
    *LOSSES,
]


def __getattr__(name: str):
    if name in LOSSES:
        import gmc.estimators.losses as losses

        return getattr(losses, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
