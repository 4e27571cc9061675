"""Tables from run directories: files are the source of truth, nothing is retrained.

``collect(results)`` walks ``results/train/algo~A/delay~D/group~G/seed~S/`` and the matching
``results/eval/...`` folders and returns one row per run: the sweep point (parsed from the
path), the training summary and, per benchmark, greedy accuracy and Pass@1. Tables aggregate
seeds as mean +- std, in the paper's layout (algorithm x delay x group size; per benchmark
greedy and Pass@1; mean over benchmarks), as CSV, Markdown and LaTeX.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pandas as pd

from gmc.asynchrony import DELAY_MODES, named_delays
from gmc.io import atomic_path, write_csv, write_text

POINT_RE = re.compile(r"algo~(?P<algorithm>[^/]+)/delay~(?P<delay>[^/]+)/group~(?P<group>\d+)/seed~(?P<seed>\d+)")
FINAL_REWARD = "rollout/reward_mean_last20"
DIAGNOSTICS = ["async/staleness_mean", "ratio/ess_frac", "ratio/shortfall", "time/step_seconds"]
"""Diagnostics table columns; each estimator's own clip statistics (``ratio/frac_*``, named in its
registry entry and kept in ``summary.json``) go after the staleness."""


def parse_point(path: str | Path) -> dict | None:
    m = POINT_RE.search(Path(path).as_posix())
    if not m:
        return None
    d = m.groupdict()
    return {"algorithm": d["algorithm"], "delay": d["delay"], "group": int(d["group"]), "seed": int(d["seed"])}


def collect(results: str | Path) -> pd.DataFrame:
    """One row per finished run under ``results/train`` with its evaluation columns."""
    results = Path(results)
    rows = []
    for summary in sorted((results / "train").glob("**/summary.json")):
        point = parse_point(summary.parent)
        if point is None:
            continue
        row = {**point, **json.loads(summary.read_text()), "run_dir": str(summary.parent)}
        row.update(eval_scores(results / "eval" / summary.parent.relative_to(results / "train")))
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"{results}/train: no finished runs (summary.json) found")
    frame = pd.DataFrame(rows)
    return frame.sort_values(["algorithm", "delay", "group", "seed"], key=_delay_key).reset_index(drop=True)


def eval_scores(eval_dir: Path) -> dict[str, float]:
    """``eval/<benchmark>/greedy`` and ``eval/<benchmark>/pass_at_1`` from an evaluation folder."""
    out = {}
    for f in sorted(Path(eval_dir).glob("*.json")):
        if f.name == "eval_config.json":
            continue
        ev = json.loads(f.read_text())
        for key in ("greedy", "pass_at_1"):
            if key in ev:
                out[f"eval/{ev['benchmark']}/{key}"] = ev[key]
    return out


def delay_order(delay: str) -> tuple[int, int]:
    """Sort key of a ``delay~`` value: numeric delays ascending, then the named delay modes in
    registry order (:data:`gmc.asynchrony.DELAY_MODES`)."""
    if str(delay).isdigit():
        return (0, int(delay))
    named = named_delays()
    if delay not in named:
        raise ValueError(f"delay~{delay}: neither a number nor a named delay mode {named}")
    return (1, named.index(delay))


def delay_title(delay: str) -> str:
    """``delay d = 8``, or the delay mode's label."""
    return f"delay d = {delay}" if str(delay).isdigit() else DELAY_MODES[delay].label


def _delay_key(col: pd.Series) -> pd.Series:
    return col.map(delay_order) if col.name == "delay" else col


def benchmarks_in(frame: pd.DataFrame) -> list[str]:
    return sorted({c.split("/")[1] for c in frame.columns if c.startswith("eval/")})


