"""Tables from run directories (method.md section 7): files are the source of truth, nothing is
retrained.

:func:`collect` reads one row per finished run (its sweep point, training summary and
evaluation scores with their standard errors); the tables of :data:`gmc.results.outputs.TABLES`
give every cell as mean ± 95% interval over seeds (:func:`gmc.results.stats.mean_interval`), and
the paired differences of estimators at equal (delay, G, seed) and each one's cost of staleness
(:func:`gmc.results.stats.paired_difference`). A published bundle (:mod:`gmc.results.bundles`)
carries what the tables need, without checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gmc.estimators import REGISTRY, SHARED_DIAGNOSTICS
from gmc.io import write_csv, write_text
from gmc.results.outputs import TABLES
from gmc.results.stats import LEVEL, mean_interval, paired_difference
from gmc.run.evaluate import SE, eval_scores
from gmc.run.rundir import SUMMARY
from gmc.sweep.points import delay_order, parse_point
from gmc.sweep.resolve import SHARED_FILE

FINAL_REWARD = "rollout/reward_mean_last20"
DIAGNOSTICS = ["async/staleness_mean", "ratio/ess_frac", "ratio/shortfall", "time/step_seconds"]
"""Diagnostics table columns; each estimator's own clip statistics (``ratio/frac_*``, named in its
registry entry and kept in ``summary.json``) go after the staleness."""
PAIRS = (("gmc", "tic"), ("gmc", "grpo"), ("tic", "grpo"), ("gmc", "is"), ("gmc", "none"))
"""Paired comparisons ``a − b`` of the ``paired`` table: the paper's ordering GMC >= TIC >= GRPO,
and GMC against the uncapped and uncorrected references."""


def collect(results: str | Path) -> pd.DataFrame:
    """One row per finished run under ``results/train`` with its evaluation columns; a point that
    shares another point's run (:data:`gmc.sweep.resolve.SHARED_FILE`) gets that run's row under its own
    name, with ``shared_with`` naming the estimator that trained it."""
    results = Path(results)
    rows = []
    found = [*(results / "train").glob(f"**/{SHARED_FILE}"), *(results / "train").glob(f"**/{SUMMARY}")]
    for marker in sorted(found):
        point = parse_point(marker.parent)
        if point is None:
            continue
        run_dir, extra = marker.parent, {}
        if marker.name == SHARED_FILE:
            shared = json.loads(marker.read_text())["run"]
            run_dir, extra = results / "train" / shared, {"shared_with": parse_point(shared)["algorithm"]}
        row = {**point, **json.loads((run_dir / SUMMARY).read_text()), "run_dir": str(run_dir), **extra}
        row.update(eval_scores(results / "eval" / run_dir.relative_to(results / "train")))
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"{results}/train: no finished runs (summary.json) found")
    frame = pd.DataFrame(rows)
    return frame.sort_values(["algorithm", "delay", "group", "seed"], key=_delay_key).reset_index(drop=True)


def _delay_key(col: pd.Series) -> pd.Series:
    return col.map(delay_order) if col.name == "delay" else col


def benchmarks_in(frame: pd.DataFrame) -> list[str]:
    return sorted({c.split("/")[1] for c in frame.columns if c.startswith("eval/")} - {"mean"})


def with_benchmark_means(frame: pd.DataFrame) -> pd.DataFrame:
    """Adds ``eval/mean/<key>`` (mean over benchmarks) and its standard error, benchmarks independent."""
    benches = benchmarks_in(frame)
    frame = frame.copy()
    for key in ("greedy", "pass_at_1"):
        cols = [f"eval/{b}/{key}" for b in benches if f"eval/{b}/{key}" in frame.columns]
        if cols:
            frame[f"eval/mean/{key}"] = frame[cols].mean(axis=1)
            ses = frame[[c + SE for c in cols if c + SE in frame.columns]]
            frame[f"eval/mean/{key}{SE}"] = (ses**2).sum(axis=1, min_count=len(cols)) ** 0.5 / len(cols)
    return frame


def score_columns(frame: pd.DataFrame) -> list[str]:
    """Final training reward, then greedy and Pass@1 per benchmark and their means, as present."""
    cols = [FINAL_REWARD] + [f"eval/{b}/{k}" for b in benchmarks_in(frame) + ["mean"] for k in ("greedy", "pass_at_1")]
    return [c for c in cols if c in frame.columns]


def aggregate(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per (algorithm, delay, group): ``:mean``, ``:std`` (over seeds), ``:lo``, ``:hi`` and
    ``:half`` (the 95% interval and its half-width) per column; ``n_seeds`` counts the seeds."""
    keys = ["algorithm", "delay", "group"]
    cols = [c for c in columns if c in frame.columns]
    rows = []
    for key, grp in frame.groupby(keys, sort=False):
        row = dict(zip(keys, key), n_seeds=len(grp))
        if "shared_with" in grp.columns and grp["shared_with"].notna().any():
            row["shared_with"] = grp["shared_with"].dropna().iloc[0]
        for col in cols:
            se = grp[col + SE] if col + SE in grp.columns else None
            iv = mean_interval(grp[col], se)
            row.update({f"{col}:mean": iv.mean, f"{col}:std": iv.sd, f"{col}:lo": iv.lo, f"{col}:hi": iv.hi,
                        f"{col}:half": iv.half})
        rows.append(row)
    out = pd.DataFrame(rows)
    last = ["n_seeds", *(["shared_with"] if "shared_with" in out.columns else [])]
    return out[keys + [c for c in out.columns if c not in keys and c not in last] + last]


