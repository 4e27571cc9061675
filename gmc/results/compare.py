"""A re-run against a published bundle (``gmc compare-results``): every cell of the main table and
every paired difference, published against new, whether the new estimate lies in the published
95% interval, and what the re-run makes of each conclusion of the bundle: *held*, *weakened* or
*failed* (:data:`OUTCOMES`). The conclusions are the verdicts of its ``tables/conclusions.csv``
(:func:`gmc.results.tables.conclusions_table`). A *resolved* difference is held when the re-run
resolves it again with the same sign, weakened when the re-run keeps its sign without resolving
it, and failed when the sign changes, the re-run finds it equivalent (within the margin of zero)
or lacks it. An *equivalent* one is held when the re-run finds it equivalent again, weakened when
the re-run is inconclusive, and failed when the re-run resolves it or lacks it. A bundle without
verdicts is judged by its paired differences whose interval excludes zero, as resolved.
``gmc compare-results`` exits 1 when a conclusion failed (:data:`EXIT`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gmc.results.outputs import analysis_config
from gmc.results.tables import make_tables
from gmc.run.provenance import PROVENANCE

KEYS = ("algorithm", "delay", "group")
PAIRED_KEYS = ("comparison", "delay", "group", "metric")
CONCLUSION_KEYS = ("role", "family", "comparison", "delay", "group")
HELD, WEAKENED, FAILED = "held", "weakened", "failed"
OUTCOMES = (HELD, WEAKENED, FAILED)
"""What a re-run makes of a published conclusion, strongest first."""
EXIT = {"all held or weakened": 0, "a conclusion failed": 1, "a file cannot be read": 2}
"""``gmc compare-results``'s exit status."""


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
    """A difference the bundle concluded (``resolved`` or ``equivalent``), and what the re-run says of it."""

    key: str
    published: tuple[float, float, float]
    new: tuple[float, float, float] | None
    new_verdict: str = "inconclusive"
    kind: str = "resolved"
    margin: float = math.nan

    @property
    def judged(self) -> tuple[str, str]:
        """The outcome (:data:`OUTCOMES`) and why."""
        if self.new is None:
            return FAILED, "not in the re-run"
        diff, ndiff = self.published[0], self.new[0]
        if self.kind == "equivalent":
            if self.new_verdict == "equivalent":
                return HELD, f"equivalent within ±{self.margin:g} again"
            if self.new_verdict == "resolved":
                return FAILED, "the re-run resolves it"
            return WEAKENED, "no longer shown equivalent, not resolved"
        if math.isnan(ndiff) or ndiff == 0 or math.copysign(1, ndiff) != math.copysign(1, diff):
            return FAILED, "the sign changed"
        if self.new_verdict == "resolved":
            return HELD, "same sign, resolved again"
        if self.new_verdict == "equivalent":
            return FAILED, f"the re-run finds it equivalent within ±{self.margin:g}"
        return WEAKENED, "same sign, no longer resolved"

    @property
    def outcome(self) -> str:
        return self.judged[0]

    @property
    def verdict(self) -> str:
        outcome, why = self.judged
        return f"{outcome}: {why}"


