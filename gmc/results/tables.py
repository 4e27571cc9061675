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

import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from gmc.estimators import REGISTRY, SHARED_DIAGNOSTICS
from gmc.io import write_csv, write_text
from gmc.results.outputs import TABLES, AnalysisConfig, analysis_config
from gmc.results.stats import (
    ALPHA,
    LEVEL,
    POWER,
    Interval,
    detectable,
    equivalence_p,
    holm,
    mean_interval,
    p_value,
    paired_difference,
    problem_paired_se,
)
from gmc.run.evaluate import SE, eval_scores, problem_scores
from gmc.run.rundir import SHARED, SUMMARY
from gmc.sweep.points import delay_order, parse_point

FINAL_REWARD = "rollout/reward_mean_last20"
DIAGNOSTICS = ["async/staleness_mean", "ratio/ess_frac", "ratio/shortfall", "time/step_seconds"]
"""Diagnostics table columns; each estimator's own clip statistics (``ratio/frac_*``, named in its
registry entry and kept in ``summary.json``) go after the staleness."""
PAIRS = (("gmc", "tic"), ("gmc", "grpo"), ("tic", "grpo"), ("gmc", "is"), ("gmc", "none"))
"""Paired comparisons ``a − b`` of the ``paired`` table: the paper's ordering GMC >= TIC >= GRPO,
and GMC against the uncapped and uncorrected references."""


def collect(results: str | Path) -> pd.DataFrame:
    """One row per finished run under ``results/train`` with its evaluation columns; a point that
    shares another point's run (:data:`gmc.run.rundir.SHARED`) gets that run's row under its own
    name, with ``shared_with`` naming the estimator that trained it."""
    results = Path(results)
    rows = []
    found = [*(results / "train").glob(f"**/{SHARED}"), *(results / "train").glob(f"**/{SUMMARY}")]
    for marker in sorted(found):
        point = parse_point(marker.parent)
        if point is None:
            continue
        run_dir, extra = marker.parent, {}
        if marker.name == SHARED:
            shared = json.loads(marker.read_text())["run"]
            run_dir, extra = results / "train" / shared, {"shared_with": parse_point(shared)["algorithm"]}
        row = {**point, **json.loads((run_dir / SUMMARY).read_text()), "run_dir": str(run_dir), **extra}
        eval_dir = results / "eval" / run_dir.relative_to(results / "train")
        row.update(eval_scores(eval_dir))
        row.update({f"{k}{PROBLEMS}": v for k, v in problem_scores(eval_dir).items()})
        row.update(run_settings(run_dir, eval_dir))
        if marker.name == SHARED:  # the run is another point's: its estimator is that point's
            row.pop("estimator", None)
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"{results}/train: no finished runs (summary.json) found")
    frame = pd.DataFrame(rows)
    return frame.sort_values(["algorithm", "delay", "group", "seed"], key=_delay_key).reset_index(drop=True)


PROBLEMS = ":problems"
"""Suffix of a run's per-problem scores of an evaluation (``(problems fingerprint, scores)``)."""


def run_settings(run_dir: Path, eval_dir: Path) -> dict[str, Any]:
    """What the files of a run and its evaluation record of their settings: the sampling
    temperature of its training rollouts and of its evaluation's samples (for the outcomes'
    labels), and the estimator it trained with (``estimator``: a variant's point is named apart
    from its estimator, ``variants`` in the workflow's config)."""
    out: dict[str, Any] = {}
    config = run_dir / "config.yaml"
    if config.exists():
        saved = yaml.safe_load(config.read_text()) or {}
        sampling = saved.get("sampling") or {}
        if "temperature" in sampling:
            out["train_temperature"] = float(sampling["temperature"])
        if "algorithm" in saved:
            out["estimator"] = saved["algorithm"]
    for f in sorted(eval_dir.glob("*.json")):
        ev = json.loads(f.read_text())
        if "temperature" in ev and "benchmark" in ev:
            out["eval_temperature"] = float(ev["temperature"])
            break
    return out


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
            row.update(
                {
                    f"{col}:mean": iv.mean,
                    f"{col}:std": iv.sd,
                    f"{col}:lo": iv.lo,
                    f"{col}:hi": iv.hi,
                    f"{col}:half": iv.half,
                }
            )
        rows.append(row)
    out = pd.DataFrame(rows)
    last = ["n_seeds", *(["shared_with"] if "shared_with" in out.columns else [])]
    return out[keys + [c for c in out.columns if c not in keys and c not in last] + last]


