"""MLflow as a view of the run directories (files stay the source of truth).

Each run carries a ``run_id`` in ``run.json``; MLflow runs are tagged ``gmc.run_id`` with it, so
importing the same run twice finds and replaces the earlier import instead of adding a run.
Parameters are the flattened resolved config (``estimator.eps`` ...); metrics are the
namespaced names of ``metrics.jsonl`` (valid MLflow names: letters, digits, ``_ - . / space``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from gmc.io import flatten, read_jsonl

RUN_TAG = "gmc.run_id"
_VALID = re.compile(r"^[\w\-./ ]+$")


def metric_items(record: dict[str, Any]):
    """``(name, value)`` pairs of a metrics line that MLflow can store (finite numbers)."""
    for k, v in record.items():
        if k == "step" or not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            continue
        if not _VALID.match(k):
            raise ValueError(f"metric name {k!r} is not a valid MLflow name")
        yield k, float(v)


def _client(uri: str):
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def _experiment_id(client, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else client.create_experiment(name)


def _find_run(client, experiment_id: str, run_id: str):
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'")
    return runs[0] if runs else None


def _log_params(client, mlflow_run_id: str, config: dict[str, Any]) -> None:
    from mlflow.entities import Param

    params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items()]
    for i in range(0, len(params), 100):
        client.log_batch(mlflow_run_id, params=params[i : i + 100])


def _log_metrics(client, mlflow_run_id: str, records: list[dict[str, Any]]) -> None:
    from mlflow.entities import Metric

    metrics = [Metric(k, v, 0, int(r["step"])) for r in records for k, v in metric_items(r)]
    for i in range(0, len(metrics), 1000):
        client.log_batch(mlflow_run_id, metrics=metrics[i : i + 1000])


class LiveTracker:
    """Logs a run to MLflow while it trains (optional; ``tracking_uri`` in the config)."""

    def __init__(self, uri: str, experiment: str, run_dir: Path, run_id: str, config: dict[str, Any]):
        self.client = _client(uri)
        exp_id = _experiment_id(self.client, experiment)
        existing = _find_run(self.client, exp_id, run_id)
        if existing is not None:  # a resumed run continues its MLflow run
            self.mlflow_run_id = existing.info.run_id
        else:
            run = self.client.create_run(exp_id, run_name=run_dir_name(run_dir), tags={RUN_TAG: run_id})
            self.mlflow_run_id = run.info.run_id
            _log_params(self.client, self.mlflow_run_id, config)

    def log(self, record: dict[str, Any]) -> None:
        _log_metrics(self.client, self.mlflow_run_id, [record])

    def finish(self, summary: dict[str, Any]) -> None:
        self.client.set_tag(self.mlflow_run_id, "gmc.synced_steps", str(summary.get("steps", 0)))
        self.client.set_terminated(self.mlflow_run_id, "FINISHED")


def run_dir_name(run_dir: Path) -> str:
    """A readable name from the self-describing path (``algo~gmc/delay~32/...`` -> ``algo~gmc,delay~32,...``)."""
    parts = [p for p in Path(run_dir).parts if "~" in p]
    return ",".join(parts) if parts else Path(run_dir).name


def sync_run(run_dir: str | Path, uri: str, experiment: str = "gmc") -> str:
    """Import one finished run directory into MLflow; idempotent. Returns the MLflow run id."""
    run_dir = Path(run_dir)
    info_path, cfg_path = run_dir / "run.json", run_dir / "config.yaml"
    if not info_path.exists() or not cfg_path.exists():
        raise FileNotFoundError(f"{run_dir}: not a gmc run directory (run.json and config.yaml missing)")
    info = json.loads(info_path.read_text())
    config = yaml.safe_load(cfg_path.read_text())
    records = read_jsonl(run_dir / "metrics.jsonl")
    client = _client(uri)
    exp_id = _experiment_id(client, experiment)
    existing = _find_run(client, exp_id, info["run_id"])
    if existing is not None:
        if existing.data.tags.get("gmc.synced_steps") == str(len(records)) and existing.info.status == "FINISHED":
            return existing.info.run_id
        client.delete_run(existing.info.run_id)
    run = client.create_run(exp_id, run_name=run_dir_name(run_dir),
                            tags={RUN_TAG: info["run_id"], "gmc.run_dir": str(run_dir.resolve()),
                                  "gmc.git_revision": info.get("git_revision", "unknown")})
    _log_params(client, run.info.run_id, config)
    _log_metrics(client, run.info.run_id, records)
    for name in ("summary.json", "config.yaml", "run.json"):
        if (run_dir / name).exists():
            client.log_artifact(run.info.run_id, str(run_dir / name))
    client.set_tag(run.info.run_id, "gmc.synced_steps", str(len(records)))
    status = "FINISHED" if (run_dir / "summary.json").exists() else "KILLED"
    client.set_terminated(run.info.run_id, status)
    return run.info.run_id
