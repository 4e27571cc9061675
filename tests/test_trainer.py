"""The training loop: sync equivalence, hard-kill resume, non-finite handling, MLflow, config."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gmc import estimators
from gmc.config import ConfigError, TrainConfig, load_train_config
from gmc.io import read_jsonl
from gmc.trainer import TIME_PREFIX, NonFiniteError, Trainer


def small_config(model_dir, **overrides):
    base = dict(model=str(model_dir), device="cpu", steps=3, group_size=4, prompts_per_step=3,
                checkpoint_every=0, seed=0)
    base.update(overrides)
    return [f"{k}={v}" for k, v in base.items()]


def without_time(rows):
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith(TIME_PREFIX)} for r in rows]


def train(tmp_path, name, model_dir, **overrides):
    cfg = load_train_config(None, small_config(model_dir, **overrides))
    out = tmp_path / name
    Trainer(cfg, out, progress=False).run()
    return out


def test_fixed_delay_zero_equals_plain_loop(tmp_path, tiny_model_dir):
    a = train(tmp_path, "sync", tiny_model_dir, **{"delay.mode": "sync"})
    b = train(tmp_path, "fixed0", tiny_model_dir, **{"delay.mode": "fixed", "delay.d": 0})
    ra, rb = read_jsonl(a / "metrics.jsonl"), read_jsonl(b / "metrics.jsonl")
    assert len(ra) == 3 and without_time(ra) == without_time(rb)
    assert all(r["async/staleness_max"] == 0 for r in rb)
    # on-policy: the behaviour log-probs are the trainer's own, so every weight is 1
    assert all(abs(r["ratio/log_ratio_max"]) < 1e-4 for r in rb)
    assert (b / "summary.json").exists() and (b / "model" / "config.json").exists()


def test_prefill_staleness_logged_per_group(tmp_path, tiny_model_dir):
    out = train(tmp_path, "d2", tiny_model_dir, **{"delay.d": 2, "algorithm": "tic"})
    groups = read_jsonl(out / "groups.jsonl")
    assert len(groups) == 3 * 3 and {g["staleness"] for g in groups} == {2}
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[0]["async/queue_groups"] == 2 * 3
    assert "ratio/frac_traj_capped" in metrics[0] and "rollout/reward_mean" in metrics[0]


def test_behaviour_logprobs_from_the_trainer_or_the_sampler(tmp_path, tiny_model_dir):
    """Stale groups carry behaviour log-probs recomputed by the trainer model (a separate pass),
    or, with behaviour_logprobs: sampler, the engine's own; with the HF engine they agree."""
    cfg = load_train_config(None, small_config(tiny_model_dir, **{"delay.d": 2, "steps": 2}))
    trainer = Trainer(cfg, tmp_path / "trainer", progress=False)
    groups = trainer._make_groups(2, version=0)
    metrics = trainer._rollout_metrics()
    trainer.grader.close()
    assert metrics["rollout/logp_mismatch_max"] < 1e-4 and metrics["time/behaviour_seconds"] > 0
    for g in groups:
        assert g.behaviour_logp is not g.sampler_logp
        torch.testing.assert_close(g.behaviour_logp, g.sampler_logp, rtol=0, atol=1e-4)
    out = train(tmp_path, "sampler", tiny_model_dir, **{"delay.d": 2, "behaviour_logprobs": "sampler"})
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all("rollout/logp_mismatch_max" not in r for r in metrics)
    assert {g["staleness"] for g in read_jsonl(out / "groups.jsonl")} == {2}
    sampler = Trainer(load_train_config(None, small_config(tiny_model_dir, **{"delay.d": 2, "behaviour_logprobs": "sampler"})),
                      tmp_path / "sampler_groups", progress=False)
    assert all(g.behaviour_logp is g.sampler_logp for g in sampler._make_groups(2, version=0))
    sampler.grader.close()
    with pytest.raises(ConfigError, match="behaviour_logprobs: 'sampler' needs"):
        load_train_config(None, ["behaviour_logprobs=sampler", "sampling.temperature=0.7"])


def test_latency_mode_runs(tmp_path, tiny_model_dir):
    out = train(tmp_path, "lat", tiny_model_dir, **{"delay.mode": "latency", "delay.slots": 6, "delay.beta": 0.1})
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[-1]["async/clock"] > 0 and metrics[-1]["async/in_flight"] == 6
    groups = read_jsonl(out / "groups.jsonl")
    assert all(g["completed_at"] >= g["submitted_at"] for g in groups)