@dataclass(frozen=True)
class Rendered:
    """A table as the files show it: the tidy frame (CSV), Markdown and LaTeX."""

    frame: pd.DataFrame
    markdown: str
    latex: str


def base_scores(results: str | Path) -> pd.DataFrame:
    """The base model's scores, one row per seed: ``eval/base/seed~<s>`` where each seed
    warm-starts its own base model, else the one model's ``eval/base`` as seed 0. Empty where
    nothing evaluated the base model."""
    root = Path(results) / "eval" / "base"
    per_seed = {int(d.name.split("~", 1)[1]): d for d in sorted(root.glob("seed~*"))} or {0: root}
    rows = [{"seed": seed, **scores} for seed, d in per_seed.items() if (scores := eval_scores(d))]
    return pd.DataFrame(rows)


def with_base(runs: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """The runs with the base model's scores first (algorithm ``base``, one row per seed: its
    interval covers the base models' variation), when there are any."""
    if base.empty:
        return runs
    return pd.concat([base.assign(algorithm="base", delay="-", group=0), runs], ignore_index=True)


def main_table(runs: pd.DataFrame, base: pd.DataFrame) -> Rendered:
    """Scores per (algorithm, delay, group): mean ± 95% interval over seeds, the base model first."""
    frame = with_benchmark_means(with_base(runs, base))
    table = aggregate(frame, score_columns(frame))
    return Rendered(table, to_markdown(table), to_latex(table))


def runs_table(runs: pd.DataFrame, base: pd.DataFrame) -> Rendered:
    """Every run's final scores, one row per (algorithm, delay, group, seed), each seed's base model
    first: what the intervals of ``main`` are made of (a seed that never learnt shows here)."""
    frame = with_benchmark_means(with_base(runs, base))
    keys = ["algorithm", "delay", "group", "seed"]
    table = frame[keys + [c for c in ("shared_with",) if c in frame.columns] + score_columns(frame)]
    shown = table[keys].copy()
    shown["algorithm"] = _algorithm_labels(table)
    for col in score_columns(frame):
        shown[pretty(col)] = ["-" if pd.isna(v) else f"{v:.3f}" for v in table[col]]
    return Rendered(table.reset_index(drop=True), _markdown(shown), _latex(shown))


def diagnostics_table(runs: pd.DataFrame, base: pd.DataFrame) -> Rendered:
    """Staleness, each estimator's own clip statistics, ESS, shortfall and step time."""
    own = [c for c in runs.columns if c.startswith("ratio/frac_")]
    table = aggregate(runs, [DIAGNOSTICS[0], *own, *DIAGNOSTICS[1:]])
    return Rendered(table, to_markdown(table), to_latex(table))


def paired_table(runs: pd.DataFrame, base: pd.DataFrame) -> Rendered:
    """Paired differences (:func:`paired_differences`), with the list of those that are resolved."""
    table = paired_differences(runs)
    return Rendered(table, paired_markdown(table), _latex(_paired_display(table)) if len(table) else "")


def paired_differences(frame: pd.DataFrame, pairs=PAIRS) -> pd.DataFrame:
    """Paired differences, one row per (comparison, delay, group, metric): mean difference, 95%
    interval, seeds paired, seeds with the mean's sign, and whether the interval excludes zero.
    Two kinds: ``a − b`` for each estimator pair at equal (delay, group, seed), and the cost of
    staleness, ``A: stale − on-policy``, each estimator at every other delay against itself at
    delay 0 at equal (group, seed). Points where either side is missing are skipped."""
    frame = with_benchmark_means(frame)
    metrics = score_columns(frame)
    rows = []
    for a, b in pairs:
        fa, fb = frame[frame["algorithm"] == a], frame[frame["algorithm"] == b]
        both = fa.merge(fb, on=["delay", "group", "seed"], suffixes=(":a", ":b"))
        rows += _difference_rows(f"{a} − {b}", both, metrics)
    for algorithm, runs in frame.groupby("algorithm", sort=False):
        on_policy = runs[runs["delay"] == "0"].drop(columns="delay")
        stale = runs[runs["delay"] != "0"]
        both = stale.merge(on_policy, on=["group", "seed"], suffixes=(":a", ":b"))
        rows += _difference_rows(f"{algorithm}: stale − on-policy", both, metrics)
    columns = ["comparison", "delay", "group", "metric", "diff", "lo", "hi", "half", "n_seeds", "n_sign",
               "excludes_zero"]
    out = pd.DataFrame(rows, columns=columns)
    if out.empty:
        return out
    order = {c: i for i, c in enumerate(dict.fromkeys(out["comparison"]))}
    out["_c"] = out["comparison"].map(order)
    out = out.sort_values(["_c", "delay", "group"], key=_delay_key, kind="stable").drop(columns="_c")
    return out.reset_index(drop=True)


def _difference_rows(comparison: str, both: pd.DataFrame, metrics: list[str]) -> list[dict]:
    """Rows of :func:`paired_table` for one comparison; ``both`` holds the paired runs side by
    side (columns ``<metric>:a`` and ``<metric>:b``)."""
    rows = []
    for (delay, group), grp in both.groupby(["delay", "group"], sort=False):
        # a run shared by both sides (gmc.sweep.resolve.shared_runs) is one evaluation: no noise between them
        one = grp["run_dir:a"] == grp["run_dir:b"] if "run_dir:a" in grp.columns else pd.Series(False, grp.index)
        for m in metrics:
            se_a = grp[f"{m}{SE}:a"].where(~one, 0.0) if f"{m}{SE}:a" in grp.columns else None
            se_b = grp[f"{m}{SE}:b"].where(~one, 0.0) if f"{m}{SE}:b" in grp.columns else None
            p = paired_difference(grp[f"{m}:a"], grp[f"{m}:b"], se_a, se_b)
            iv = p.interval
            rows.append(dict(comparison=comparison, delay=delay, group=group, metric=m, diff=iv.mean, lo=iv.lo,
                             hi=iv.hi, half=iv.half, n_seeds=iv.n, n_sign=p.n_sign, excludes_zero=p.excludes_zero))
    return rows


LEAGUE_SCORE = ("eval/mean/pass_at_1", FINAL_REWARD)
"""The league's score: final Pass@1 (mean over benchmarks), or the final training reward where a
sweep evaluates nothing."""


def league_table(runs: pd.DataFrame, base: pd.DataFrame) -> Rendered:
    """Every estimator at the largest fixed delay (largest group size), ranked by final Pass@1:
    its mean and 95% interval over seeds, the paired difference to ``gmc`` and its cost of
    staleness (itself at that delay minus itself at delay 0) with their sign counts, and its own
    statistics (clipped, masked or capped fraction; ESS / G; shortfall), mean over training."""
    frame = with_benchmark_means(runs)
    score = next((c for c in LEAGUE_SCORE if c in frame.columns), None)
    numeric = frame[frame["delay"].astype(str).str.isdigit()]
    if score is None or numeric.empty:
        empty = pd.DataFrame(columns=["rank", "algorithm", "delay", "group"])
        return Rendered(empty, "", "")
    delay = str(max(int(d) for d in numeric["delay"]))
    group = int(numeric["group"].max())
    point = numeric[(numeric["group"] == group)]
    at = point[point["delay"] == delay]
    se = score + SE

    def paired(a: pd.DataFrame, b: pd.DataFrame) -> dict:
        both = a.merge(b, on="seed", suffixes=(":a", ":b"))
        if both.empty:
            return dict(diff=float("nan"), lo=float("nan"), hi=float("nan"), half=float("nan"), n_seeds=0,
                        n_sign=0, excludes_zero=False)
        p = paired_difference(both[f"{score}:a"], both[f"{score}:b"], both.get(f"{se}:a"), both.get(f"{se}:b"))
        iv = p.interval
        return dict(diff=iv.mean, lo=iv.lo, hi=iv.hi, half=iv.half, n_seeds=iv.n, n_sign=p.n_sign,
                    excludes_zero=p.excludes_zero)

    keep = ["seed", score, *([se] if se in point.columns else [])]
    gmc = at[at["algorithm"] == "gmc"][keep]
    rows = []
    for algorithm, grp in at.groupby("algorithm", sort=False):
        iv = mean_interval(grp[score], grp[se] if se in grp.columns else None)
        on_policy = point[(point["algorithm"] == algorithm) & (point["delay"] == "0")][keep]
        own = REGISTRY[algorithm].diagnostics if algorithm in REGISTRY else ()
        row = dict(algorithm=algorithm, delay=delay, group=group, score=score, mean=iv.mean, lo=iv.lo, hi=iv.hi,
                   half=iv.half, n_seeds=iv.n,
                   **{f"vs_gmc:{k}": v for k, v in paired(grp[keep], gmc.iloc[:0] if algorithm == "gmc"
                                                           else gmc).items()},
                   **{f"staleness_cost:{k}": v for k, v in paired(grp[keep], on_policy).items()},
                   own_statistic=own[0] if own else "",
                   own_value=float(grp[own[0]].mean()) if own and own[0] in grp.columns else float("nan"))
        for col in SHARED_DIAGNOSTICS:
            row[col] = float(grp[col].mean()) if col in grp.columns else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows).sort_values("mean", ascending=False, kind="stable").reset_index(drop=True)
    table.insert(0, "rank", range(1, len(table) + 1))
    shown = _league_display(table)
    return Rendered(table, _markdown(shown), _latex(shown))


