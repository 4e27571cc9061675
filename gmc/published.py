"""Published results: a folder that redraws a sweep's tables and figures with no training, and
the check of a re-run against it.

A bundle (``published/default/`` for the default run) is a results folder without checkpoints,
models or completions: per run its ``summary.json``, ``config.yaml``, ``run.json`` (or
``shared.json``), its per-step curves reduced to what the figures read
(:data:`FIGURE_FIELDS`), every evaluation's scores, the resolved configuration (the runs'
``config.yaml``, ``configs/`` of the evaluation and the base models), the tables and figures,
and :data:`PROVENANCE` (the commit, the machine, the thread counts the runs recorded).
``gmc report --results <bundle>`` redraws its tables and figures from it alone.
:func:`export_results` packs the same bundle into one ``.tar.gz`` to carry it elsewhere, and
:func:`import_results` unpacks it into a results folder.

:func:`compare` reads a bundle and a finished run's results: every cell of the main table and
every paired difference, published against new, whether the new estimate lies in the published
95% interval, and whether each conclusion the bundle resolved (a paired difference whose
interval excludes zero) still holds: it keeps its sign and is resolved again or at least
overlaps the published interval.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gmc.analysis import make_tables, write_tables
from gmc.io import atomic_dir, atomic_path, read_jsonl, write_json, write_text
from gmc.rundir import CONFIG, GROUPS, INFO, METRICS, SUMMARY, git_revision, package_versions
from gmc.sweep import SHARED_FILE, parse_point

PROVENANCE = "provenance.json"
"""The bundle's record of where it was made: commit, date, machine, threads, packages."""

RUN_FILES = (SUMMARY, CONFIG, INFO, SHARED_FILE)
"""Files of a run directory the bundle keeps whole."""

FIGURE_FIELDS = {METRICS: ("step", "rollout/reward_mean"), GROUPS: ("step", "staleness", "length_max")}
"""Per-step logs the bundle keeps, reduced to the fields the figures read (:mod:`gmc.plots`):
the reward curve of every run, the groups' staleness and length of the runs under a named
delay mode (a fixed delay's staleness is the delay)."""

KEYS = ("algorithm", "delay", "group")
PAIRED_KEYS = ("comparison", "delay", "group", "metric")


def machine() -> dict:
    """The processor, its vector extensions, cores and the system: what moves float rounding."""
    info = {"system": platform.platform(), "machine": platform.machine(), "cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            info["processor"] = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            info["vector"] = sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma"))
            break
    return info


def _threads(results: Path, bundle: Path) -> dict:
    """The thread counts the runs trained with (their ``run.json``) and the base models were built
    with (``models/**/build_summary.json``), as they recorded them."""
    def recorded(paths):
        found = sorted({json.loads(p.read_text()).get("threads") for p in paths} - {None})
        return found or "not recorded"
    return {"train": recorded((bundle / "train").glob(f"**/{INFO}")),
            "build": recorded((results / "models").glob("**/build_summary.json"))}


_STAMP = r"\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]\n"
_STARTED = re.compile(_STAMP + r"(?:local)?rule (\w+):\n(?:    .*\n)*?    jobid: (\d+)")
_FINISHED = re.compile(_STAMP + r"Finished jobid: (\d+) \(Rule: (\w+)\)")


def stage_times(logs: list[str | Path]) -> dict:
    """The sweep's time per stage from Snakemake's logs of its run (``.snakemake/log/*.snakemake.log``;
    several for a run continued): per rule the finished jobs, their summed and longest seconds, and
    the wall time of each invocation from its first job's start to its last job's end."""
    fmt = "%a %b %d %H:%M:%S %Y"
    rules: dict[str, list[float]] = {}
    walls = []
    for path in logs:
        text = Path(path).read_text()
        started = {m[3]: (datetime.datetime.strptime(m[1], fmt), m[2]) for m in _STARTED.finditer(text)}
        ends = []
        for m in _FINISHED.finditer(text):
            end = datetime.datetime.strptime(m[1], fmt)
            if m[2] in started:
                begin, rule = started[m[2]]
                rules.setdefault(rule, []).append((end - begin).total_seconds())
                ends.append(end)
        if not ends:
            raise ValueError(f"{path}: no finished job found (not a Snakemake log of a run?)")
        walls.append((max(ends) - min(b for b, _ in started.values())).total_seconds())
    return {"wall_seconds": walls,
            "rules": {r: {"jobs": len(d), "seconds": sum(d), "longest": max(d)}
                      for r, d in sorted(rules.items(), key=lambda kv: -sum(kv[1]))}}


STAGES = "stages.md"
"""The bundle's time per stage as a Markdown table (from :data:`PROVENANCE`'s ``stages``)."""