@dataclass(frozen=True)
class Rendered:
    """A table as the files show it: the tidy frame (CSV), Markdown and LaTeX; HTML is the Markdown's."""

    frame: pd.DataFrame
    markdown: str
    latex: str

    def html(self, title: str) -> str:
        return markdown_html(self.markdown, title)


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


def main_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Scores per (algorithm, delay, group): mean ± 95% interval over seeds, the base model first."""
    frame = with_benchmark_means(with_base(runs, base))
    table = aggregate(frame, score_columns(frame))
    return Rendered(table, to_markdown(table), to_latex(table))


def runs_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
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


def diagnostics_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Staleness, each estimator's own clip statistics, ESS, shortfall and step time."""
    own = [c for c in runs.columns if c.startswith("ratio/frac_")]
    table = aggregate(runs, [DIAGNOSTICS[0], *own, *DIAGNOSTICS[1:]])
    return Rendered(table, to_markdown(table), to_latex(table))


def paired_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Paired differences (:func:`paired_differences`), judged per family (:func:`judge`)."""
    table = paired_differences(runs, margin=analysis.equivalence_margin)
    return Rendered(
        table, paired_markdown(table, analysis.equivalence_margin), _latex(_paired_display(table)) if len(table) else ""
    )


PAIRED_COLUMNS = [
    "comparison",
    "delay",
    "group",
    "metric",
    "diff",
    "lo",
    "hi",
    "half",
    "se",
    "n_seeds",
    "n_sign",
    "excludes_zero",
    "same_test_as",
]

ONE_RUN = "one run"
"""``same_test_as`` and ``verdict`` of a difference whose two sides are one run in every seed (a
shared run, :func:`gmc.sweep.resolve.shared_runs`): zero by construction, not a test."""


def paired_differences(
    frame: pd.DataFrame, pairs=PAIRS, margin: float = AnalysisConfig().equivalence_margin
) -> pd.DataFrame:
    """Paired differences, one row per (comparison, delay, group, metric): mean difference, 95%
    interval, its standard error, seeds paired, seeds with the mean's sign, and whether the
    interval excludes zero; then each family's (the table's differences in one metric) tests
    (:func:`judge`). Two kinds: ``a − b`` for each estimator pair (``pairs``, then each variant
    and its estimator, :func:`variant_pairs`) at equal (delay, group, seed),
    and the cost of staleness, ``A: stale − on-policy``, each estimator at every other delay
    against itself at delay 0 at equal (group, seed). Points where either side is missing are
    skipped. An evaluated score is paired per problem within a seed (:func:`_problem_paired_se`).

    A family holds each test once: a difference whose sides are one run in every seed (gmc − tic
    at delay 0, where gmc's run is tic's) is no test (``same_test_as`` :data:`ONE_RUN`), and one
    that pairs the same runs as an earlier difference (gmc − grpo and tic − grpo at delay 0) is
    that test again (``same_test_as`` names it) and takes its verdict without counting twice."""
    frame = with_benchmark_means(frame)
    metrics = score_columns(frame)
    rows = []
    for a, b in [*pairs, *variant_pairs(frame)]:
        fa, fb = frame[frame["algorithm"] == a], frame[frame["algorithm"] == b]
        both = fa.merge(fb, on=["delay", "group", "seed"], suffixes=(":a", ":b"))
        rows += _difference_rows(f"{a} − {b}", both, metrics)
    for algorithm, runs in frame.groupby("algorithm", sort=False):
        on_policy = runs[runs["delay"] == "0"].drop(columns="delay")
        stale = runs[runs["delay"] != "0"]
        both = stale.merge(on_policy, on=["group", "seed"], suffixes=(":a", ":b"))
        rows += _difference_rows(f"{algorithm}: stale − on-policy", both, metrics)
    out = pd.DataFrame(rows, columns=[*PAIRED_COLUMNS, "_runs"])
    if out.empty:
        return out.drop(columns="_runs")
    order = {c: i for i, c in enumerate(dict.fromkeys(out["comparison"]))}
    out["_c"] = out["comparison"].map(order)
    out = out.sort_values(["_c", "delay", "group"], key=_delay_key, kind="stable").drop(columns="_c")
    out = out.reset_index(drop=True)
    first: dict = {}  # (metric, runs) -> the row of their first difference
    repeats: dict = {}  # row -> the earlier row whose test it is
    for i, r in out.iterrows():
        if r["same_test_as"] != ONE_RUN and r["_runs"] is not None:
            j = first.setdefault((r["metric"], r["_runs"]), i)
            if j != i:
                repeats[i] = j
                out.at[i, "same_test_as"] = f"{out.at[j, 'comparison']} at delay {out.at[j, 'delay']}"
    tests = out["same_test_as"] == ""
    judged = judge(out[tests].drop(columns="_runs"), ["metric"], margin)
    added = [c for c in judged.columns if c not in out.columns]
    out = out.drop(columns="_runs").join(judged[added])
    out["verdict"] = out["verdict"].astype(object)
    for i, j in repeats.items():  # a repeated test takes its first difference's tests
        out.loc[i, added] = out.loc[j, added]
    out.loc[out["same_test_as"] == ONE_RUN, "verdict"] = ONE_RUN
    return out


def variant_estimators(frame: pd.DataFrame) -> dict[str, str]:
    """Each variant in ``frame`` and the estimator it varies: a point named apart from the
    estimator its runs trained with (``variants`` in the workflow's config; the frame's
    ``estimator``, :func:`run_settings`)."""
    if "estimator" not in frame.columns:
        return {}
    return {a: e for a, e in zip(frame["algorithm"], frame["estimator"]) if isinstance(e, str) and a != e}


def variant_pairs(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """``(variant, its estimator)`` for each variant in ``frame`` whose estimator ran too: a variant
    is compared with the estimator it varies (``gmc_tis − gmc``)."""
    present = set(frame["algorithm"])
    return [(a, e) for a, e in variant_estimators(frame).items() if e in present]


def _difference_rows(comparison: str, both: pd.DataFrame, metrics: list[str]) -> list[dict]:
    """Rows of :func:`paired_table` for one comparison; ``both`` holds the paired runs side by
    side (columns ``<metric>:a`` and ``<metric>:b``)."""
    rows = []
    for (delay, group), grp in both.groupby(["delay", "group"], sort=False):
        # a run shared by both sides (gmc.sweep.resolve.shared_runs) is one evaluation: no noise between them
        one = grp["run_dir:a"] == grp["run_dir:b"] if "run_dir:a" in grp.columns else pd.Series(False, grp.index)
        # the runs a difference pairs, whichever side each is on: two differences of the same runs are one test
        runs = (
            frozenset(frozenset(pair) for pair in zip(grp["run_dir:a"], grp["run_dir:b"]))
            if "run_dir:a" in grp.columns
            else None
        )
        for m in metrics:
            se_a = grp[f"{m}{SE}:a"].where(~one, 0.0) if f"{m}{SE}:a" in grp.columns else None
            se_b = grp[f"{m}{SE}:b"].where(~one, 0.0) if f"{m}{SE}:b" in grp.columns else None
            p = paired_difference(grp[f"{m}:a"], grp[f"{m}:b"], se_a, se_b, se_d=_problem_paired_se(grp, m))
            iv = p.interval
            rows.append(
                dict(
                    comparison=comparison,
                    delay=delay,
                    group=group,
                    metric=m,
                    diff=iv.mean,
                    lo=iv.lo,
                    hi=iv.hi,
                    half=iv.half,
                    se=iv.se,
                    n_seeds=iv.n,
                    n_sign=p.n_sign,
                    excludes_zero=p.excludes_zero,
                    same_test_as=ONE_RUN if len(grp) and one.all() else "",
                    _runs=runs,
                )
            )
    return rows


def _problem_paired_se(both: pd.DataFrame, metric: str):
    """Per paired seed, the evaluation standard error of the difference in ``metric`` paired per
    problem (:func:`gmc.results.stats.problem_paired_se`; for the mean over benchmarks, theirs
    combined as for independent benchmarks); None where a seed's two evaluations did not record
    their problems, or not the same ones (the unpaired error applies then)."""
    if not metric.startswith("eval/"):
        return None
    _, bench, key = metric.split("/")
    benches = (
        [bench]
        if bench != "mean"
        else sorted(
            {c.split("/")[1] for c in both.columns if c.startswith("eval/") and c.endswith(f"/{key}{PROBLEMS}:a")}
        )
    )
    if not benches:
        return None
    out = []
    for _, row in both.iterrows():
        ses = []
        for b in benches:
            a, c = row.get(f"eval/{b}/{key}{PROBLEMS}:a"), row.get(f"eval/{b}/{key}{PROBLEMS}:b")
            if not isinstance(a, tuple) or not isinstance(c, tuple) or a[0] != c[0] or len(a[1]) != len(c[1]):
                return None
            ses.append(problem_paired_se(a[1], c[1]))
        out.append(math.sqrt(sum(s * s for s in ses)) / len(ses))
    return out


def judge(table: pd.DataFrame, family: list[str], margin: float, prefix: str = "") -> pd.DataFrame:
    """Each difference's tests, with Holm's adjustment over its family (the rows that share the
    ``family`` columns): ``p`` (two-sided, ``diff = 0``), ``p_holm``, ``p_equivalent`` (two one-sided
    tests that ``|diff| < margin``), ``p_equivalent_holm`` and ``verdict``: ``resolved`` where
    ``p_holm < 0.05``, ``equivalent`` where ``p_equivalent_holm < 0.05``, else ``inconclusive``.
    ``prefix`` names the columns of one kind of difference in a wider table (``vs_gmc:``)."""
    table = table.copy()
    ivs = [_interval(r, prefix) for _, r in table.iterrows()]
    table[f"{prefix}p"] = [p_value(iv) for iv in ivs]
    table[f"{prefix}p_equivalent"] = [equivalence_p(iv, margin) for iv in ivs]
    for col in ("p", "p_equivalent"):
        adjusted = pd.Series(float("nan"), index=table.index)
        for _, grp in table.groupby(family, sort=False) if family else [(None, table)]:
            adjusted[grp.index] = holm(grp[f"{prefix}{col}"])
        table[f"{prefix}{col}_holm"] = adjusted
    table[f"{prefix}verdict"] = [
        verdict(p, e) for p, e in zip(table[f"{prefix}p_holm"], table[f"{prefix}p_equivalent_holm"])
    ]
    return table


def _interval(row, prefix: str) -> Interval:
    """The :class:`~gmc.results.stats.Interval` of a table row's difference (from its mean,
    standard error and seeds)."""
    n, se = int(row[f"{prefix}n_seeds"]), float(row[f"{prefix}se"])
    sd = se * math.sqrt(n) if n else math.nan
    return Interval(
        float(row[f"{prefix}diff"]),
        float(row[f"{prefix}lo"]),
        float(row[f"{prefix}hi"]),
        float(row[f"{prefix}half"]),
        n,
        sd,
        0.0,
    )


def verdict(p_holm: float, p_equivalent_holm: float) -> str:
    """``resolved``, ``equivalent`` or ``inconclusive`` from a difference's adjusted p-values."""
    if p_holm < ALPHA:
        return "resolved"
    if p_equivalent_holm < ALPHA:
        return "equivalent"
    return "inconclusive"


