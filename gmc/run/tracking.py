"""MLflow as a view of the run directories (files stay the source of truth).

Where runs go: the tracking URI given explicitly (``gmc mlflow-sync --tracking-uri``, the
``tracking_uri`` key of a train config, the workflow's ``tracking_uri``), else
``MLFLOW_TRACKING_URI``, else (imports only) ``sqlite:///results/mlflow.db``; the experiment
likewise (``--experiment`` / ``experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else ``gmc``). An
experiment that gmc creates in a local store keeps its artifacts beside the database
(``results/mlartifacts``), not in ``./mlruns``.

One run directory is one MLflow run, found again by its ``gmc.run_id`` tag: live logging while
training and any number of later imports append to that run the steps it does not have yet
(tag ``gmc.synced_steps``); nothing is deleted. A metric's timestamp is the wall-clock ``time``
of its metrics line, and an imported run starts when its first step started and ends with its
last step, so its duration is the training's. Evaluation scores
(``<results>/eval/<point>/<benchmark>.json``) are logged to the run they evaluate, at its last
step. The runs of a sweep (run directories under ``<results>/train/``) are nested under one
parent run per results folder (tag ``gmc.sweep.points``); a point whose run is another point's
(``shared.json``) is a run of its own there, with its own config's parameters and the shared
run's metrics and scores, tagged ``gmc.shared_with`` (the point that trained it). Parameters
are the flattened resolved config; metric names are the namespaced names of ``metrics.jsonl``
(valid MLflow names: letters, digits, ``_ - . / space``).

The store holds absolute paths (the artifacts' location, the tags ``gmc.run_dir`` and
``gmc.sweep.points``); for a results folder that has moved, import it again into a new store
(the files are the record).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from gmc.io import flatten, read_jsonl
from gmc.run.provenance import PROVENANCE
from gmc.run.rundir import CONFIG, INFO, METRICS, SHARED, SUMMARY

log = logging.getLogger(__name__)

RUN_TAG = "gmc.run_id"
SWEEP_TAG = "gmc.sweep.points"
STEPS_TAG = "gmc.synced_steps"
SHARED_TAG = "gmc.shared_with"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag for nested runs
DEFAULT_URI = "sqlite:///results/mlflow.db"
DEFAULT_EXPERIMENT = "gmc"
_VALID = re.compile(r"^[\w\-./ ]+$")
_NOT_METRICS = {"step", "time"}
_BATCH = 999  # a request holds at most 1000 metrics, params and tags together


def resolve_uri(explicit: str | None, default: str | None = DEFAULT_URI) -> str | None:
    """The tracking URI: ``explicit``, else ``$MLFLOW_TRACKING_URI``, else ``default``."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or default


def resolve_experiment(explicit: str | None) -> str:
    """The experiment name: ``explicit``, else ``$MLFLOW_EXPERIMENT_NAME``, else ``gmc``."""
    return explicit or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT


def metric_items(record: dict[str, Any]):
    """``(name, value)`` pairs of a metrics line that MLflow can store (finite numbers)."""
    for k, v in record.items():
        if k in _NOT_METRICS or not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            continue
        if not _VALID.match(k):
            raise ValueError(f"metric name {k!r} is not a valid MLflow name")
        yield k, float(v)


def sweep_root(run_dir: str | Path) -> Path | None:
    """The results folder of a run directory ``<results>/train/<point>``; None outside a sweep."""
    run_dir = Path(run_dir).resolve()
    return next((p.parent for p in run_dir.parents if p.name == "train"), None)


def run_dir_name(run_dir: Path) -> str:
    """A readable name from the self-describing path (``algo~gmc/delay~32/...`` -> ``algo~gmc,delay~32,...``)."""
    parts = [p for p in Path(run_dir).parts if "~" in p]
    return ",".join(parts) if parts else Path(run_dir).name


