"""A sweep's points and the paths that name them: ``algo~A/delay~D/group~G/seed~S`` under
``<results>/train`` (a run directory) and ``<results>/eval`` (its evaluation). One pattern, read
by the workflow's rules (with Snakemake wildcards) and by the analysis (to parse a path back).

A point's delay is a number ``d`` (the fixed delay), the name of a named delay mode
(``latency``, ``ray``: the settings of the config section of that name) or ``trace-<name>`` (a
recorded staleness trace, replayed: the ``traces`` section names its file).
"""

from __future__ import annotations

import re
from pathlib import Path

from gmc.asynchrony import DELAY_MODES, named_delays

POINT = "algo~{algo}/delay~{delay}/group~{group}/seed~{seed}"
"""A sweep point's path; the names in braces are the workflow's wildcards."""

_POINT_RE = re.compile(r"algo~(?P<algo>[^/]+)/delay~(?P<delay>[^/]+)/group~(?P<group>\d+)/seed~(?P<seed>\d+)")


def point_path(algo: str, delay: str | int, group: int, seed: int) -> str:
    """The path of one sweep point, relative to ``train/`` or ``eval/``."""
    return POINT.format(algo=algo, delay=delay, group=group, seed=seed)


def parse_point(path: str | Path) -> dict | None:
    """``{"algorithm", "delay", "group", "seed"}`` of the sweep point a path lies in (the delay as
    written: a number or a named delay mode); None outside a sweep."""
    m = _POINT_RE.search(Path(path).as_posix())
    if not m:
        return None
    return {"algorithm": m["algo"], "delay": m["delay"], "group": int(m["group"]), "seed": int(m["seed"])}


TRACE_PREFIX = "trace-"
"""``delay~trace-<name>``: the trace ``<name>`` of the config's ``traces`` section, replayed."""

ALGO_WILDCARD = r"[a-z][a-z0-9_]*"
"""Estimator names as they may appear in paths (``seq_mask``)."""


def delay_wildcard() -> str:
    """The values a point's delay may take: a number, a named delay mode or a trace."""
    return "|".join([r"\d+", *named_delays(), rf"{TRACE_PREFIX}[A-Za-z0-9_]+"])


def delay_settings(delay: str, named: dict, traces: dict) -> dict:
    """The ``delay.*`` keys of a training run at a point's ``delay``: ``named`` holds the named
    delay modes' sections, ``traces`` the trace files by name."""
    if str(delay).isdigit():
        return {"delay.mode": "fixed", "delay.d": int(delay)}
    if delay.startswith(TRACE_PREFIX):
        return {"delay.mode": "trace", "delay.trace": traces[delay.removeprefix(TRACE_PREFIX)]["file"]}
    return {"delay.mode": delay, **{f"delay.{k}": v for k, v in named[delay]["delay"].items()}}


def delay_order(delay: str) -> tuple[int, int, str]:
    """Sort key of a point's delay: numeric delays ascending, then the named delay modes in registry
    order (:data:`gmc.asynchrony.DELAY_MODES`), then the traces by name."""
    if str(delay).isdigit():
        return (0, int(delay), "")
    named = named_delays()
    if delay in named:
        return (1, named.index(delay), "")
    if str(delay).startswith(TRACE_PREFIX):
        return (2, 0, delay)
    raise ValueError(f"delay~{delay}: neither a number, a named delay mode {named} nor {TRACE_PREFIX}<name>")


def delay_title(delay: str) -> str:
    """``delay d = 8``, a delay mode's label, or ``replayed trace <name>``."""
    if str(delay).isdigit():
        return f"delay d = {delay}"
    if str(delay).startswith(TRACE_PREFIX):
        return f"{DELAY_MODES['trace'].label} {delay.removeprefix(TRACE_PREFIX)}"
    return DELAY_MODES[delay].label
