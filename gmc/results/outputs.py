"""What a sweep writes from its run directories: tables, figures and the theory lab's files, by
name (method.md section 7).

:data:`TABLES` and :data:`FIGURES` are the registries ``gmc tables`` / ``gmc figures`` call and
the workflow's rules read for their outputs; an entry names the function that makes it
(``module:function``, imported only when called, so the workflow reads the registry without
pandas or matplotlib). A table function takes the runs' frame (:func:`gmc.results.collect.collect`),
the base model's scores (:func:`gmc.results.collect.base_scores`, a row per seed) and the
analysis settings (:class:`AnalysisConfig`) and returns a :class:`gmc.results.render.Rendered`
table, written as ``<name>.csv``, ``.md``, ``.tex`` and ``.html`` (the HTML report's); a figure function takes the frame and the
output folder and writes ``<name>.png`` and ``.pdf``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gmc.results.hypotheses import Hypothesis
from gmc.settings import Fraction, load_config, load_named, settings

ANALYSIS = "configs/analysis.yaml"
"""Where a results folder (or a bundle) keeps the analysis settings its tables were drawn with."""


@settings(prefix="analysis.")
class AnalysisConfig:
    """How the tables judge a difference (method.md section 7). Each table's differences in one
    outcome form a family; within it the p-values are adjusted by Holm's method and a difference
    is *resolved* where the adjusted value is below 0.05, *equivalent* where the two one-sided
    tests within the margin, adjusted likewise, are, and *inconclusive* otherwise. The primary
    outcome is Pass@1 at the evaluation temperature (mean over benchmarks), the training reward
    (at the sampling temperature) secondary."""

    equivalence_margin: Fraction = 0.05
    """Two estimators are called equivalent in an outcome when their difference lies within
    ``±`` this, in the outcome's units (a fraction of problems, or of rewarded samples): 0.05 is a
    twentieth of the scale, a third of what the default run's estimators gain by training."""
    tune: list[str] = field(default_factory=list)
    """Estimators whose settings the sweep chooses (a tuning sweep, ``workflow/presets/tune.yaml``):
    each among itself and its variants in the sweep, by one rule: the highest mean primary score
    (Pass@1) over seeds at the largest fixed delay, ties to the first in the sweep. The choice and
    every candidate's score go to ``tables/tuning.*``, the chosen settings to ``tables/tuned.yaml``,
    which another sweep trains with (``tuned`` in its configuration)."""
    hypotheses: list[Hypothesis] = field(default_factory=list)
    """A confirmatory sweep's pre-registered hypotheses (:class:`gmc.results.hypotheses.Hypothesis`),
    tested in the primary outcome as one family of their own (``hypotheses``), each judged
    confirmed, contradicted or undecided (``tables/hypotheses.*``); a difference of the paired
    table that pairs the same runs as one of them is that test, not a second one."""


def analysis_config(results: str | Path) -> AnalysisConfig:
    """The analysis settings of a results folder or bundle (:data:`ANALYSIS`), else the defaults."""
    path = Path(results) / ANALYSIS
    return load_config(AnalysisConfig, path) if path.exists() else AnalysisConfig()


@dataclass(frozen=True)
class Output:
    """A registered table or figure."""

    function: str
    """``module:function`` that makes it."""
    label: str
    """What it shows in a few words (the HTML report's list of results)."""
    title: str
    """What it shows, in a sentence (the docs' description of it)."""

    def resolve(self) -> Callable:
        return load_named(self.function)


TABLES: dict[str, Output] = {
    "conclusions": Output(
        "gmc.results.tables:conclusions_table",
        "verdicts on every difference",
        "Every difference of the primary outcome (and the secondary) judged resolved, equivalent "
        "within the margin, or inconclusive, after Holm's adjustment per family.",
    ),
    "main": Output(
        "gmc.results.tables:main_table",
        "scores per estimator and delay",
        "Scores per algorithm, delay and group size: mean ± 95% interval over seeds.",
    ),
    "paired": Output(
        "gmc.results.tables:paired_table",
        "paired differences",
        "Paired differences between estimators and each one's cost of staleness.",
    ),
    "diagnostics": Output(
        "gmc.results.tables:diagnostics_table",
        "staleness and clipping",
        "Staleness and each estimator's clip, cap and weight statistics.",
    ),
    "league": Output(
        "gmc.results.tables:league_table",
        "estimators ranked at the largest delay",
        "Every estimator at the largest delay ranked by final Pass@1 (95% intervals), its paired "
        "difference to GMC and cost of staleness with sign counts, and its own statistics.",
    ),
    "runs": Output(
        "gmc.results.tables:runs_table",
        "every run, one row per seed",
        "Every run's final scores, one row per seed, each seed's base model first.",
    ),
}
"""Every table of a sweep by name, the verdicts first."""

STUDY_TABLES: dict[str, Output] = {
    "hypotheses": Output(
        "gmc.results.tables:hypotheses_table",
        "pre-registered hypotheses",
        "Each pre-registered hypothesis (analysis.hypotheses): its contrast over seeds, its tests "
        "Holm-adjusted as one family, and whether the sweep confirms, contradicts or leaves it undecided.",
    ),
    "tuning": Output(
        "gmc.results.tables:tuning_table",
        "tuned settings",
        "Each tuned estimator's candidates (analysis.tune) at the largest delay, their Pass@1 over "
        "seeds and the one rule's choice, also written as tables/tuned.yaml.",
    ),
}
"""The tables of a tuning or confirmatory sweep, each made where its analysis key is given
(:func:`table_names`)."""