# ---------------------------------------------------------------------------------------------
# the store


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _artifact_location(uri: str) -> str | None:
    """``<folder of the database>/mlartifacts`` for a local sqlite store; the server decides otherwise."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return None


KIND_TAG = "mlflow.experimentKind"
"""MLflow 3's tag of an experiment's type: its UI opens an experiment without one in the GenAI
view (traces; "No data" for training runs)."""
KIND = "custom_model_development"
"""The type of gmc's experiments, shown as model training: the runs' table, metrics and charts."""


def _experiment_id(client, uri: str, name: str) -> str:
    """The experiment ``name`` (created with its artifacts beside a local store), typed
    :data:`KIND` unless it already has a type."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(name, artifact_location=_artifact_location(uri), tags={KIND_TAG: KIND})
    if KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, KIND_TAG, KIND)
    return exp.experiment_id


def _find_run(client, experiment_id: str, tag: str, value: str):
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{tag}` = '{value}'")
    return runs[0] if runs else None


def _sweep_parent(client, experiment_id: str, root: Path, create: bool) -> str | None:
    """The parent run of the sweep in ``root`` (created when ``create``)."""
    found = _find_run(client, experiment_id, SWEEP_TAG, str(root))
    if found is not None:
        return found.info.run_id
    if not create:
        return None
    start, _ = sweep_span_ms(root)  # the first run's start where runs exist (an import), else now
    return client.create_run(
        experiment_id, start_time=start, run_name=f"sweep {root.name}", tags={SWEEP_TAG: str(root)}
    ).info.run_id


def _run_for(
    client,
    experiment_id: str,
    run_dir: Path,
    run_id: str,
    config: dict[str, Any],
    create_parent: bool,
    start_ms: int | None = None,
    tags: dict[str, str] | None = None,
):
    """The MLflow run of a run directory (created with its parameters and ``tags``, started at
    ``start_ms`` (else now), on first use), nested under its sweep's parent run when there is one."""
    run = _find_run(client, experiment_id, RUN_TAG, run_id)
    root = sweep_root(run_dir)
    parent = _sweep_parent(client, experiment_id, root, create_parent) if root else None
    if run is None:
        from mlflow.entities import Param

        tags = {**(tags or {}), RUN_TAG: run_id, "gmc.run_dir": str(run_dir.resolve()), STEPS_TAG: "0"}
        run = client.create_run(experiment_id, start_time=start_ms, run_name=run_dir_name(run_dir), tags=tags)
        params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):
            client.log_batch(run.info.run_id, params=params[i : i + 100])
    if parent and run.data.tags.get(PARENT_TAG) != parent:
        client.set_tag(run.info.run_id, PARENT_TAG, parent)
    return run


def _append(client, mlflow_run_id: str, records: list[dict[str, Any]], synced: int, default_ms: int = 0) -> int:
    """Log the metrics lines with ``step >= synced`` and record how far the run now goes (in the
    same request as the last metrics); returns that count of steps. Lines without a wall-clock
    ``time`` (older files) are stamped ``default_ms``."""
    from mlflow.entities import Metric, RunTag

    new = [r for r in records if int(r["step"]) >= synced]
    if not new:
        return synced
    metrics = [
        Metric(k, v, int(r["time"] * 1000) if "time" in r else default_ms, int(r["step"]))
        for r in new
        for k, v in metric_items(r)
    ]
    synced = int(new[-1]["step"]) + 1
    batches = [metrics[i : i + _BATCH] for i in range(0, len(metrics), _BATCH)] or [[]]
    for i, batch in enumerate(batches):
        tags = [RunTag(STEPS_TAG, str(synced))] if i == len(batches) - 1 else []
        client.log_batch(mlflow_run_id, metrics=batch, tags=tags)
    return synced


class LiveTracker:
    """Logs a run to MLflow while it trains. A failed write (a busy store, a network hiccup)
    is logged as a warning and retried with the next step, and a failure to finish is a
    warning too: once started, training never stops for MLflow."""

    def __init__(self, uri: str, experiment: str, run_dir: Path, run_id: str, config: dict[str, Any]):
        self.client = _client(uri)
        exp_id = _experiment_id(self.client, uri, experiment)
        run = _run_for(self.client, exp_id, Path(run_dir), run_id, config, create_parent=False)
        self.mlflow_run_id = run.info.run_id
        self.synced = int(run.data.tags.get(STEPS_TAG, 0))
        self.pending: list[dict[str, Any]] = []

    def log(self, record: dict[str, Any]) -> None:
        self.pending.append(record)
        try:
            self.synced = _append(self.client, self.mlflow_run_id, self.pending, self.synced)
            self.pending = []
        except Exception as e:  # noqa: BLE001  (the files are the record; MLflow catches up later)
            log.warning("MLflow logging failed at step %s (retried next step): %s", record["step"], e)

    def finish(self, summary: dict[str, Any]) -> None:
        try:
            self.synced = _append(self.client, self.mlflow_run_id, self.pending, self.synced)
            self.pending = []
            self.client.set_terminated(self.mlflow_run_id, "FINISHED")
        except Exception as e:  # noqa: BLE001
            log.warning("MLflow: could not finish the run (gmc mlflow-sync brings it up to date): %s", e)


def live_tracker(
    uri: str | None, experiment: str | None, run_dir: Path, run_id: str, config: dict[str, Any]
) -> LiveTracker | None:
    """A ``LiveTracker`` when a tracking URI is configured (explicitly or by
    ``MLFLOW_TRACKING_URI``); None otherwise."""
    uri = resolve_uri(uri, default=None)
    return LiveTracker(uri, resolve_experiment(experiment), run_dir, run_id, config) if uri else None


# ---------------------------------------------------------------------------------------------
# imports of run directories


def _eval_metrics(eval_dir: Path, step: int, prefix: str = "") -> list:
    """The scores in an evaluation folder (:func:`gmc.run.evaluate.eval_scores`, standard errors
    left out) as MLflow metrics at ``step``, keys after ``prefix``, timestamped by their files."""
    from mlflow.entities import Metric

    from gmc.run.evaluate import SE, eval_scores

    out = []
    for key, value in eval_scores(eval_dir).items():
        if not key.endswith(SE):
            stamp = (Path(eval_dir) / f"{key.split('/')[1]}.json").stat().st_mtime
            out.append(Metric(prefix + key, float(value), int(stamp * 1000), step))
    return out


def _log_new_scores(client, run, eval_dir: Path, step: int, prefix: str = "") -> None:
    """Log the scores of ``eval_dir`` the run does not hold yet (with the same value)."""
    scores = [m for m in _eval_metrics(eval_dir, step, prefix) if run.data.metrics.get(m.key) != m.value]
    if scores:
        client.log_batch(run.info.run_id, metrics=scores)


def training_span_ms(records: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """When a run's training started and ended (milliseconds since the epoch), from its metrics
    lines: the first step's start (its ``time`` less its ``time/step_seconds``) and the last
    step's ``time``; ``(None, None)`` without timed lines."""
    timed = [r for r in records if "time" in r]
    if not timed:
        return None, None
    first = timed[0]
    return int((first["time"] - float(first.get("time/step_seconds", 0.0))) * 1000), int(timed[-1]["time"] * 1000)


def sweep_span_ms(results: str | Path) -> tuple[int | None, int | None]:
    """When the sweep in ``results`` trained: the earliest start and the latest end of its runs
    (:func:`training_span_ms` of every ``train/**/metrics.jsonl``); ``(None, None)`` without
    timed lines."""
    spans = [training_span_ms(read_jsonl(path)) for path in sorted(Path(results).glob(f"train/**/{METRICS}"))]
    starts, ends = [a for a, _ in spans if a is not None], [b for _, b in spans if b is not None]
    return (min(starts) if starts else None), (max(ends) if ends else None)


def _shared_source(run_dir: Path) -> tuple[Path, Path, str]:
    """For a sweep's point that shares another point's run: the run directory that trained it,
    the point's own resolved config (``<results>/configs/train/<point>.yaml``) and the trained
    point's name."""
    root = sweep_root(run_dir)
    if root is None:
        raise ValueError(
            f"{run_dir / SHARED}: a shared point outside a sweep's results folder (<results>/train/<point>)"
        )
    trained = json.loads((run_dir / SHARED).read_text())["run"]
    point = run_dir.resolve().relative_to(root / "train")
    return root / "train" / trained, root / "configs" / "train" / f"{point}.yaml", trained


def _refuse_bundle(results: Path | None) -> None:
    """A published bundle, or a results folder unpacked from one (``gmc import-results``), keeps of
    each run its reward curve without timestamps, its config and its scores: in MLflow its runs
    would be a curve and two scores each, a few milliseconds long. It is refused, naming what to
    read instead."""
    if results is not None and (results / PROVENANCE).exists():
        raise ValueError(
            f"{results}: a published bundle ({PROVENANCE}), which keeps of each run only its reward curve, "
            "without timestamps, and its scores: not an MLflow record; read its tables and figures "
            f"(gmc report --results {results}), or import the sweep's own results folder"
        )


def sync_run(run_dir: str | Path, uri: str | None = None, experiment: str | None = None) -> str:
    """Import a run directory into MLflow, or bring its earlier import up to date (new steps,
    evaluation scores, files, status); a sweep's point that shares another's run
    (``shared.json``) is imported as a run of its own (its config, the shared run's metrics and
    scores, tag ``gmc.shared_with``). Returns the MLflow run id."""
    run_dir = Path(run_dir)
    _refuse_bundle(sweep_root(run_dir))
    source, cfg_path, tags = run_dir, run_dir / CONFIG, {}
    if (run_dir / SHARED).exists():
        source, cfg_path, trained = _shared_source(run_dir)
        tags = {SHARED_TAG: trained}
    info_path = source / INFO
    for path in (info_path, cfg_path):
        if not path.exists():
            raise FileNotFoundError(f"{path}: missing; {run_dir} is not a gmc run directory")
    info = json.loads(info_path.read_text())
    config = yaml.safe_load(cfg_path.read_text())
    run_id = f"{info['run_id']}/{config['algorithm']}" if tags else info["run_id"]
    metrics_path = source / METRICS
    records = read_jsonl(metrics_path)
    start_ms, end_ms = training_span_ms(records)
    uri = resolve_uri(uri)
    client = _client(uri)
    exp_id = _experiment_id(client, uri, resolve_experiment(experiment))
    run = _run_for(client, exp_id, run_dir, run_id, config, create_parent=True, start_ms=start_ms, tags=tags)
    mlflow_run_id = run.info.run_id
    if info.get("git_revision"):
        client.set_tag(mlflow_run_id, "gmc.git_revision", info["git_revision"])
    before = int(run.data.tags.get(STEPS_TAG, 0))
    default_ms = int(metrics_path.stat().st_mtime * 1000) if metrics_path.exists() else 0
    synced = _append(client, mlflow_run_id, records, before, default_ms)
    finished = (source / SUMMARY).exists()
    root = sweep_root(source)
    if finished and root is not None:
        _log_new_scores(client, run, root / "eval" / source.resolve().relative_to(root / "train"), max(synced - 1, 0))
    for path in (source / SUMMARY, source / INFO, run_dir / SHARED):
        if path.exists():
            client.log_artifact(mlflow_run_id, str(path))
    client.log_text(mlflow_run_id, cfg_path.read_text(), CONFIG)  # a shared point's own, under the usual name
    client.set_terminated(mlflow_run_id, "FINISHED" if finished else "KILLED", end_time=end_ms)
    log.info("%s -> MLflow run %s (%d new steps)", run_dir, mlflow_run_id, synced - before)
    return mlflow_run_id


def sync_sweep(results: str | Path, uri: str | None = None, experiment: str | None = None, finish: bool = False) -> str:
    """The parent run of the sweep in ``results`` (created if absent); returns its id. With
    ``finish``: the base model's scores are logged to it (``<results>/eval/base``; where each
    seed has its own base model, ``eval/base/seed~<s>`` as ``seed-<s>/eval/...``, since MLflow
    refuses ``~``) and it is marked finished."""
    results = Path(results).resolve()
    _refuse_bundle(results)
    uri = resolve_uri(uri)
    client = _client(uri)
    exp_id = _experiment_id(client, uri, resolve_experiment(experiment))
    parent = _sweep_parent(client, exp_id, results, create=True)
    if finish:
        base = results / "eval" / "base"
        _log_new_scores(client, client.get_run(parent), base, 0)
        for seed_dir in sorted(base.glob("seed~*")):
            _log_new_scores(client, client.get_run(parent), seed_dir, 0, prefix=seed_dir.name.replace("~", "-") + "/")
        client.set_terminated(parent, "FINISHED", end_time=sweep_span_ms(results)[1])
    return parent
