"""What a run's ``metrics.jsonl`` comes to: the lines a seed reproduces (:func:`without_time`),
the run's ``summary.json`` (:func:`summarize_metrics`, with :func:`count_groups` of its
``groups.jsonl``) and the sampling noise of its final training reward (:func:`reward_se`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gmc.estimators import diagnostic_names
from gmc.io import read_jsonl

TIME_PREFIX = "time/"
"""Wall-clock metrics (with the line's ``time`` stamp); everything else in ``metrics.jsonl`` is
reproducible from the seed."""


def without_time(rows: list[dict]) -> list[dict]:
    """Metrics lines without their wall-clock entries: what a seed reproduces."""
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith(TIME_PREFIX)} for r in rows]


def reward_se(rows: list[dict]) -> float | None:
    """The sampling noise of the mean training reward over ``rows`` (steps): the standard error
    of the mean of their ``rollout/reward_mean`` values, at least the binomial one of all their
    samples, ``sqrt(p (1 - p) / N)`` (rewards in [0, 1]; a window of few steps with equal means
    would otherwise claim none). None without rewards."""
    pairs = [
        (r["rollout/reward_mean"], r.get("rollout/samples", 0.0))
        for r in rows
        if r.get("rollout/reward_mean") is not None and math.isfinite(r["rollout/reward_mean"])
    ]
    if not pairs:
        return None
    values = np.array([v for v, _ in pairs])
    p, samples = float(values.mean()), sum(n for _, n in pairs)
    binomial = math.sqrt(max(p * (1 - p), 0.0) / samples) if samples else 0.0
    steps = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return max(steps, binomial)


def summarize_metrics(path: str | Path, window: int = 20) -> dict:
    """The summary of the metrics lines at ``path``: the number of steps, the mean rewards of the
    first and last ``window`` steps (the last with its :func:`reward_se`), the run's mean
    staleness, estimator diagnostics and step time, and its skipped updates."""
    rows = read_jsonl(path)
    if not rows:
        return {"steps": 0}

    def mean(key, part):
        vals = [r[key] for r in part if key in r and r[key] is not None and math.isfinite(r[key])]
        return sum(vals) / len(vals) if vals else None

    head, tail = rows[:window], rows[-window:]
    out: dict = {"steps": len(rows)}
    for key in ("rollout/reward_mean", "train/reward_mean"):
        out[f"{key}_first{window}"] = mean(key, head)
        out[f"{key}_last{window}"] = mean(key, tail)
    out[f"rollout/reward_mean_last{window}_se"] = reward_se(tail)
    for key in ("async/staleness_mean", *diagnostic_names(), "time/step_seconds"):
        out[key] = mean(key, rows)
    out["train/skipped_steps"] = rows[-1].get("train/skipped_steps", 0.0)
    return {k: v for k, v in out.items() if v is not None}


def count_groups(path: str | Path) -> dict:
    """The groups a run's ``groups.jsonl`` at ``path`` records: how many it trained
    (``async/groups``) and how many of them an earlier update had trained already
    (``async/groups_reused``; none when every batch is trained once)."""
    rows = read_jsonl(path) if Path(path).exists() else []
    return {"async/groups": len(rows), "async/groups_reused": sum(1 for r in rows if r.get("reused"))}