def _signed(diff, half, n_sign, n, excludes_zero) -> str:
    if pd.isna(diff):
        return "-"
    cell = f"{diff:+.3f}" if pd.isna(half) else f"{diff:+.3f} ± {half:.3f}"
    return f"{cell} ({n_sign}/{n}){' *' if excludes_zero else ''}"


def _league_display(table: pd.DataFrame) -> pd.DataFrame:
    """The league as the Markdown and LaTeX files show it; ``*``: the 95% interval excludes zero."""
    name = pretty(table["score"].iloc[0]) if len(table) else "score"
    labels = [REGISTRY[a].label if a in REGISTRY else a for a in table["algorithm"]]
    out = pd.DataFrame({"rank": table["rank"], "estimator": labels})
    out[f"{name} at delay {table['delay'].iloc[0]}"] = [
        f"{_fmt(m, h)} [{lo:.3f}, {hi:.3f}]" if not pd.isna(lo) else _fmt(m, h)
        for m, h, lo, hi in zip(table["mean"], table["half"], table["lo"], table["hi"])]
    for key, title in (("vs_gmc", "− GMC (sign)"), ("staleness_cost", "cost of staleness (sign)")):
        out[title] = [_signed(*r) for r in zip(table[f"{key}:diff"], table[f"{key}:half"], table[f"{key}:n_sign"],
                                                table[f"{key}:n_seeds"], table[f"{key}:excludes_zero"])]
    out["own statistic"] = [f"{s.removeprefix('ratio/')} {v:.3f}" if s and not pd.isna(v) else "-"
                            for s, v in zip(table["own_statistic"], table["own_value"])]
    for col in SHARED_DIAGNOSTICS:
        out[col.removeprefix("ratio/")] = ["-" if pd.isna(v) else f"{v:.3f}" for v in table[col]]
    out["seeds"] = table["n_seeds"]
    return out


