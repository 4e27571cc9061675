"""MLflow as a view of the run directories: a real sqlite store, live logging and idempotent
imports, the environment's settings, a real tracking server and the workflow's use of it."""

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import REPO, train
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from gmc.cli import main
from gmc.io import read_jsonl
from gmc.run.tracking import (
    PARENT_TAG,
    SWEEP_TAG,
    LiveTracker,
    resolve_experiment,
    resolve_uri,
    sync_run,
    sync_sweep,
)


def test_mlflow_sync_is_idempotent(tmp_path, train_small):
    from mlflow.tracking import MlflowClient

    from gmc.run.tracking import sync_run

    out = train(tmp_path, "algo~gmc/delay~0", train_small, steps=2)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = sync_run(out, uri)
    second = sync_run(out, uri)
    assert first == second
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("gmc")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "algo~gmc,delay~0"
    assert run.data.params["estimator.eps"] == "0.2"
    history = client.get_metric_history(run.info.run_id, "rollout/reward_mean")
    assert [m.step for m in history] == [0, 1]
    assert all("@" not in k for k in run.data.metrics)


def test_live_tracking_writes_the_same_run(tmp_path, train_small):
    from mlflow.tracking import MlflowClient

    from gmc.run.tracking import sync_run

    uri = f"sqlite:///{tmp_path / 'live.db'}"
    out = train(tmp_path, "live", train_small, steps=2, tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("gmc")
    (run,) = client.search_runs([exp.experiment_id])
    lines = read_jsonl(out / "metrics.jsonl")
    history = client.get_metric_history(run.info.run_id, "rollout/reward_mean")
    assert [(m.step, m.timestamp) for m in history] == [(r["step"], int(r["time"] * 1000)) for r in lines]
    assert sync_run(out, uri) == run.info.run_id
    assert len(client.search_runs([exp.experiment_id])) == 1
    assert len(client.get_metric_history(run.info.run_id, "rollout/reward_mean")) == 2


@pytest.fixture(autouse=True)
def no_mlflow_env(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)


def all_runs(client, experiment="gmc"):
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL)


def append_lines(run_dir: Path, steps: range, start: float = 1.7e9) -> None:
    with (run_dir / "metrics.jsonl").open("a") as fh:
        for s in steps:
            fh.write(json.dumps({"step": s, "time": start + s, "rollout/reward_mean": 0.1 * s}) + "\n")


