"""The tables of :data:`gmc.results.outputs.TABLES` and, where a sweep's analysis asks for them,
:data:`gmc.results.outputs.STUDY_TABLES` (method.md section 7): one function per entry,
and :func:`make_tables` / :func:`write_tables`, which draw and write them all from a results folder
or a bundle.

A table function takes the runs' frame (:func:`gmc.results.collect.collect`), the base model's
scores (:func:`gmc.results.collect.base_scores`) and the analysis settings, picks its rows and
columns, has :mod:`gmc.results.inference` estimate and judge what it reports and returns it as a
:class:`gmc.results.render.Rendered` table: the tidy frame (CSV), Markdown, LaTeX and HTML. Every
cell is a mean ± 95% interval over seeds (:func:`gmc.results.stats.mean_interval`) or a paired
difference (:func:`gmc.results.stats.paired_difference`); files are the source of truth, nothing
is retrained.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import yaml

from gmc.io import write_csv, write_text
from gmc.results.collect import base_scores, collect, score_columns, with_base, with_benchmark_means
from gmc.results.inference import (
    aggregate,
    conclusions,
    hypothesis_tests,
    league_ranking,
    paired_differences,
    tuning_choices,
)
from gmc.results.outputs import TUNED, AnalysisConfig, analysis_config, table_entry, table_names
from gmc.results.render import (
    TUNING_NOTE,
    Rendered,
    algorithm_labels,
    conclusions_display,
    conclusions_markdown,
    hypotheses_display,
    hypotheses_markdown,
    latex_table,
    league_display,
    league_note,
    markdown_table,
    paired_display,
    paired_markdown,
    pretty,
    to_latex,
    to_markdown,
    tuning_display,
)

DIAGNOSTICS = ["async/staleness_mean", "ratio/ess_frac", "ratio/shortfall", "time/step_seconds"]
"""Diagnostics table columns; each estimator's own clip statistics (``ratio/frac_*``, named in its
registry entry and kept in ``summary.json``) go after the staleness."""


log = logging.getLogger(__name__)


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
    shown["algorithm"] = algorithm_labels(table)
    for col in score_columns(frame):
        shown[pretty(col)] = ["-" if pd.isna(v) else f"{v:.3f}" for v in table[col]]
    return Rendered(table.reset_index(drop=True), markdown_table(shown), latex_table(shown))


def diagnostics_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Staleness, each estimator's own clip statistics, ESS, shortfall and step time."""
    own = [c for c in runs.columns if c.startswith("ratio/frac_")]
    table = aggregate(runs, [DIAGNOSTICS[0], *own, *DIAGNOSTICS[1:]])
    return Rendered(table, to_markdown(table), to_latex(table))


def paired_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Paired differences (:func:`gmc.results.inference.paired_differences`), judged per family
    (:func:`gmc.results.inference.judge`)."""
    table = paired_differences(runs, margin=analysis.equivalence_margin, hypotheses=analysis.hypotheses)
    return Rendered(
        table,
        paired_markdown(table, analysis.equivalence_margin),
        latex_table(paired_display(table)) if len(table) else "",
    )


def league_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Every estimator at the largest fixed delay, ranked by final Pass@1, with its paired
    difference to ``gmc``, its cost of staleness and its own statistics
    (:func:`gmc.results.inference.league_ranking`); empty Markdown and LaTeX where the sweep has no
    fixed delay or no score."""
    table = league_ranking(runs, analysis.equivalence_margin, analysis.hypotheses)
    if table.empty:
        return Rendered(table, "", "")
    shown = league_display(table)
    return Rendered(
        table, league_note(analysis.equivalence_margin) + "\n\n" + markdown_table(shown), latex_table(shown)
    )


def hypotheses_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """The pre-registered hypotheses (``analysis.hypotheses``) tested as one family
    (:func:`gmc.results.inference.hypothesis_tests`), each confirmed, contradicted or undecided."""
    margin = analysis.equivalence_margin
    table = hypothesis_tests(runs, analysis.hypotheses, margin).drop(columns="_runs")
    return Rendered(table, hypotheses_markdown(table, margin), latex_table(hypotheses_display(table)))


def tuning_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Each tuned estimator's candidates and the one rule's choice (``analysis.tune``,
    :func:`gmc.results.inference.tuning_choices`)."""
    table = tuning_choices(runs, analysis.tune)
    shown = tuning_display(table)
    return Rendered(table, TUNING_NOTE + "\n\n" + markdown_table(shown), latex_table(shown))


def tuned_settings(table: pd.DataFrame) -> dict:
    """What a tuning sweep chose (the ``tuning`` table's frame) as :data:`~gmc.results.outputs.TUNED`
    holds it: per estimator the chosen candidate, its mean score and the estimator settings to
    train with."""
    chosen = table[table["chosen"]]
    return {
        "rule": "the highest mean Pass@1 over seeds at the largest fixed delay",
        "delay": str(table["delay"].iloc[0]),
        "group": int(table["group"].iloc[0]),
        "estimators": {
            r.estimator: {
                "chosen": r.candidate,
                "mean": round(float(r.mean), 6),
                "seeds": int(r.n_seeds),
                "estimator": json.loads(r.settings),
            }
            for r in chosen.itertuples()
        },
    }


def conclusions_table(runs: pd.DataFrame, base: pd.DataFrame, analysis: AnalysisConfig) -> Rendered:
    """Every difference of the sweep's outcomes with its verdict after Holm's adjustment per
    family (:func:`gmc.results.inference.conclusions`): what a document may say of the sweep, and
    what ``gmc compare-results`` judges a re-run by."""
    margin = analysis.equivalence_margin
    table = conclusions(runs, margin, analysis.hypotheses)
    return Rendered(table, conclusions_markdown(table, margin), latex_table(conclusions_display(table)))


def make_tables(results: str | Path) -> dict[str, Rendered]:
    """Every table the sweep's analysis settings ask for (:func:`gmc.results.outputs.table_names`:
    every one of :data:`~gmc.results.outputs.TABLES`, and the study tables its keys name) from the
    runs and evaluations under ``results``, with those settings
    (:func:`gmc.results.outputs.analysis_config`)."""
    runs, base, analysis = collect(results), base_scores(results), analysis_config(results)
    seeds = runs.groupby(["algorithm", "delay", "group"])["seed"].nunique()
    if (seeds < 2).any():
        log.warning(
            "%s: %d of %d points have fewer than two seeds: their cells have no interval (the mean alone) "
            "and none of their differences can be resolved; run more seeds (sweep.seed)",
            results,
            int((seeds < 2).sum()),
            len(seeds),
        )
    return {name: table_entry(name).resolve()(runs, base, analysis) for name in table_names(analysis)}


def write_tables(results: str | Path, out: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """Every table of :func:`make_tables` as CSV, Markdown, LaTeX and HTML under ``out`` (default
    ``<results>/tables``), and a tuning sweep's choice as :data:`~gmc.results.outputs.TUNED`;
    returns the tidy frames by name."""
    out = Path(out or Path(results) / "tables")
    tables = {}
    for name, table in make_tables(results).items():
        write_csv(table.frame, out / f"{name}.csv")
        write_text(out / f"{name}.md", table.markdown)
        write_text(out / f"{name}.tex", table.latex)
        write_text(out / f"{name}.html", table.html(f"{name}: {table_entry(name).label}"))
        tables[name] = table.frame
    if "tuning" in tables:
        write_text(out / Path(TUNED).name, yaml.safe_dump(tuned_settings(tables["tuning"]), sort_keys=False))
    return tables