def family_detectable(table: pd.DataFrame, prefix: str = "") -> tuple[int, int, float]:
    """A family's size ``m``, its typical number of seeds ``n`` (the median) and the smallest
    difference it detects at 80% power after Holm's adjustment (:func:`gmc.results.stats.detectable`),
    from the root mean square of its differences' per-seed spread (evaluation noise included)."""
    ok = table[table[f"{prefix}n_seeds"] >= 2]
    if f"{prefix}same_test_as" in ok.columns:  # each test once
        ok = ok[ok[f"{prefix}same_test_as"] == ""]
    if ok.empty:
        return len(table), 0, float("nan")
    sd = math.sqrt(float(((ok[f"{prefix}se"] ** 2) * ok[f"{prefix}n_seeds"]).mean()))
    n = int(ok[f"{prefix}n_seeds"].median())
    return len(ok), n, detectable(sd, n, len(ok))


LEAGUE_SCORE = ("eval/mean/pass_at_1", FINAL_REWARD)
"""The league's score: final Pass@1 (mean over benchmarks), or the final training reward where a
sweep evaluates nothing."""


def league_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
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
            return dict(
                diff=float("nan"),
                lo=float("nan"),
                hi=float("nan"),
                half=float("nan"),
                se=float("nan"),
                n_seeds=0,
                n_sign=0,
                excludes_zero=False,
            )
        p = paired_difference(
            both[f"{score}:a"],
            both[f"{score}:b"],
            both.get(f"{se}:a"),
            both.get(f"{se}:b"),
            se_d=_problem_paired_se(both, score),
        )
        iv = p.interval
        return dict(
            diff=iv.mean,
            lo=iv.lo,
            hi=iv.hi,
            half=iv.half,
            se=iv.se,
            n_seeds=iv.n,
            n_sign=p.n_sign,
            excludes_zero=p.excludes_zero,
        )

    problems = [c for c in point.columns if c.endswith(PROBLEMS) and c.startswith("eval/")]
    keep = ["seed", score, *([se] if se in point.columns else []), *problems]
    gmc = at[at["algorithm"] == "gmc"][keep]
    rows = []
    for algorithm, grp in at.groupby("algorithm", sort=False):
        iv = mean_interval(grp[score], grp[se] if se in grp.columns else None)
        on_policy = point[(point["algorithm"] == algorithm) & (point["delay"] == "0")][keep]
        own = REGISTRY[algorithm].diagnostics if algorithm in REGISTRY else ()
        row = dict(
            algorithm=algorithm,
            delay=delay,
            group=group,
            score=score,
            mean=iv.mean,
            lo=iv.lo,
            hi=iv.hi,
            half=iv.half,
            n_seeds=iv.n,
            **{f"vs_gmc:{k}": v for k, v in paired(grp[keep], gmc.iloc[:0] if algorithm == "gmc" else gmc).items()},
            **{f"staleness_cost:{k}": v for k, v in paired(grp[keep], on_policy).items()},
            own_statistic=own[0] if own else "",
            own_value=float(grp[own[0]].mean()) if own and own[0] in grp.columns else float("nan"),
        )
        for col in SHARED_DIAGNOSTICS:
            row[col] = float(grp[col].mean()) if col in grp.columns else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows).sort_values("mean", ascending=False, kind="stable").reset_index(drop=True)
    table.insert(0, "rank", range(1, len(table) + 1))
    table = judge_league(table, analysis.equivalence_margin)
    shown = _league_display(table)
    return Rendered(table, _markdown(shown), _latex(shown))