def test_resume_after_hard_kill_reproduces_the_uninterrupted_run(tmp_path, tiny_model_dir):
    args = small_config(tiny_model_dir, steps=6, checkpoint_every=3, **{"delay.d": 2})
    sets = [x for a in args for x in ("--set", a)]
    cmd = [sys.executable, "-m", "gmc", "train", *sets]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    subprocess.run([*cmd, "--out", str(tmp_path / "straight")], check=True, env=env, capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--out", str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoint.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (killed / "checkpoint.pt").exists() and not (killed / "summary.json").exists()
    subprocess.run([*cmd, "--out", str(killed), "--resume"], check=True, env=env, capture_output=True)

    straight = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    resumed = read_jsonl(killed / "metrics.jsonl")
    assert [r["step"] for r in resumed] == list(range(6))
    assert without_time(resumed) == without_time(straight)
    assert read_jsonl(killed / "groups.jsonl") == read_jsonl(tmp_path / "straight" / "groups.jsonl")


def test_existing_run_needs_resume(tmp_path, tiny_model_dir):
    out = train(tmp_path, "done", tiny_model_dir, steps=1)
    cfg = load_train_config(None, small_config(tiny_model_dir, steps=1))
    with pytest.raises(FileExistsError, match="finished run"):
        Trainer(cfg, out, progress=False)


def test_nonfinite_steps_are_skipped_then_stop(tmp_path, tiny_model_dir, monkeypatch):
    real = estimators.ESTIMATORS["gmc"]
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] > 2 else loss), stats

    monkeypatch.setitem(estimators.ESTIMATORS, "gmc", poisoned)
    cfg = load_train_config(None, small_config(tiny_model_dir, steps=10, checkpoint_every=1, max_nonfinite_steps=3))
    out = tmp_path / "nan"
    trainer = Trainer(cfg, out, progress=False)
    with pytest.raises(NonFiniteError, match="3 consecutive steps"):
        trainer.run()
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["train/skipped_steps"] for r in rows] == [0, 0, 1, 2]
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 4  # the last completed step; the failing step wrote nothing
    for p in ckpt["model"].values():
        assert torch.isfinite(p).all()
    assert not (out / "summary.json").exists()


def test_mlflow_sync_is_idempotent(tmp_path, tiny_model_dir):
    from mlflow.tracking import MlflowClient

    from gmc.tracking import sync_run

    out = train(tmp_path, "algo~gmc/delay~0", tiny_model_dir, steps=2)
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


def test_live_tracking_writes_the_same_run(tmp_path, tiny_model_dir):
    from mlflow.tracking import MlflowClient

    from gmc.tracking import sync_run

    uri = f"sqlite:///{tmp_path / 'live.db'}"
    out = train(tmp_path, "live", tiny_model_dir, steps=2, tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("gmc")
    (run,) = client.search_runs([exp.experiment_id])
    lines = read_jsonl(out / "metrics.jsonl")
    history = client.get_metric_history(run.info.run_id, "rollout/reward_mean")
    assert [(m.step, m.timestamp) for m in history] == [(r["step"], int(r["time"] * 1000)) for r in lines]
    assert sync_run(out, uri) == run.info.run_id
    assert len(client.search_runs([exp.experiment_id])) == 1
    assert len(client.get_metric_history(run.info.run_id, "rollout/reward_mean")) == 2


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="unknown key estimator.epz"):
        load_train_config(None, ["estimator.epz=0.1"])
    with pytest.raises(ConfigError, match="group_size: expected an integer"):
        load_train_config(None, ["group_size=eight"])
    with pytest.raises(ConfigError, match="algorithm: unknown estimator 'ppo'"):
        load_train_config(None, ["algorithm=ppo"])
    with pytest.raises(ConfigError, match="delay"):
        load_train_config(None, ["delay.mode=async"])
    bad = tmp_path / "c.yaml"
    bad.write_text("steps: 10\nlr: [1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: invalid YAML"):
        load_train_config(bad)
    bad.write_text("stepz: 10\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown key stepz"):
        load_train_config(bad)
    cfg = load_train_config(None, ["lr=2e-4", "estimator.eps=0.1", "synthetic.max_operands=3"])
    assert isinstance(cfg, TrainConfig) and cfg.lr == 2e-4 and cfg.estimator.eps == 0.1
    assert json.dumps(cfg.synthetic.max_operands) == "3"


def test_resume_with_a_changed_config_is_refused(tmp_path, tiny_model_dir):
    from gmc.rundir import ConfigMismatch

    out = train(tmp_path, "changed", tiny_model_dir, steps=2, checkpoint_every=1)
    (out / "summary.json").unlink()
    cfg = load_train_config(None, small_config(tiny_model_dir, steps=2, checkpoint_every=1, lr=1e-5))
    with pytest.raises(ConfigMismatch, match="changed: lr"):
        Trainer(cfg, out, resume=True, progress=False)
    assert [r["train/lr"] for r in read_jsonl(out / "metrics.jsonl")] == [2e-4, 2e-4]