def resolved_differences(paired: pd.DataFrame) -> list[str]:
    """One sentence per paired difference whose 95% interval excludes zero."""
    return [f"{r.comparison} at delay {r.delay}, G = {r.group}, {pretty(r.metric)}: {r.diff:+.3f} "
            f"[{r.lo:+.3f}, {r.hi:+.3f}], sign in {r.n_sign}/{r.n_seeds} seeds"
            for r in paired.itertuples() if r.excludes_zero]


def _fmt(mean, half) -> str:
    if pd.isna(mean):
        return "-"
    return f"{mean:.3f}" if pd.isna(half) else f"{mean:.3f} ± {half:.3f}"


def _algorithm_labels(table: pd.DataFrame) -> list[str]:
    """Each row's algorithm; a run trained once for several estimators is shown under each, the
    sharing one marked ``gmc (run of tic)``."""
    if "shared_with" not in table.columns:
        return list(table["algorithm"])
    return [a if pd.isna(w) else f"{a} (run of {w})" for a, w in zip(table["algorithm"], table["shared_with"])]


def _display(table: pd.DataFrame) -> pd.DataFrame:
    """``mean ± half-width`` cells (95% interval over seeds) with readable headers."""
    out = table[["algorithm", "delay", "group"]].copy()
    out["algorithm"] = _algorithm_labels(table)
    for col in table.columns:
        if col.endswith(":mean"):
            name = col[: -len(":mean")]
            out[pretty(name)] = [_fmt(m, h) for m, h in zip(table[col], table[f"{name}:half"])]
    out["seeds"] = table["n_seeds"]
    return out