LEAGUE_KINDS = ("vs_gmc", "staleness_cost")
"""The league's two kinds of differences, one family together (the league's differences in its score)."""


def judge_league(table: pd.DataFrame, margin: float) -> pd.DataFrame:
    """:func:`judge` over the league's differences of both kinds as one family."""
    long = pd.concat(
        [
            table[[c for c in table.columns if c.startswith(f"{k}:")]]
            .rename(columns=lambda c: c.split(":", 1)[1])
            .assign(kind=k, row=table.index)
            for k in LEAGUE_KINDS
        ],
        ignore_index=True,
    )
    judged = judge(long, [], margin)
    table = table.copy()
    for k in LEAGUE_KINDS:
        part = judged[judged["kind"] == k].set_index("row")
        for col in ("p", "p_holm", "p_equivalent", "p_equivalent_holm", "verdict"):
            table[f"{k}:{col}"] = part[col]
    return table


MARKS = {"resolved": " *", "equivalent": " ≈", "inconclusive": ""}
"""How a cell shows a difference's verdict."""


def _signed(diff, half, n_sign, n, verdict) -> str:
    if pd.isna(diff):
        return "-"
    cell = f"{diff:+.3f}" if pd.isna(half) else f"{diff:+.3f} ± {half:.3f}"
    return f"{cell} ({n_sign}/{n}){MARKS.get(verdict, '')}"