TUNED = "tables/tuned.yaml"
"""Where a tuning sweep (``analysis.tune``) writes the settings it chose, which another sweep
trains with (``tuned`` in its configuration)."""


def table_entry(name: str) -> Output:
    """The registry entry of the table ``name``, of :data:`TABLES` or :data:`STUDY_TABLES`."""
    return TABLES[name] if name in TABLES else STUDY_TABLES[name]


def table_names(analysis) -> list[str]:
    """The tables a sweep of these analysis settings (an :class:`AnalysisConfig` or its section as
    given) makes: every one of :data:`TABLES`, and each of :data:`STUDY_TABLES` whose key it sets."""
    get = analysis.get if isinstance(analysis, dict) else lambda key: getattr(analysis, key)
    return [*TABLES, *(name for name, key in (("hypotheses", "hypotheses"), ("tuning", "tune")) if get(key))]


TABLE_FORMATS = ("csv", "md", "tex", "html")

FIGURES: dict[str, Output] = {
    "score_vs_delay": Output(
        "gmc.results.figures:score_vs_delay",
        "final score against delay",
        "Final score against the fixed delay, one panel per group size; each named delay mode "
        "a point of its own marker at its mean consumed staleness.",
    ),
    "reward_vs_step": Output(
        "gmc.results.figures:reward_vs_step",
        "training curves",
        "Reward of the fresh rollouts against the optimizer step, one panel per delay, "
        "10-step moving average, largest group size.",
    ),
    "score_vs_group": Output(
        "gmc.results.figures:score_vs_group",
        "final score against group size",
        "Final score against the group size G, one panel per delay (a sweep of one G: the "
        "scores at that G, titled as such).",
    ),
    "ratio_diagnostics": Output(
        "gmc.results.figures:ratio_diagnostics",
        "clipping, ESS and shortfall",
        "Each estimator's capped or clipped fraction, ESS / G and the shortfall "
        "sum(rho - w) / sum(rho), mean over training, against the delay.",
    ),
    "staleness_vs_length": Output(
        "gmc.results.figures:staleness_vs_length",
        "staleness against length",
        "Staleness against the group's longest response under each named delay mode the "
        "sweep ran: under the latency model the delay depends on the trajectory (the "
        "paper's Assumption 3 fails).",
    ),
    "staleness_distribution": Output(
        "gmc.results.figures:staleness_distribution",
        "staleness distribution",
        "The distribution of consumed staleness under each named delay mode the sweep "
        "ran (the latency model; real asynchrony on Ray and replayed traces where a "
        "preset runs them), side by side.",
    ),
}
"""Every figure of a sweep by name, the headline first."""

FIGURE_FORMATS = ("png", "pdf")

THEORY_FILES: tuple[str, ...] = (
    "fixed_policy.csv",
    "claims.csv",
    "delayed_summary.csv",
    "theory_bias_vs_G_exact_baseline.png",
    "theory_bias_vs_eps.png",
    "theory_shortfall_vs_eps.png",
    "theory_reward_vs_delay.png",
)
"""What the workflow asks of the theory lab (``gmc theory``; it writes more, see :mod:`gmc.theory.lab`)."""


GRADIENT_LAB_TABLES: dict[str, str] = {
    "gradients": "one row per delay, group size, cap and estimator: bias against the on-policy target, excess "
    "over uncapped IS, cosine, second moment, variance and the estimator's own statistics",
    "pairs": "the divergence of each pair of weights on the behaviour samples (trajectory log-ratio, k3 KL, "
    "IS's ESS / G)",
    "claims": "the paper's claims fitted on the rows: exponents in G and eps, GMC's second moment over TIC's",
    "prompts": "the lab's prompts and the mean reward of the group that screened each at the behaviour weights",
}
"""The gradient lab's tables (``<name>.csv``, :mod:`gmc.theory.gradients`)."""

GRADIENT_LAB_FIGURES: dict[str, str] = {
    "gradient_bias_vs_G": "each estimator's bias against its on-policy target vs G, one panel per delay",
    "gradient_excess_vs_G": "the cap's bias over uncapped IS vs G (tic, gmc, none), with the fitted exponents",
    "gradient_excess_vs_eps": "the cap's bias over uncapped IS vs eps at the largest delay",
}
"""The gradient lab's figures, drawn from its tables alone (``gmc report`` redraws them)."""

LAB_FOLDER = "gradient_lab"
"""Where a results folder (or a bundle) keeps the gradient lab's files."""

GRADIENT_LAB_FILES: tuple[str, ...] = (
    *(f"{t}.csv" for t in GRADIENT_LAB_TABLES),
    "gradient_lab.md",
    *(f"{f}.{ext}" for f in GRADIENT_LAB_FIGURES for ext in ("png", "pdf")),
)
"""What the workflow asks of the gradient lab (``gmc gradient-lab``), under ``<results>/gradient_lab/``;
a bundle keeps its tables, Markdown and settings (``gmc report`` redraws the figures)."""


def table_files(name: str) -> list[str]:
    return [f"{name}.{ext}" for ext in TABLE_FORMATS]


def figure_files(name: str) -> list[str]:
    return [f"{name}.{ext}" for ext in FIGURE_FORMATS]
