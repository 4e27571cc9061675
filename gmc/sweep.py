"""A sweep's points and the paths that name them: ``algo~A/delay~D/group~G/seed~S`` under
``<results>/train`` (a run directory) and ``<results>/eval`` (its evaluation). One pattern, read
by the workflow's rules (with Snakemake wildcards) and by the analysis (to parse a path back).
"""

from __future__ import annotations

import re
from pathlib import Path

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
