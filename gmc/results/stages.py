"""A sweep's time per stage, read from Snakemake's logs of its run (:func:`stage_times`) and
printed as a bundle's ``stages.md`` (:func:`stages_markdown`)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

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
    return {
        "wall_seconds": walls,
        "rules": {
            r: {"jobs": len(d), "seconds": sum(d), "longest": max(d)}
            for r, d in sorted(rules.items(), key=lambda kv: -sum(kv[1]))
        },
    }


def _seconds(x: float) -> str:
    return f"{x:,.0f} s"


def stages_markdown(stages: dict) -> str:
    """The sweep's wall time and, per Snakemake rule that took time, its jobs, their summed, mean
    and longest seconds, longest stage first."""
    walls = stages["wall_seconds"]
    rules = {r: v for r, v in stages["rules"].items() if v["seconds"] > 0}
    jobs = sum(v["jobs"] for v in stages["rules"].values())
    lines = [
        f"Wall time {sum(walls) / 60:.1f} min ({_seconds(sum(walls))}"
        + (f" over {len(walls)} invocations" if len(walls) > 1 else "")
        + f"), {jobs} jobs.",
        "",
        "| stage (rule) | jobs | in all | mean | longest |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r} | {v['jobs']} | {_seconds(v['seconds'])} | {_seconds(v['seconds'] / v['jobs'])} "
        f"| {_seconds(v['longest'])} |"
        for r, v in sorted(rules.items(), key=lambda kv: -kv[1]["seconds"])
    ]
    return "\n".join(lines) + "\n"