def check_store(uri: str, results: Path, make_run_dir) -> None:
    """The behaviour every store must show (shared by the sqlite and the server tests)."""
    run_dir = make_run_dir(results, steps=3, finished=False)
    first = sync_run(run_dir, uri)
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(first, "rollout/reward_mean")
    assert [(m.step, m.timestamp) for m in history] == [(s, int((1.7e9 + s) * 1000)) for s in range(3)]
    assert "time" not in client.get_run(first).data.metrics
    assert client.get_run(first).info.status == "KILLED"  # not finished yet

    # more steps, a finished run and its evaluation: the same run, appended, nothing deleted
    append_lines(run_dir, range(3, 5))
    (run_dir / "summary.json").write_text(json.dumps({"steps": 5}))
    eval_dir = results / "eval" / run_dir.relative_to(results / "train")
    eval_dir.mkdir(parents=True)
    (eval_dir / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": 0.25, "pass_at_1": 0.5}))
    assert sync_run(run_dir, uri) == first
    assert sync_run(run_dir, uri) == first  # idempotent: no duplicate points
    history = client.get_metric_history(first, "rollout/reward_mean")
    assert [m.step for m in history] == [0, 1, 2, 3, 4]
    run = client.get_run(first)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["eval/synthetic/greedy"] == 0.25 and run.data.metrics["eval/synthetic/pass_at_1"] == 0.5
    assert [m.step for m in client.get_metric_history(first, "eval/synthetic/greedy")] == [4]
    assert len(all_runs(client)) == 2  # the run and its sweep's parent

    # nested under one parent per results folder
    other = sync_run(make_run_dir(results, algo="grpo"), uri)
    parents = [r for r in all_runs(client) if SWEEP_TAG in r.data.tags]
    assert len(parents) == 1 and parents[0].data.tags[SWEEP_TAG] == str(results.resolve())
    for child in (first, other):
        assert client.get_run(child).data.tags[PARENT_TAG] == parents[0].info.run_id
    for seed, greedy in ((0, 0.25), (1, 0.5)):  # a base model per seed, logged under its seed
        base = results / "eval" / "base" / f"seed~{seed}"
        base.mkdir(parents=True)
        (base / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": greedy, "problems": 8}))
    assert sync_sweep(results, uri, finish=True) == parents[0].info.run_id
    sweep = client.get_run(parents[0].info.run_id)
    assert sweep.info.status == "FINISHED"
    assert {k: v for k, v in sweep.data.metrics.items() if "greedy" in k} == {
        "seed-0/eval/synthetic/greedy": 0.25,
        "seed-1/eval/synthetic/greedy": 0.5,
    }
    assert sorted(a.path for a in client.list_artifacts(first)) == ["config.yaml", "run.json", "summary.json"]


def test_sqlite_store(tmp_path, make_run_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    uri = f"sqlite:///{results / 'mlflow.db'}"
    results.mkdir()
    check_store(uri, results, make_run_dir)
    # artifacts beside the database, not in ./mlruns
    assert (results / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()
    assert list((results / "mlartifacts").glob("*/artifacts/summary.json"))


def test_an_imported_run_lasts_as_long_as_its_training(tmp_path, make_run_dir):
    """Start: the first step's start (its time less its step_seconds); end: the last step's time."""
    run_dir = make_run_dir(tmp_path / "results", steps=4)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lines[0]["time/step_seconds"] = 0.25
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    info = MlflowClient(tracking_uri=uri).get_run(sync_run(run_dir, uri)).info
    assert (info.start_time, info.end_time) == (int((1.7e9 - 0.25) * 1000), int((1.7e9 + 3) * 1000))


def test_a_shared_point_is_a_run_of_its_own_with_the_trained_runs_data(tmp_path, make_run_dir):
    """A point whose run is another's (shared.json): its own config's parameters, the trained
    run's metrics and evaluation scores, tagged with the point that trained it; found again by
    a second import."""
    results = tmp_path / "results"
    trained = make_run_dir(results, algo="tic")
    eval_dir = results / "eval" / trained.relative_to(results / "train")
    eval_dir.mkdir(parents=True)
    (eval_dir / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": 0.25}))
    member = results / "train/algo~gmc/delay~0/group~4/seed~0"
    member.mkdir(parents=True)
    (member / "shared.json").write_text(json.dumps({"run": "algo~tic/delay~0/group~4/seed~0"}))
    own = results / "configs/train/algo~gmc/delay~0/group~4/seed~0.yaml"
    own.parent.mkdir(parents=True)
    own.write_text("algorithm: gmc\nestimator:\n  eps: 0.2\n")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(tracking_uri=uri)
    runs = {name: sync_run(d, uri) for name, d in (("tic", trained), ("gmc", member))}
    assert sync_run(member, uri) == runs["gmc"] != runs["tic"]
    tic, gmc = (client.get_run(runs[a]) for a in ("tic", "gmc"))
    assert (gmc.data.params["algorithm"], tic.data.params["algorithm"]) == ("gmc", "tic")
    assert (
        gmc.data.tags["gmc.shared_with"] == "algo~tic/delay~0/group~4/seed~0" and "gmc.shared_with" not in tic.data.tags
    )
    assert gmc.info.run_name == "algo~gmc,delay~0,group~4,seed~0" and gmc.info.status == "FINISHED"
    assert gmc.data.metrics == tic.data.metrics and gmc.data.metrics["eval/synthetic/greedy"] == 0.25
    assert (gmc.info.start_time, gmc.info.end_time) == (tic.info.start_time, tic.info.end_time)
    assert gmc.data.tags[PARENT_TAG] == tic.data.tags[PARENT_TAG]
    assert sorted(a.path for a in client.list_artifacts(runs["gmc"])) == [
        "config.yaml",
        "run.json",
        "shared.json",
        "summary.json",
    ]
    own.unlink()  # the point's own config is what its parameters come from: without it, say so
    with pytest.raises(FileNotFoundError, match="seed~0.yaml: missing"):
        sync_run(member, uri)


def test_lines_without_wall_clock_time_take_the_file_time(tmp_path, make_run_dir):
    run_dir = make_run_dir(tmp_path / "results")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "time"}) + "\n" for r in lines)
    )
    os.utime(run_dir / "metrics.jsonl", (1.75e9, 1.75e9))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    history = MlflowClient(tracking_uri=uri).get_metric_history(sync_run(run_dir, uri), "rollout/reward_mean")
    assert {m.timestamp for m in history} == {1_750_000_000_000}


def test_environment_variables_and_their_precedence(tmp_path, make_run_dir, monkeypatch):
    env_uri, flag_uri = f"sqlite:///{tmp_path / 'env.db'}", f"sqlite:///{tmp_path / 'flag.db'}"
    assert resolve_uri(None) == "sqlite:///results/mlflow.db" and resolve_uri(None, default=None) is None
    assert resolve_experiment(None) == "gmc"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env_uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    assert resolve_uri(None) == env_uri and resolve_uri(flag_uri) == flag_uri
    assert resolve_experiment(None) == "from-env" and resolve_experiment("flag") == "flag"
    run_dir = make_run_dir(tmp_path / "results")
    assert main(["mlflow-sync", str(run_dir)]) == 0
    assert len(all_runs(MlflowClient(tracking_uri=env_uri), "from-env")) == 2
    assert main(["mlflow-sync", str(run_dir), "--tracking-uri", flag_uri, "--experiment", "flag"]) == 0
    assert len(all_runs(MlflowClient(tracking_uri=flag_uri), "flag")) == 2


def test_live_logging_then_sync_is_one_run_and_survives_a_busy_store(tmp_path, make_run_dir, caplog):
    results = tmp_path / "results"
    db = tmp_path / "live.db"
    uri = f"sqlite:///{db}"
    parent = sync_sweep(results, uri)  # the workflow creates the parent before training starts
    run_dir = make_run_dir(results, steps=0, finished=False)
    tracker = LiveTracker(
        uri, "gmc", run_dir, json.loads((run_dir / "run.json").read_text())["run_id"], {"algorithm": "gmc"}
    )
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(tracker.mlflow_run_id).data.tags[PARENT_TAG] == parent
    tracker.log({"step": 0, "time": 1.7e9, "rollout/reward_mean": 0.0})
    lock = sqlite3.connect(db, timeout=0)
    lock.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    try:
        tracker.log({"step": 1, "time": 1.7e9 + 1, "rollout/reward_mean": 0.1})
    finally:
        lock.rollback()
        lock.close()
    assert "retried next step" in caplog.text and len(tracker.pending) == 1
    tracker.log({"step": 2, "time": 1.7e9 + 2, "rollout/reward_mean": 0.2})
    assert tracker.pending == []
    tracker.finish({})
    append_lines(run_dir, range(3))
    (run_dir / "summary.json").write_text("{}")
    assert sync_run(run_dir, uri) == tracker.mlflow_run_id
    assert [m.step for m in client.get_metric_history(tracker.mlflow_run_id, "rollout/reward_mean")] == [0, 1, 2]
    assert len(all_runs(client)) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on localhost (sqlite backend, proxied artifacts); stopped at the end."""
    port = _free_port()
    cmd = [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'server.db'}",
        "--artifacts-destination",
        str(tmp_path / "server-artifacts"),
    ]
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_real_mlflow_server(tmp_path, make_run_dir, mlflow_server, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    check_store(mlflow_server, results, make_run_dir)
    assert list((tmp_path / "server-artifacts").glob("**/summary.json"))  # the server stored them
    assert not (tmp_path / "mlruns").exists() and not (results / "mlartifacts").exists()


def _dry_run_commands(tmp_path, *config: str, env: dict | None = None) -> list[str]:
    repo = REPO
    (tmp_path / "config.yaml").write_text((repo / "config.yaml").read_text())
    args = [sys.executable, "-m", "snakemake", "--snakefile", str(repo / "Snakefile"), "-n", "-p", "--cores", "1"]
    if config:
        args += ["--config", *config]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    out = subprocess.run(
        args, cwd=tmp_path, env={**environ, **(env or {})}, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in (out.stdout + out.stderr).splitlines() if "python -m gmc" in line]


def _run_tracking(tmp_path, *config: str, env: dict | None = None) -> tuple[str | None, str]:
    """The tracking URI and experiment the runs of the workflow get: the train config files their
    jobs read, written by the workflow itself, for a one-point sweep and its references."""
    repo = REPO
    (tmp_path / "config.yaml").write_text((repo / "config.yaml").read_text())
    one = "sweep={algorithm: [gmc], delay: [0], group_size: [8], seed: [0]}"
    args = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(repo / "Snakefile"),
        "--cores",
        "1",
        "--until",
        "train_config",
        "--config",
        one,
        *config,
    ]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    out = subprocess.run(
        args, cwd=tmp_path, env={**environ, **(env or {})}, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    written = [yaml.safe_load(f.read_text()) for f in (tmp_path / "results" / "configs" / "train").glob("**/*.yaml")]
    shutil.rmtree(tmp_path / "results")
    (tracking,) = {(cfg["tracking_uri"], cfg["experiment"]) for cfg in written}  # the same for every run
    return tracking


def test_workflow_logs_live_only_when_a_tracking_uri_is_set(tmp_path):
    sync = [c for c in _dry_run_commands(tmp_path) if "gmc mlflow-sync" in c]
    assert len(sync) == 1 and "--tracking-uri sqlite:///results/mlflow.db --experiment gmc" in sync[0]
    assert _run_tracking(tmp_path)[0] is None  # imported at the end, not logged live

    live = "tracking_uri=http://127.0.0.1:5000"
    sync = [c for c in _dry_run_commands(tmp_path, live) if "gmc mlflow-sync" in c]
    assert len(sync) == 2 and any("--sweep results" in c and "results/mlflow/sweep.json" in c for c in sync)
    assert _run_tracking(tmp_path, live) == ("http://127.0.0.1:5000", "gmc")

    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5001", "MLFLOW_EXPERIMENT_NAME": "mine"}
    assert _run_tracking(tmp_path, env=env) == ("http://127.0.0.1:5001", "mine")
    # the config wins over the environment
    assert _run_tracking(tmp_path, "tracking_uri=http://h:1", "experiment=x", env=env) == ("http://h:1", "x")


def test_the_sweep_parent_spans_its_runs_and_the_experiment_is_typed_for_training(tmp_path, make_run_dir):
    """Imported after the sweep, the parent run starts with the first run's first step and ends
    with the last run's last step; the experiment carries MLflow 3's type of model training."""
    from gmc.run.tracking import KIND, KIND_TAG

    results = tmp_path / "results"
    early = make_run_dir(results, algo="tic", steps=3, start=1.7e9)
    late = make_run_dir(results, algo="grpo", steps=5, start=1.7e9 + 600)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    parent = sync_sweep(results, uri)
    for run_dir in (early, late):
        sync_run(run_dir, uri)
    sync_sweep(results, uri, finish=True)
    client = MlflowClient(tracking_uri=uri)
    info = client.get_run(parent).info
    assert (info.start_time, info.end_time) == (int(1.7e9 * 1000), int((1.7e9 + 604) * 1000))
    assert client.get_experiment_by_name("gmc").tags[KIND_TAG] == KIND


def test_a_published_bundle_is_refused_naming_what_to_read(tmp_path, make_run_dir):
    results = tmp_path / "bundle"
    run_dir = make_run_dir(results)
    (results / "provenance.json").write_text("{}")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    for sync in (lambda: sync_run(run_dir, uri), lambda: sync_sweep(results, uri)):
        with pytest.raises(ValueError, match=r"bundle: a published bundle .*\(gmc report --results "):
            sync()