def aggregate(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Mean and std over seeds per (algorithm, delay, group); ``n_seeds`` counts them."""
    keys = ["algorithm", "delay", "group"]
    cols = [c for c in columns if c in frame.columns]
    grouped = frame.groupby(keys, sort=False)
    mean = grouped[cols].mean()
    std = grouped[cols].std(ddof=1)
    out = mean.add_suffix(":mean").join(std.add_suffix(":std"))
    out["n_seeds"] = grouped.size()
    return out.reset_index()


def main_table(frame: pd.DataFrame) -> pd.DataFrame:
    benches = benchmarks_in(frame)
    frame = frame.copy()
    for key in ("greedy", "pass_at_1"):
        cols = [f"eval/{b}/{key}" for b in benches if f"eval/{b}/{key}" in frame.columns]
        if cols:
            frame[f"eval/mean/{key}"] = frame[cols].mean(axis=1)
    cols = [FINAL_REWARD] + [f"eval/{b}/{k}" for b in benches + ["mean"] for k in ("greedy", "pass_at_1")]
    return aggregate(frame, cols)


def diagnostics_table(frame: pd.DataFrame) -> pd.DataFrame:
    own = [c for c in frame.columns if c.startswith("ratio/frac_")]
    return aggregate(frame, [DIAGNOSTICS[0], *own, *DIAGNOSTICS[1:]])


def _fmt(mean, std, n) -> str:
    if pd.isna(mean):
        return "-"
    return f"{mean:.3f}" if n < 2 or pd.isna(std) else f"{mean:.3f} ± {std:.3f}"


def _display(table: pd.DataFrame) -> pd.DataFrame:
    """``mean ± std`` cells with readable headers."""
    out = table[["algorithm", "delay", "group"]].copy()
    for col in table.columns:
        if col.endswith(":mean"):
            name = col[: -len(":mean")]
            out[pretty(name)] = [_fmt(m, s, n) for m, s, n in zip(table[col], table[f"{name}:std"], table["n_seeds"])]
    out["seeds"] = table["n_seeds"]
    return out


def pretty(name: str) -> str:
    if name == FINAL_REWARD:
        return "train reward"
    if name.startswith("eval/"):
        _, bench, key = name.split("/")
        return f"{bench} {'greedy' if key == 'greedy' else 'Pass@1'}"
    return name


def to_markdown(table: pd.DataFrame) -> str:
    shown = _display(table)
    header = "| " + " | ".join(shown.columns) + " |"
    sep = "|" + "|".join("---" for _ in shown.columns) + "|"
    lines = ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, sep, *lines]) + "\n"


def to_latex(table: pd.DataFrame) -> str:
    shown = _display(table)

    def esc(x):
        return str(x).replace("_", r"\_").replace("±", r"$\pm$").replace("~", r"\textasciitilde{}").replace("@", "@")

    cols = "l" * 3 + "r" * (len(shown.columns) - 3)
    lines = [rf"\begin{{tabular}}{{{cols}}}", r"\toprule", " & ".join(esc(c) for c in shown.columns) + r" \\",
             r"\midrule"]
    lines += [" & ".join(esc(v) for v in row) + r" \\" for row in shown.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_tables(results: str | Path, out: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """``main`` and ``diagnostics`` tables as CSV, Markdown and LaTeX under ``out``."""
    out = Path(out or Path(results) / "tables")
    frame = collect(results)
    base = eval_scores(Path(results) / "eval" / "base")
    if base:  # the starting point, before RL, as the first row
        frame = pd.concat([pd.DataFrame([{"algorithm": "base", "delay": "-", "group": 0, "seed": 0, **base}]), frame],
                          ignore_index=True)
    tables = {"main": main_table(frame), "diagnostics": diagnostics_table(frame[frame["algorithm"] != "base"])}
    for name, table in tables.items():
        write_csv(table, out / f"{name}.csv")
        write_text(out / f"{name}.md", to_markdown(table))
        write_text(out / f"{name}.tex", to_latex(table))
    return tables


# ---------------------------------------------------------------------------------------------
# results bundles: what tables and figures need, without checkpoints


BUNDLE_FILES = ("summary.json", "metrics.jsonl", "groups.jsonl", "config.yaml", "run.json")


def export_bundle(results: str | Path, bundle: str | Path) -> int:
    """Archive run outputs (not checkpoints or models) and evaluations into a ``.tar.gz``."""
    results = Path(results)
    members = [p for p in (results / "train").glob("**/*") if p.name in BUNDLE_FILES]
    members += [p for p in (results / "eval").glob("**/*.json")]
    members += [p for p in (results / "theory").glob("*.csv")] if (results / "theory").exists() else []
    with atomic_path(bundle) as tmp:
        with tarfile.open(tmp, "w:gz") as tar:
            for p in members:
                tar.add(p, arcname=str(p.relative_to(results)))
    return len(members)


def import_bundle(bundle: str | Path, results: str | Path) -> int:
    """Unpack a bundle made by :func:`export_bundle` under ``results``."""
    results = Path(results)
    with tarfile.open(bundle, "r:gz") as tar:
        names = tar.getnames()
        for name in names:
            if name.startswith("/") or ".." in Path(name).parts:
                raise ValueError(f"{bundle}: unsafe member path {name!r}")
        tar.extractall(results, filter="data")
    return len(names)