def _league_display(table: pd.DataFrame) -> pd.DataFrame:
    """The league as the Markdown and LaTeX files show it; ``*`` resolved, ``≈`` equivalent within
    the margin, both after Holm's adjustment over the league's differences."""
    name = pretty(table["score"].iloc[0]) if len(table) else "score"
    labels = [REGISTRY[a].label if a in REGISTRY else a for a in table["algorithm"]]
    out = pd.DataFrame({"rank": table["rank"], "estimator": labels})
    out[f"{name} at delay {table['delay'].iloc[0]}"] = [
        f"{_fmt(m, h)} [{lo:.3f}, {hi:.3f}]" if not pd.isna(lo) else _fmt(m, h)
        for m, h, lo, hi in zip(table["mean"], table["half"], table["lo"], table["hi"])
    ]
    for key, title in (("vs_gmc", "− GMC (sign)"), ("staleness_cost", "cost of staleness (sign)")):
        out[title] = [
            _signed(*r)
            for r in zip(
                table[f"{key}:diff"],
                table[f"{key}:half"],
                table[f"{key}:n_sign"],
                table[f"{key}:n_seeds"],
                table[f"{key}:verdict"],
            )
        ]
    out["own statistic"] = [
        f"{s.removeprefix('ratio/')} {v:.3f}" if s and not pd.isna(v) else "-"
        for s, v in zip(table["own_statistic"], table["own_value"])
    ]
    for col in SHARED_DIAGNOSTICS:
        out[col.removeprefix("ratio/")] = ["-" if pd.isna(v) else f"{v:.3f}" for v in table[col]]
    out["seeds"] = table["n_seeds"]
    return out


