"""The runs of a results folder or a bundle as a frame (method.md section 7): files are the source
of truth, nothing is retrained.

:func:`collect` reads one row per finished run (its sweep point, training summary, evaluation
scores with their standard errors and per-problem scores, and the settings its files record),
:func:`base_scores` the base model's scores, one row per seed; the helpers name the frame's score
columns, add the means over benchmarks and tell each variant's estimator. What the tables infer
from these rows is :mod:`gmc.results.inference`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from gmc.run.evaluate import SE, eval_scores, problem_scores
from gmc.run.rundir import SHARED, SUMMARY
from gmc.sweep.points import Point, delay_order

FINAL_REWARD = "rollout/reward_mean_last20"
"""The final training reward (``summary.json``): the mean reward of the rollouts of a run's last 20
steps, at the sampling temperature."""


def collect(results: str | Path) -> pd.DataFrame:
    """One row per finished run under ``results/train`` with its evaluation columns; a point that
    shares another point's run (:data:`gmc.run.rundir.SHARED`) gets that run's row under its own
    name, with ``shared_with`` naming the estimator that trained it."""
    results = Path(results)
    rows = []
    found = [*(results / "train").glob(f"**/{SHARED}"), *(results / "train").glob(f"**/{SUMMARY}")]
    for marker in sorted(found):
        point = Point.find(marker.parent)
        if point is None:
            continue
        run_dir, extra = marker.parent, {}
        if marker.name == SHARED:
            shared = json.loads(marker.read_text())["run"]
            run_dir, extra = results / "train" / shared, {"shared_with": Point.parse(shared).algorithm}
        row = {**point.fields(), **json.loads((run_dir / SUMMARY).read_text()), "run_dir": str(run_dir), **extra}
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
    return frame.sort_values(["algorithm", "delay", "group", "seed"], key=delay_key).reset_index(drop=True)


PROBLEMS = ":problems"
"""Suffix of a run's per-problem scores of an evaluation (``(problems fingerprint, scores)``)."""


def run_settings(run_dir: Path, eval_dir: Path) -> dict[str, Any]:
    """What the files of a run and its evaluation record of their settings: the sampling
    temperature of its training rollouts and of its evaluation's samples (for the outcomes'
    labels), the estimator it trained with (``estimator``: a variant's point is named apart
    from its estimator, ``variants`` in the workflow's config) and that estimator's settings
    (``estimator_settings``, JSON: what a tuning sweep chooses among)."""
    out: dict[str, Any] = {}
    config = run_dir / "config.yaml"
    if config.exists():
        saved = yaml.safe_load(config.read_text()) or {}
        sampling = saved.get("sampling") or {}
        if "temperature" in sampling:
            out["train_temperature"] = float(sampling["temperature"])
        if "algorithm" in saved:
            out["estimator"] = saved["algorithm"]
        if isinstance(saved.get("estimator"), dict):
            out["estimator_settings"] = json.dumps(saved["estimator"], sort_keys=True)
    for f in sorted(eval_dir.glob("*.json")):
        ev = json.loads(f.read_text())
        if "temperature" in ev and "benchmark" in ev:
            out["eval_temperature"] = float(ev["temperature"])
            break
    return out


def delay_key(col: pd.Series) -> pd.Series:
    """A sort key for the frame: delays in their order (:func:`gmc.sweep.points.delay_order`),
    other columns as they are."""
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


def variant_estimators(frame: pd.DataFrame) -> dict[str, str]:
    """Each variant in ``frame`` and the estimator it varies: a point named apart from the
    estimator its runs trained with (``variants`` in the workflow's config; the frame's
    ``estimator``, :func:`run_settings`)."""
    if "estimator" not in frame.columns:
        return {}
    return {a: e for a, e in zip(frame["algorithm"], frame["estimator"]) if isinstance(e, str) and a != e}
