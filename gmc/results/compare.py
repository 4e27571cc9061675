"""A re-run against a published bundle (``gmc compare-results``): every cell of the main table and
every paired difference, published against new, whether the new estimate lies in the published
95% interval, and whether each conclusion the bundle resolved (a paired difference whose
interval excludes zero) still holds: it keeps its sign and is resolved again or at least
overlaps the published interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gmc.results.bundles import PROVENANCE
from gmc.results.tables import make_tables

KEYS = ("algorithm", "delay", "group")
PAIRED_KEYS = ("comparison", "delay", "group", "metric")


class Unreadable(Exception):
    """A bundle or results folder that cannot be read; the message names the file."""


@dataclass
class Check:
    """One estimate, published against new."""

    table: str
    key: str
    published: float
    published_half: float
    new: float
    new_half: float

    @property
    def inside(self) -> bool | None:
        """Whether the new estimate lies in the published 95% interval (None: no interval or no
        new estimate)."""
        if any(math.isnan(x) for x in (self.published, self.published_half, self.new)):
            return None
        return abs(self.new - self.published) <= self.published_half


@dataclass
class Conclusion:
    """A paired difference the bundle resolved, and what the re-run says of it."""

    key: str
    published: tuple[float, float, float]
    new: tuple[float, float, float] | None
    new_resolved: bool = False

    @property
    def verdict(self) -> str:
        if self.new is None:
            return "not in the re-run: cannot be checked"
        (diff, lo, hi), (ndiff, nlo, nhi) = self.published, self.new
        if math.isnan(ndiff) or math.copysign(1, ndiff) != math.copysign(1, diff) or ndiff == 0:
            return "does not hold: the sign changed"
        if self.new_resolved:
            return "holds: same sign, resolved again"
        if nlo <= hi and lo <= nhi:
            return "holds: same sign, not resolved, overlaps the published interval"
        return "does not hold: same sign but unresolved and outside the published interval"

    @property
    def holds(self) -> bool:
        return self.verdict.startswith("holds")


@dataclass
class Comparison:
    checks: list[Check] = field(default_factory=list)
    conclusions: list[Conclusion] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return all(c.holds for c in self.conclusions)


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype={"delay": str})
    except (OSError, ValueError) as err:
        raise Unreadable(f"{path}: {err}") from err


def _new_tables(results: Path) -> dict[str, pd.DataFrame]:
    try:
        tables = make_tables(results)
    except (OSError, ValueError, KeyError) as err:
        raise Unreadable(f"{results}: {err}") from err
    return {name: t.frame.astype({"delay": str}) if "delay" in t.frame.columns else t.frame
            for name, t in tables.items()}


def compare(bundle: str | Path, results: str | Path) -> Comparison:
    """Every main-table cell and paired difference of ``bundle`` against the tables of
    ``results``, and the bundle's resolved conclusions checked on the re-run."""
    bundle, results = Path(bundle), Path(results)
    for path, what in ((bundle / PROVENANCE, "a bundle made by gmc publish"), (results / "train", "a results folder")):
        if not path.exists():
            raise Unreadable(f"{path}: missing; {path.parent} is not {what}")
    main, paired = _read_csv(bundle / "tables" / "main.csv"), _read_csv(bundle / "tables" / "paired.csv")
    new = _new_tables(results)
    out = Comparison()
    fresh = {tuple(str(v) for v in r[list(KEYS)]): r for _, r in new["main"].iterrows()}
    for _, row in main.iterrows():
        key = tuple(str(v) for v in row[list(KEYS)])
        other = fresh.get(key)
        for col in [c[: -len(":mean")] for c in main.columns if c.endswith(":mean")]:
            got = (math.nan, math.nan) if other is None or f"{col}:mean" not in other else (
                float(other[f"{col}:mean"]), float(other[f"{col}:half"]))
            out.checks.append(Check("main", f"{'/'.join(key)} {col}", float(row[f"{col}:mean"]),
                                    float(row[f"{col}:half"]), *got))
    fresh = {tuple(str(v) for v in r[list(PAIRED_KEYS)]): r for _, r in new["paired"].iterrows()}
    for _, row in paired.iterrows():
        key = tuple(str(v) for v in row[list(PAIRED_KEYS)])
        other = fresh.get(key)
        name = f"{key[0]} at delay {key[1]}, G = {key[2]}, {key[3]}"
        got = (math.nan, math.nan) if other is None else (float(other["diff"]), float(other["half"]))
        out.checks.append(Check("paired", name, float(row["diff"]), float(row["half"]), *got))
        if str(row["excludes_zero"]) == "True":
            out.conclusions.append(Conclusion(
                name, (float(row["diff"]), float(row["lo"]), float(row["hi"])),
                None if other is None else (float(other["diff"]), float(other["lo"]), float(other["hi"])),
                other is not None and str(other["excludes_zero"]) == "True"))
    return out


def _cell(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:+.3f}" if math.isnan(half) else f"{mean:+.3f} ± {half:.3f}"


def report(comparison: Comparison) -> str:
    """The comparison as text: every estimate, the count outside the published intervals, and
    each resolved conclusion's verdict."""
    lines = ["estimate | published | new | in the published 95% interval"]
    for c in comparison.checks:
        mark = {True: "yes", False: "NO", None: "-"}[c.inside]
        lines.append(f"{c.table}: {c.key} | {_cell(c.published, c.published_half)} | {_cell(c.new, c.new_half)} | {mark}")
    judged = [c for c in comparison.checks if c.inside is not None]
    outside = sum(1 for c in judged if not c.inside)
    lines += ["", f"{outside} of {len(judged)} estimates lie outside the published 95% interval "
                  f"(by chance alone about one in twenty would: {0.05 * len(judged):.1f}); "
                  f"{len(comparison.checks) - len(judged)} have no interval or no new estimate.", ""]
    lines.append(f"Published conclusions (paired differences resolved in the bundle): {len(comparison.conclusions)}")
    for c in comparison.conclusions:
        new = "missing" if c.new is None else f"{c.new[0]:+.3f} [{c.new[1]:+.3f}, {c.new[2]:+.3f}]"
        lines.append(f"- {c.key}: published {c.published[0]:+.3f} [{c.published[1]:+.3f}, "
                     f"{c.published[2]:+.3f}], new {new}: {c.verdict}")
    held = sum(c.holds for c in comparison.conclusions)
    lines += ["", f"{held} of {len(comparison.conclusions)} published conclusions hold."]
    return "\n".join(lines)