def _seconds(x: float) -> str:
    return f"{x:,.0f} s"


def stages_markdown(stages: dict) -> str:
    """The sweep's wall time and, per Snakemake rule that took time, its jobs, their summed, mean
    and longest seconds, longest stage first."""
    walls = stages["wall_seconds"]
    rules = {r: v for r, v in stages["rules"].items() if v["seconds"] > 0}
    jobs = sum(v["jobs"] for v in stages["rules"].values())
    lines = [f"Wall time {sum(walls) / 60:.1f} min ({_seconds(sum(walls))}"
             + (f" over {len(walls)} invocations" if len(walls) > 1 else "") + f"), {jobs} jobs.", "",
             "| stage (rule) | jobs | in all | mean | longest |", "|---|---|---|---|---|"]
    lines += [f"| {r} | {v['jobs']} | {_seconds(v['seconds'])} | {_seconds(v['seconds'] / v['jobs'])} "
              f"| {_seconds(v['longest'])} |" for r, v in sorted(rules.items(), key=lambda kv: -kv[1]["seconds"])]
    return "\n".join(lines) + "\n"


def write_stages(bundle: str | Path) -> None:
    """Write :data:`STAGES` from the bundle's provenance, where it records its stages."""
    provenance = Path(bundle) / PROVENANCE
    stages = json.loads(provenance.read_text()).get("stages") if provenance.exists() else None
    if stages:
        write_text(Path(bundle) / STAGES, stages_markdown(stages))


def publish(results: str | Path, bundle: str | Path, logs: list[str | Path] = ()) -> int:
    """Write the bundle of the finished sweep in ``results`` to ``bundle`` (replaced whole, atomically)
    with its tables and, given Snakemake's ``logs`` of its run, its time per stage
    (:func:`stage_times`); returns the number of files. Figures are drawn into it by ``gmc report``."""
    results = Path(results)
    if not (results / "train").is_dir():
        raise FileNotFoundError(f"{results}/train: not a results folder of a finished sweep")
    stages = stage_times(list(logs)) if logs else None
    with atomic_dir(bundle) as tmp:
        for run in sorted((results / "train").glob("**/seed~*")):
            if parse_point(run) is None or not ((run / SUMMARY).exists() or (run / SHARED_FILE).exists()):
                continue
            out = tmp / run.relative_to(results)
            out.mkdir(parents=True)
            for name in RUN_FILES:
                if (run / name).exists():
                    shutil.copy2(run / name, out / name)
            named = not parse_point(run)["delay"].isdigit()
            for name, keep in FIGURE_FIELDS.items():
                if (run / name).exists() and (name != GROUPS or named):
                    rows = [{k: r[k] for k in keep if k in r} for r in read_jsonl(run / name)]
                    (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        for path in sorted((results / "eval").glob("**/*.json")):
            (tmp / path.relative_to(results)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, tmp / path.relative_to(results))
        if (results / "configs").is_dir():  # the runs' own config.yaml are their resolved train configs
            shutil.copytree(results / "configs", tmp / "configs", ignore=shutil.ignore_patterns("train"))
        commits = sorted({json.loads(p.read_text()).get("git_revision", "unknown")
                          for p in (tmp / "train").glob(f"**/{INFO}")})
        write_json(tmp / PROVENANCE, {
            "commit": commits[0] if len(commits) == 1 else commits, "published_with": git_revision(),
            "made": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(), "threads": _threads(results, tmp), "packages": package_versions(),
            "python": platform.python_version(), "from": str(results),
            **({"stages": stages} if stages else {})})
        write_tables(tmp)
        write_stages(tmp)
        count = sum(1 for p in tmp.rglob("*") if p.is_file())
    return count


def export_results(results: str | Path, archive: str | Path) -> int:
    """The bundle of ``results`` (:func:`publish`) packed into the ``.tar.gz`` ``archive`` (written
    atomically); returns the number of files."""
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        count = publish(results, bundle)
        with atomic_path(archive) as out, tarfile.open(out, "w:gz") as tar:
            for path in sorted(bundle.rglob("*")):
                if path.is_file():
                    tar.add(path, arcname=str(path.relative_to(bundle)))
    return count


def import_results(archive: str | Path, results: str | Path) -> int:
    """Unpack an archive made by :func:`export_results` under ``results``; returns the number of
    files. A member path outside the folder is refused, naming the archive."""
    with tarfile.open(archive, "r:gz") as tar:
        names = tar.getnames()
        for name in names:
            if name.startswith("/") or ".." in Path(name).parts:
                raise ValueError(f"{archive}: unsafe member path {name!r}")
        tar.extractall(results, filter="data")
    return len(names)


# ---------------------------------------------------------------------------------------------
# comparing a re-run with a bundle


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