def _paired_display(paired: pd.DataFrame) -> pd.DataFrame:
    """One row per (comparison, delay, group); cells ``diff ± half (sign count)``, ``*`` when
    the interval excludes zero."""
    rows = []
    for (comp, delay, group), grp in paired.groupby(["comparison", "delay", "group"], sort=False):
        row = {"comparison": comp, "delay": delay, "group": group}
        for r in grp.itertuples():
            cell = f"{r.diff:+.3f}" if pd.isna(r.half) else f"{r.diff:+.3f} ± {r.half:.3f}"
            row[pretty(r.metric)] = f"{cell} ({r.n_sign}/{r.n_seeds}){' *' if r.excludes_zero else ''}"
        rows.append(row)
    return pd.DataFrame(rows)


def pretty(name: str) -> str:
    if name == FINAL_REWARD:
        return "train reward"
    if name.startswith("eval/"):
        _, bench, key = name.split("/")
        return f"{bench} {'greedy' if key == 'greedy' else 'Pass@1'}"
    return name


def _markdown(shown: pd.DataFrame) -> str:
    header = "| " + " | ".join(shown.columns) + " |"
    sep = "|" + "|".join("---" for _ in shown.columns) + "|"
    lines = ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, sep, *lines]) + "\n"


def _latex(shown: pd.DataFrame) -> str:
    def esc(x):
        return (str(x).replace("_", r"\_").replace("±", r"$\pm$").replace("−", "$-$")
                .replace("~", r"\textasciitilde{}"))

    cols = "l" * 3 + "r" * (len(shown.columns) - 3)
    lines = [rf"\begin{{tabular}}{{{cols}}}", r"\toprule", " & ".join(esc(c) for c in shown.columns) + r" \\",
             r"\midrule"]
    lines += [" & ".join(esc(v) for v in row) + r" \\" for row in shown.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_markdown(table: pd.DataFrame) -> str:
    return _markdown(_display(table))


def to_latex(table: pd.DataFrame) -> str:
    return _latex(_display(table))


PAIRED_NOTE = (f"Paired differences at equal (delay, G, seed), and each estimator's cost of staleness "
               "(A: stale − on-policy, the estimator at the row's delay minus itself at delay 0, equal G "
               f"and seed): mean ± half-width of the {LEVEL:.0%} t-interval over seeds (evaluation noise "
               "folded in), (seeds with the mean's sign / seeds paired); * the interval excludes zero.")


def paired_markdown(paired: pd.DataFrame) -> str:
    resolved = resolved_differences(paired)
    lines = [PAIRED_NOTE, "", "Differences whose interval excludes zero:"]
    lines += [f"- {s}" for s in resolved] if resolved else ["- none"]
    return "\n".join(lines) + "\n\n" + (_markdown(_paired_display(paired)) if len(paired) else "")


def make_tables(results: str | Path) -> dict[str, Rendered]:
    """Every table of :data:`gmc.results.outputs.TABLES` from the runs and evaluations under ``results``."""
    runs, base = collect(results), base_scores(results)
    return {name: entry.resolve()(runs, base) for name, entry in TABLES.items()}


def write_tables(results: str | Path, out: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """Every table of :data:`gmc.results.outputs.TABLES` as CSV, Markdown and LaTeX under ``out``
    (default ``<results>/tables``); returns the tidy frames by name."""
    out = Path(out or Path(results) / "tables")
    tables = {}
    for name, table in make_tables(results).items():
        write_csv(table.frame, out / f"{name}.csv")
        write_text(out / f"{name}.md", table.markdown)
        write_text(out / f"{name}.tex", table.latex)
        tables[name] = table.frame
    return tables