@dataclass
class Comparison:
    checks: list[Check] = field(default_factory=list)
    conclusions: list[Conclusion] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """How many published conclusions the re-run held, weakened and failed."""
        return {o: sum(c.outcome == o for c in self.conclusions) for o in OUTCOMES}

    @property
    def failed(self) -> bool:
        return any(c.outcome == FAILED for c in self.conclusions)


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
    return {
        name: t.frame.astype({"delay": str}) if "delay" in t.frame.columns else t.frame for name, t in tables.items()
    }


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
            got = (
                (math.nan, math.nan)
                if other is None or f"{col}:mean" not in other
                else (float(other[f"{col}:mean"]), float(other[f"{col}:half"]))
            )
            out.checks.append(
                Check("main", f"{'/'.join(key)} {col}", float(row[f"{col}:mean"]), float(row[f"{col}:half"]), *got)
            )
    fresh = {tuple(str(v) for v in r[list(PAIRED_KEYS)]): r for _, r in new["paired"].iterrows()}
    verdicts = (bundle / "tables" / "conclusions.csv").exists()
    for _, row in paired.iterrows():
        key = tuple(str(v) for v in row[list(PAIRED_KEYS)])
        other = fresh.get(key)
        name = f"{key[0]} at delay {key[1]}, G = {key[2]}, {key[3]}"
        got = (math.nan, math.nan) if other is None else (float(other["diff"]), float(other["half"]))
        out.checks.append(Check("paired", name, float(row["diff"]), float(row["half"]), *got))
        if not verdicts and str(row["excludes_zero"]) == "True":  # a bundle made before verdicts were kept
            out.conclusions.append(
                Conclusion(
                    name,
                    (float(row["diff"]), float(row["lo"]), float(row["hi"])),
                    None if other is None else (float(other["diff"]), float(other["lo"]), float(other["hi"])),
                    "resolved" if other is not None and str(other["excludes_zero"]) == "True" else "inconclusive",
                )
            )
    if verdicts:
        out.conclusions += _concluded(
            _read_csv(bundle / "tables" / "conclusions.csv"),
            new["conclusions"],
            analysis_config(bundle).equivalence_margin,
        )
    return out


def _concluded(published: pd.DataFrame, new: pd.DataFrame, margin: float) -> list[Conclusion]:
    """The bundle's resolved and equivalent differences, each beside the re-run's (matched by
    role, family, comparison, delay and group)."""
    fresh = {tuple(str(v) for v in r[list(CONCLUSION_KEYS)]): r for _, r in new.iterrows()}
    out = []
    for _, row in published[published["verdict"].isin(["resolved", "equivalent"])].iterrows():
        key = tuple(str(v) for v in row[list(CONCLUSION_KEYS)])
        other = fresh.get(key)
        at = "" if key[3] == "-" else f" at delay {key[3]}"  # a hypothesis names its delays in its contrast
        name = f"{row['outcome']} ({row['role']}, {row['family']} family): {key[2]}{at}, G = {key[4]}"
        out.append(
            Conclusion(
                name,
                (float(row["diff"]), float(row["lo"]), float(row["hi"])),
                None if other is None else (float(other["diff"]), float(other["lo"]), float(other["hi"])),
                "inconclusive" if other is None else str(other["verdict"]),
                str(row["verdict"]),
                margin,
            )
        )
    return out


def _cell(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:+.3f}" if math.isnan(half) else f"{mean:+.3f} ± {half:.3f}"


def report(comparison: Comparison) -> str:
    """The comparison as text: every estimate, the count outside the published intervals, each
    published conclusion held, weakened or failed, and the count of each."""
    lines = ["estimate | published | new | in the published 95% interval"]
    for c in comparison.checks:
        mark = {True: "yes", False: "NO", None: "-"}[c.inside]
        lines.append(
            f"{c.table}: {c.key} | {_cell(c.published, c.published_half)} | {_cell(c.new, c.new_half)} | {mark}"
        )
    judged = [c for c in comparison.checks if c.inside is not None]
    outside = sum(1 for c in judged if not c.inside)
    lines += [
        "",
        f"{outside} of {len(judged)} estimates lie outside the published 95% interval "
        f"(by chance alone about one in twenty would: {0.05 * len(judged):.1f}); "
        f"{len(comparison.checks) - len(judged)} have no interval or no new estimate.",
        "",
    ]
    lines.append(
        f"Published conclusions (differences the bundle resolved or found equivalent): {len(comparison.conclusions)}"
    )
    for c in comparison.conclusions:
        new = "missing" if c.new is None else f"{c.new[0]:+.3f} [{c.new[1]:+.3f}, {c.new[2]:+.3f}]"
        lines.append(
            f"- {c.key}: published {c.kind} {c.published[0]:+.3f} [{c.published[1]:+.3f}, "
            f"{c.published[2]:+.3f}], new {new}: {c.verdict}"
        )
    counts = comparison.counts()
    lines += [
        "",
        f"Of {len(comparison.conclusions)} published conclusions: "
        + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES)
        + ".",
    ]
    return "\n".join(lines)