def judged_differences(paired: pd.DataFrame, which: str) -> list[str]:
    """One sentence per paired difference of verdict ``which`` (``resolved``, ``equivalent``)."""
    return [
        f"{r.comparison} at delay {r.delay}, G = {r.group}, {pretty(r.metric)}: {r.diff:+.3f} "
        f"[{r.lo:+.3f}, {r.hi:+.3f}], sign in {r.n_sign}/{r.n_seeds} seeds, p_holm {r.p_holm:.3f}"
        + _same_test(r.same_test_as)
        for r in paired.itertuples()
        if r.verdict == which
    ]


def _same_test(same_test_as) -> str:
    """`` (the same runs as ...)`` for a difference that pairs the runs of an earlier one."""
    return f" (the same runs as {same_test_as})" if isinstance(same_test_as, str) and same_test_as else ""


def outcomes(runs: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The sweep's outcomes as ``(column, role, label)``: Pass@1 over the benchmarks at the
    evaluation temperature, primary, and the final training reward at the sampling temperature,
    secondary; the training reward alone is primary where nothing was evaluated."""
    frame = with_benchmark_means(runs)

    def at(col: str) -> str:
        values = sorted(set(runs[col].dropna())) if col in runs.columns else []
        return f" (T = {', '.join(f'{v:g}' for v in values)})" if values else ""

    out = []
    if "eval/mean/pass_at_1" in frame.columns:
        out.append(("eval/mean/pass_at_1", "primary", f"Pass@1{at('eval_temperature')}"))
    out.append((FINAL_REWARD, "secondary" if out else "primary", f"train reward{at('train_temperature')}"))
    return out


CONCLUSION_COLUMNS = [
    "role",
    "outcome",
    "table",
    "comparison",
    "delay",
    "group",
    "diff",
    "lo",
    "hi",
    "n_seeds",
    "p_holm",
    "p_equivalent_holm",
    "verdict",
    "family_size",
    "detectable",
    "same_test_as",
]


def conclusions_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Every difference of the primary outcome's families (the paired table's and the league's),
    and of the secondary's, judged ``resolved``, ``equivalent`` within the margin or
    ``inconclusive`` after Holm's adjustment per family (:func:`judge`), each family with the
    smallest difference it detects at 80% power: what a document may say of the sweep, and what
    ``gmc compare-results`` judges a re-run by."""
    margin = analysis.equivalence_margin
    paired = paired_differences(runs, margin=margin)
    league = league_table(runs, base, analysis).frame
    rows = []
    for metric, role, label in outcomes(runs):
        fam = paired[(paired["metric"] == metric) & (paired["verdict"] != ONE_RUN)] if len(paired) else paired
        if len(fam):
            m, _, mde = family_detectable(fam)
            rows += [
                dict(
                    role=role,
                    outcome=label,
                    table="paired",
                    comparison=r.comparison,
                    delay=r.delay,
                    group=r.group,
                    diff=r.diff,
                    lo=r.lo,
                    hi=r.hi,
                    n_seeds=r.n_seeds,
                    p_holm=r.p_holm,
                    p_equivalent_holm=r.p_equivalent_holm,
                    verdict=r.verdict,
                    family_size=m,
                    detectable=mde,
                    same_test_as=r.same_test_as,
                )
                for r in fam.itertuples()
            ]
        if len(league) and league["score"].iloc[0] == metric:
            long = pd.concat(
                [
                    league[[c for c in league.columns if c.startswith(f"{k}:")]]
                    .rename(columns=lambda c: c.split(":", 1)[1])
                    .assign(
                        comparison=[
                            f"{a} − gmc" if k == "vs_gmc" else f"{a}: stale − on-policy" for a in league["algorithm"]
                        ]
                    )
                    for k in LEAGUE_KINDS
                ],
                ignore_index=True,
            )
            long = long[long["n_seeds"] > 0]
            m, _, mde = family_detectable(long)
            delay, group = league["delay"].iloc[0], league["group"].iloc[0]
            rows += [
                dict(
                    role=role,
                    outcome=label,
                    table="league",
                    comparison=r.comparison,
                    delay=delay,
                    group=group,
                    diff=r.diff,
                    lo=r.lo,
                    hi=r.hi,
                    n_seeds=r.n_seeds,
                    p_holm=r.p_holm,
                    p_equivalent_holm=r.p_equivalent_holm,
                    verdict=r.verdict,
                    family_size=m,
                    detectable=mde,
                    same_test_as="",
                )
                for r in long.itertuples()
            ]
    table = pd.DataFrame(rows, columns=CONCLUSION_COLUMNS)
    return Rendered(table, conclusions_markdown(table, margin), _latex(_conclusions_display(table)))


def _conclusions_display(table: pd.DataFrame) -> pd.DataFrame:
    out = table[["outcome", "table", "comparison", "delay", "group"]].copy()
    out["difference [95% interval]"] = [
        f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" if not pd.isna(lo) else _fmt(d, float("nan"))
        for d, lo, hi in zip(table["diff"], table["lo"], table["hi"])
    ]
    out["seeds"] = table["n_seeds"]
    out["p (Holm)"] = ["-" if pd.isna(p) else f"{p:.3f}" for p in table["p_holm"]]
    out["verdict"] = table["verdict"]
    return out


def conclusions_markdown(table: pd.DataFrame, margin: float) -> str:
    """The conclusions as a document: per family its size and detectable difference, then its
    differences with their verdicts."""
    lines = [
        f"Every difference of the sweep's outcomes, judged within its family (one table's "
        f"differences in one outcome, each test counted once): **resolved** where Holm's adjusted p < {ALPHA}, **equivalent "
        f"within ±{margin}** where two one-sided tests, adjusted likewise, place it inside the margin, "
        "**inconclusive** otherwise. Intervals: 95% over seeds, evaluation noise folded in, "
        "evaluated scores paired per problem.",
        "",
    ]
    for (role, outcome, name), fam in table.groupby(["role", "outcome", "table"], sort=False):
        lines += [
            f"## {outcome}, {role}: {name} table",
            "",
            f"{fam['family_size'].iloc[0]} tests; the smallest detectable at {POWER:.0%} power after "
            f"adjustment: ±{fam['detectable'].iloc[0]:.3f}.",
            "",
        ]
        for r in fam.itertuples():
            words = {
                "resolved": "resolved",
                "equivalent": f"equivalent within ±{margin}",
                "inconclusive": "inconclusive",
            }[r.verdict]
            estimate = f"{r.diff:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}]" if not pd.isna(r.lo) else f"{r.diff:+.3f}"
            lines.append(
                f"- {r.comparison} at delay {r.delay}, G = {r.group}: {estimate}, {r.n_seeds} seeds, "
                f"p_holm {r.p_holm:.3f}: **{words}**{_same_test(r.same_test_as)}"
            )
        lines.append("")
    if table.empty:
        lines.append("No differences: the sweep compares nothing.")
    return "\n".join(lines).rstrip() + "\n"


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
    """One row per (comparison, delay, group); cells ``diff ± half (sign count)``, ``*`` resolved
    and ``≈`` equivalent (:func:`judge`)."""
    rows = []
    for (comp, delay, group), grp in paired.groupby(["comparison", "delay", "group"], sort=False):
        row = {"comparison": comp, "delay": delay, "group": group}
        for r in grp.itertuples():
            row[pretty(r.metric)] = _signed(r.diff, r.half, r.n_sign, r.n_seeds, r.verdict)
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
        return str(x).replace("_", r"\_").replace("±", r"$\pm$").replace("−", "$-$").replace("~", r"\textasciitilde{}")

    cols = "l" * 3 + "r" * (len(shown.columns) - 3)
    lines = [
        rf"\begin{{tabular}}{{{cols}}}",
        r"\toprule",
        " & ".join(esc(c) for c in shown.columns) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(esc(v) for v in row) + r" \\" for row in shown.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


_HTML_STYLE = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:1.2em;color:#1e293b}"
    "table{border-collapse:collapse;margin:.6em 0}th,td{padding:.25em .6em;border-bottom:1px solid #cbd5e1;"
    "white-space:nowrap}th{text-align:left;background:#f1f5f9}td:not(:first-child){text-align:right}"
    "p,li{max-width:60em}"
)


def _inline_html(text: str) -> str:
    """Escaped text with Markdown's ``**strong**`` and ```code``` spans."""
    out = html.escape(text, quote=False)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def markdown_html(markdown: str, title: str) -> str:
    """A standalone HTML page of the Markdown the tables write (headings, paragraphs, bullet
    lists, pipe tables, strong and code spans): what the HTML report shows inline."""
    body, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level + 1}>{_inline_html(line[level:].strip())}</h{level + 1}>")
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            head, rest = rows[0], [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
            body.append(
                "<table><thead><tr>" + "".join(f"<th>{_inline_html(c)}</th>" for c in head) + "</tr></thead>"
                "<tbody>"
                + "".join("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in r) + "</tr>" for r in rest)
                + "</tbody></table>"
            )
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline_html(lines[i][2:])}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ")):
                para.append(lines[i])
                i += 1
            body.append(f"<p>{_inline_html(' '.join(para))}</p>")
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_HTML_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def to_markdown(table: pd.DataFrame) -> str:
    return _markdown(_display(table))


def to_latex(table: pd.DataFrame) -> str:
    return _latex(_display(table))


PAIRED_NOTE = (
    f"Paired differences at equal (delay, G, seed), and each estimator's cost of staleness "
    "(A: stale − on-policy, the estimator at the row's delay minus itself at delay 0, equal G "
    f"and seed): mean ± half-width of the {LEVEL:.0%} t-interval over seeds (evaluation noise "
    "folded in, evaluated scores paired per problem), (seeds with the mean's sign / seeds paired). "
    "The table's differences in one outcome are a family, each test counted once (a difference "
    "of one shared run is none, two of the same runs are one): * resolved (Holm-adjusted p < "
    f"{ALPHA}), ≈ equivalent within ±{{margin}} (two one-sided tests, adjusted likewise)."
)


def paired_markdown(paired: pd.DataFrame, margin: float = AnalysisConfig().equivalence_margin) -> str:
    lines = [PAIRED_NOTE.format(margin=margin), ""]
    for which in ("resolved", "equivalent"):
        found = judged_differences(paired, which) if len(paired) else []
        lines += [f"{which.capitalize()} differences:", ""]
        lines += [f"- {s}" for s in found] if found else ["- none"]
        lines.append("")
    if len(paired):
        lines += [f"Smallest difference each family detects at {POWER:.0%} power (after adjustment):", ""]
        for metric, grp in paired.groupby("metric", sort=False):
            m, n, mde = family_detectable(grp)
            lines.append(f"- {pretty(metric)}: {m} tests, {n} seeds: ±{mde:.3f}")
        lines.append("")
    return "\n".join(lines) + "\n" + (_markdown(_paired_display(paired)) if len(paired) else "")


def make_tables(results: str | Path) -> dict[str, Rendered]:
    """Every table of :data:`gmc.results.outputs.TABLES` from the runs and evaluations under
    ``results``, with its analysis settings (:func:`gmc.results.outputs.analysis_config`)."""
    runs, base, analysis = collect(results), base_scores(results), analysis_config(results)
    return {name: entry.resolve()(runs, base, analysis) for name, entry in TABLES.items()}


def write_tables(results: str | Path, out: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """Every table of :data:`gmc.results.outputs.TABLES` as CSV, Markdown, LaTeX and HTML under ``out``
    (default ``<results>/tables``); returns the tidy frames by name."""
    out = Path(out or Path(results) / "tables")
    tables = {}
    for name, table in make_tables(results).items():
        write_csv(table.frame, out / f"{name}.csv")
        write_text(out / f"{name}.md", table.markdown)
        write_text(out / f"{name}.tex", table.latex)
        write_text(out / f"{name}.html", table.html(f"{name}: {TABLES[name].label}"))
        tables[name] = table.frame
    return tables
