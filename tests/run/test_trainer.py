"""The training loop: fixed delay 0 equals the plain loop, staleness logged per group, behaviour
log-probs from the trainer or the sampler, hard-kill and signal resumes equal the uninterrupted
run, checkpoints by wall clock, non-finite steps, shared prefills, and bad data caught before
the model loads."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml
from helpers import train

from gmc.estimators import losses
from gmc.io import read_jsonl
from gmc.run.config import ConfigError, history_config, load_train_config, to_dict
from gmc.run.rundir import RunDir
from gmc.run.summary import without_time
from gmc.run.trainer import NonFiniteError, Trainer


@pytest.mark.parametrize(
    "line, message",
    [
        (b'{"problem": "1+1", "answer": "2\xff"}', r"train\.jsonl:2: not UTF-8 text \(byte 0xff\)"),
        (b'{"problem": "1+1", "answer": true}', r"train\.jsonl:2: field 'answer' must be text"),
        (b'{"problem": "1+1", "answer": {"a": 1}}', r"train\.jsonl:2: field 'answer' must be text"),
        (b'{"problem": 7, "answer": "2"}', r"train\.jsonl:2: field 'problem' must be text"),
    ],
)
def test_bad_training_data_is_named_before_the_model_loads(tmp_path, small_config, no_model_load, line, message):
    from gmc.tasks.datasets import DataError

    data = tmp_path / "train.jsonl"
    data.write_bytes(b'{"problem": "2+2", "answer": "4"}\n' + line + b"\n")
    with pytest.raises(DataError, match=message):
        Trainer(small_config(train_data=str(data)), tmp_path / "run", progress=False)
    RunDir(tmp_path / "run").acquire()  # the failed start released the lock


def test_fixed_delay_zero_equals_plain_loop(tmp_path, train_small):
    a = train(tmp_path, "sync", train_small, **{"delay.mode": "sync"})
    b = train(tmp_path, "fixed0", train_small, **{"delay.mode": "fixed", "delay.d": 0})
    ra, rb = read_jsonl(a / "metrics.jsonl"), read_jsonl(b / "metrics.jsonl")
    assert len(ra) == 3 and without_time(ra) == without_time(rb)
    assert all(r["async/staleness_max"] == 0 for r in rb)
    # on-policy: the behaviour log-probs are the trainer's own, so every weight is 1
    assert all(abs(r["ratio/log_ratio_max"]) < 1e-4 for r in rb)
    assert (b / "summary.json").exists() and (b / "model" / "config.json").exists()


def test_prefill_staleness_logged_per_group(tmp_path, train_small):
    """A prefill's batches are theta_0's: the one trained at step t < d is t updates stale."""
    out = train(tmp_path, "d2", train_small, **{"delay.d": 2, "algorithm": "tic"})
    groups = read_jsonl(out / "groups.jsonl")
    assert len(groups) == 3 * 3 and [g["staleness"] for g in groups] == [0] * 3 + [1] * 3 + [2] * 3
    assert [g["version"] for g in groups] == [0] * 9 and {g["reused"] for g in groups} == {False}
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[0]["async/queue_groups"] == 2 * 3
    assert "ratio/frac_traj_capped" in metrics[0] and "rollout/reward_mean" in metrics[0]


def test_behaviour_logprobs_from_the_trainer_or_the_sampler(tmp_path, train_small, small_config):
    """Stale groups carry behaviour log-probs recomputed by the trainer model (a separate pass),
    or, with behaviour_logprobs: sampler, the engine's own; with the HF engine they agree."""
    out = train(tmp_path, "trainer", train_small, **{"delay.d": 2})
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(r["rollout/logp_mismatch_max"] < 1e-4 and r["time/behaviour_seconds"] > 0 for r in metrics)
    out = train(tmp_path, "sampler", train_small, **{"delay.d": 2, "behaviour_logprobs": "sampler"})
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all("rollout/logp_mismatch_max" not in r for r in metrics)
    assert [g["staleness"] for g in read_jsonl(out / "groups.jsonl")] == [0] * 3 + [1] * 3 + [2] * 3  # a prefill
    for behaviour, on_policy in (("trainer", False), ("sampler", False), ("trainer", True)):
        trainer = Trainer(
            small_config(**{"delay.d": 0 if on_policy else 2, "behaviour_logprobs": behaviour}),
            tmp_path / f"{behaviour}-{on_policy}",
            progress=False,
        )
        assert trainer.collector.behaviour == ("none" if on_policy else behaviour)
        trainer.close()
    with pytest.raises(ConfigError, match="behaviour_logprobs: 'sampler' needs"):
        load_train_config(None, ["behaviour_logprobs=sampler", "sampling.temperature=0.7"])


def test_latency_mode_runs(tmp_path, train_small):
    out = train(tmp_path, "lat", train_small, **{"delay.mode": "latency", "delay.slots": 6, "delay.beta": 0.1})
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[-1]["async/clock"] > 0 and metrics[-1]["async/in_flight"] == 6
    groups = read_jsonl(out / "groups.jsonl")
    assert all(g["completed_at"] >= g["submitted_at"] for g in groups)
    assert {g["reused"] for g in groups} == {False}


def cli_run_and_uninterrupted_twin(tmp_path, cfg):
    """``gmc train`` on ``cfg`` as a subprocess: its command (without ``--out``) and environment,
    after running it once uninterrupted into ``tmp_path/straight``."""
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(to_dict(cfg)))
    cmd = [sys.executable, "-m", "gmc", "train", "--config", str(config)]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    subprocess.run([*cmd, "--out", str(tmp_path / "straight")], check=True, env=env, capture_output=True)
    return cmd, env


def test_resume_after_hard_kill_reproduces_the_uninterrupted_run(tmp_path, small_config):
    cmd, env = cli_run_and_uninterrupted_twin(tmp_path, small_config(steps=6, checkpoint_every=3, **{"delay.d": 2}))

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


@pytest.mark.parametrize(
    "signum", [signal.SIGUSR1, signal.SIGTERM, signal.SIGINT], ids=["SIGUSR1", "SIGTERM", "SIGINT"]
)
def test_a_stop_signal_checkpoints_at_the_step_boundary_and_the_resume_equals_the_uninterrupted_run(
    tmp_path, small_config, signum
):
    """SLURM's warning before a time limit (SIGUSR1), the limit itself (SIGTERM) or a user's Ctrl-C
    (SIGINT): the run ends at the next step boundary with a checkpoint there and exit status 75,
    and ``gmc train --resume --out DIR`` continues it from the folder alone (no --config)."""
    cmd, env = cli_run_and_uninterrupted_twin(tmp_path, small_config(steps=8, checkpoint_every=0, **{"delay.d": 1}))
    stopped = tmp_path / "stopped"
    proc = subprocess.Popen(
        [*cmd, "--out", str(stopped)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while len(read_jsonl(stopped / "metrics.jsonl")) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    step = torch.load(stopped / "checkpoint.pt", weights_only=False)["step"]
    assert 2 <= step < 8 and len(read_jsonl(stopped / "metrics.jsonl")) == step
    assert f"stopped by {signal.Signals(signum).name} after step {step} of 8" in err
    assert err.count("stopped by") == 1, err  # one line, not a log line beside the command's
    assert f"continue with gmc train --resume --out {stopped}" in err
    resume = [sys.executable, "-m", "gmc", "train", "--resume", "--out", str(stopped)]  # the folder's own config
    subprocess.run(resume, check=True, env=env, capture_output=True)
    assert without_time(read_jsonl(stopped / "metrics.jsonl")) == without_time(
        read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    )


def test_a_second_ctrl_c_aborts_at_once_and_resume_says_where_it_starts(tmp_path, small_config):
    cfg = small_config(steps=8, checkpoint_every=0, **{"hf.token_seconds": 0.1})  # steps of seconds
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(to_dict(cfg)))
    env = {**os.environ, "TQDM_DISABLE": "1"}
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gmc", "train", "--config", str(config), "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not read_jsonl(out / "metrics.jsonl") and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    # both Ctrl-Cs inside the second step: one sent as the first step's row appears could meet the
    # step boundary, where the run checkpoints and exits before the second arrives
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "gmc train: interrupted" in err, err
    assert not (out / "checkpoint.pt").exists()
    done = subprocess.run(
        [sys.executable, "-m", "gmc", "train", "--resume", "--out", str(out), "--set", "steps=1"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "changed: steps" in done.stderr and f"gmc train --resume --out {out}" in done.stderr
    fresh = tmp_path / "fresh"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gmc",
            "train",
            "--config",
            str(config),
            "--set",
            "steps=1",
            "--out",
            str(fresh),
            "--resume",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "no checkpoint to resume from; the run starts from step 0" in done.stderr


def test_checkpoints_by_wall_clock(tmp_path, train_small, monkeypatch):
    """checkpoint_minutes: a checkpoint whenever that much wall clock passed since the last."""
    from gmc.run import trainer

    clock = iter(range(0, 10_000, 45))  # every reading of the trainer's clock: 45 s later
    # the trainer's clock alone: time.monotonic is every thread's (a pool's helper threads too)
    monkeypatch.setattr(trainer.Trainer, "clock", staticmethod(lambda: next(clock)))
    saved = []
    real = trainer.Trainer.save_checkpoint
    monkeypatch.setattr(trainer.Trainer, "save_checkpoint", lambda self: (saved.append(self.step), real(self)))
    train_small(tmp_path / "run", steps=5, checkpoint_every=0, checkpoint_minutes=1.0)
    assert saved == [2, 4, 5]  # 90 s after the start, 90 s after that, and the end


def test_existing_run_needs_resume(tmp_path, train_small, small_config):
    out = train(tmp_path, "done", train_small, steps=1)
    cfg = small_config(steps=1)
    with pytest.raises(FileExistsError, match="finished run"):
        Trainer(cfg, out, progress=False)


def test_nonfinite_steps_are_skipped_then_stop(tmp_path, small_config, monkeypatch):
    real = losses.gmc_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] > 2 else loss), stats

    monkeypatch.setattr(losses, "gmc_loss", poisoned)  # the registry names the loss; it resolves on use
    cfg = small_config(steps=10, checkpoint_every=1, max_nonfinite_steps=3)
    out = tmp_path / "nan"
    trainer = Trainer(cfg, out, progress=False)
    with pytest.raises(NonFiniteError, match="3 consecutive updates"):
        trainer.run()
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["train/skipped_steps"] for r in rows] == [0, 0, 1, 2]
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 4  # the last completed step; the failing step wrote nothing
    for p in ckpt["model"].values():
        assert torch.isfinite(p).all()
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize("behaviour", ["trainer", "sampler"])
def test_a_run_started_from_a_shared_prefill_equals_the_run_that_generates_its_own(tmp_path, small_config, behaviour):
    """A fixed-delay prefill depends on every setting but the estimator: gmc prefill writes one
    with one estimator's config, and another estimator's run started from it (gmc train
    --prefill) equals its own uninterrupted run, metrics, groups and all."""
    from gmc.run.main import main_prefill

    run = dict(steps=4, **{"delay.d": 3, "behaviour_logprobs": behaviour})
    maker, user = tmp_path / "tic.yaml", tmp_path / "gmc.yaml"
    maker.write_text(yaml.safe_dump(to_dict(small_config(algorithm="tic", **run))))
    user.write_text(yaml.safe_dump(to_dict(small_config(algorithm="gmc", **run))))
    main_prefill(str(maker), [], str(tmp_path / "prefill.pt"))

    own, shared = tmp_path / "own", tmp_path / "shared"
    Trainer(load_train_config(str(user)), own, progress=False).run()
    Trainer(load_train_config(str(user)), shared, progress=False, prefill=tmp_path / "prefill.pt").run()
    a, b = read_jsonl(own / "metrics.jsonl"), read_jsonl(shared / "metrics.jsonl")
    assert len(a) == 4 and a[0]["rollout/samples"] == 4 * 3 * 4  # the prefill's 3 calls and step 0's
    assert without_time(a) == without_time(b)
    assert read_jsonl(own / "groups.jsonl") == read_jsonl(shared / "groups.jsonl")


def test_a_prefill_made_for_other_settings_is_refused_naming_them(tmp_path, small_config):
    from gmc.run.main import main_prefill

    maker = tmp_path / "d3.yaml"
    maker.write_text(yaml.safe_dump(to_dict(small_config(**{"delay.d": 3}))))
    main_prefill(str(maker), [], str(tmp_path / "prefill.pt"))
    with pytest.raises(ConfigError, match=r"prefill\.pt: made for other settings \(differing: delay, seed\)"):
        Trainer(
            small_config(seed=1, **{"delay.d": 2}), tmp_path / "run", progress=False, prefill=tmp_path / "prefill.pt"
        )
    with pytest.raises(ConfigError, match="starts without a prefill"):
        Trainer(small_config(), tmp_path / "run2", progress=False, prefill=tmp_path / "prefill.pt")
    with pytest.raises(ConfigError, match="no prefill to write"):
        main_prefill(None, [f"model={small_config().model}", "delay.d=0"], str(tmp_path / "none.pt"))
    assert not (tmp_path / "none.pt").exists()


# ---------------------------------------------------------------------------------------------
# warmup: history


HISTORY_RUN = dict(steps=4, **{"delay.d": 3, "delay.warmup": "history", "delay.history_steps": 5})
"""A fixed delay of 3 after an on-policy history of 5 updates."""


def trained_prompts(out) -> list[int]:
    """The prompt indices a run directory's updates trained, in order (``groups.jsonl``)."""
    return [g["prompt_index"] for g in read_jsonl(out / "groups.jsonl")]


@pytest.mark.parametrize("behaviour", ["trainer", "sampler"])
def test_a_history_run_is_exactly_d_stale_from_d_versions_and_equals_a_run_from_the_shared_history(
    tmp_path, small_config, behaviour
):
    """Every group of every step is exactly d updates stale; the first d steps train the batches
    the history generated for the queue, one per generating version (-3, -2, -1), their behaviour
    log-probs recorded when the history generated them; the run's records hold its own steps only.
    No group is trained twice: the run trains none of the history's prompts, and the prompts a
    delay-0 run from the same history trains, in the same order (a queue of the history's own
    last batches would train them again). A run that makes its own history (a queue of d alone)
    equals one started from a shared history that makes the queues of two delays (gmc history),
    metrics, groups and all; the delay-0 run starts from the same weights."""
    from gmc.run.main import main_history

    cfg = small_config(algorithm="gmc", behaviour_logprobs=behaviour, **HISTORY_RUN)
    own = tmp_path / "own"
    Trainer(cfg, own, progress=False).run()
    groups = read_jsonl(own / "groups.jsonl")
    assert len(read_jsonl(own / "metrics.jsonl")) == 4 and {g["step"] for g in groups} == {0, 1, 2, 3}
    assert {g["staleness"] for g in groups} == {3} and {g["reused"] for g in groups} == {False}
    assert [g["version"] for g in groups if g["step"] < 3] == [v for v in (-3, -2, -1) for _ in range(3)]
    history = read_jsonl(own / "history" / "metrics.jsonl")  # the history's own run directory
    assert len(history) == 5 and ["time/queue_seconds" in r for r in history] == [False] * 2 + [True] * 3
    assert not set(trained_prompts(own)) & set(trained_prompts(own / "history"))
    summary = json.loads((own / "summary.json").read_text())
    assert summary["history/steps"] == 5 and "history/reward_mean_last20" in summary
    assert (summary["async/groups"], summary["async/groups_reused"]) == (len(groups), 0)

    maker = tmp_path / "tic.yaml"  # another estimator and another delay share the history
    maker.write_text(
        yaml.safe_dump(
            to_dict(small_config(algorithm="tic", behaviour_logprobs=behaviour, **{**HISTORY_RUN, "delay.d": 0}))
        )
    )
    main_history(str(maker), [], str(tmp_path / "history"), queues=[2, 3])
    shared = tmp_path / "shared"
    Trainer(cfg, shared, progress=False, history=tmp_path / "history").run()
    assert without_time(read_jsonl(own / "metrics.jsonl")) == without_time(read_jsonl(shared / "metrics.jsonl"))
    assert read_jsonl(own / "groups.jsonl") == read_jsonl(shared / "groups.jsonl")

    zero = Trainer(
        small_config(algorithm="grpo", behaviour_logprobs=behaviour, **{**HISTORY_RUN, "delay.d": 0}),
        tmp_path / "zero",
        progress=False,
        history=tmp_path / "history",
    )
    start = torch.load(tmp_path / "history" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(zero.model.state_dict()[k], v) for k, v in start.items())
    zero.run()
    assert trained_prompts(tmp_path / "zero") == trained_prompts(own)
    assert read_jsonl(own / "history" / "groups.jsonl") == read_jsonl(tmp_path / "history" / "groups.jsonl")


def test_a_group_consumed_again_after_an_update_trained_it_is_recorded_reused(tmp_path, small_config):
    """``reused`` is what happened, not a constant: a source that hands the trainer the batch it
    trained at step 0 again at step 1 (what a queue of a history's own last batches did) gets
    that step's groups recorded as reused."""
    trainer = Trainer(small_config(steps=2, **{"delay.mode": "sync"}), tmp_path / "run", progress=False)
    first = trainer.source.next_batch

    def next_batch(version):
        batch = first(version)
        trainer.source.next_batch = lambda version: batch  # the same groups at every later step
        return batch

    trainer.source.next_batch = next_batch
    trainer.run()
    assert [g["reused"] for g in read_jsonl(tmp_path / "run" / "groups.jsonl")] == [False] * 3 + [True] * 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["async/groups"], summary["async/groups_reused"]) == (6, 3)


def test_which_prompts_each_update_of_a_history_and_a_stale_run_trains_by_hand(tmp_path, small_config):
    """H = 2 on-policy steps of b = 2 prompts, then d = 2 for 3 steps, on the seed's prompt order
    o: the history trains o[0:2] with update 0 and o[2:4] with update 1 and generates the queue,
    o[4:6] with update 0's weights and o[6:8] with update 1's (d batches ahead of its own); the run
    trains o[4:6] (version -2), o[6:8] (version -1), then o[8:10], which its own step 0 generated
    (version 0), each group once: 2 updates stale, reused by none."""
    from gmc.rollouts.collect import PromptCursor, training_records

    cfg = small_config(prompts_per_step=2, **{"delay.d": 2, "delay.warmup": "history", "delay.history_steps": 2})
    out = tmp_path / "run"
    Trainer(cfg, out, progress=False).run()
    o = PromptCursor(training_records(cfg.train_data, cfg.synthetic, cfg.seed), cfg.seed).take(10)
    assert [(g["prompt_index"], g["consumed_version"]) for g in read_jsonl(out / "history" / "groups.jsonl")] == [
        (o[0], 0),
        (o[1], 0),
        (o[2], 1),
        (o[3], 1),
    ]
    queue = [torch.load(RunDir(out / "history").queue_batch(2, j), weights_only=False) for j in range(2)]
    assert [[(g["prompt_index"], g["version"], g["trained"]) for g in batch] for batch in queue] == [
        [(o[4], 0, False), (o[5], 0, False)],
        [(o[6], 1, False), (o[7], 1, False)],
    ]
    assert [
        (g["prompt_index"], g["version"], g["consumed_version"], g["reused"]) for g in read_jsonl(out / "groups.jsonl")
    ] == [
        (o[4], -2, 0, False),
        (o[5], -2, 0, False),
        (o[6], -1, 1, False),
        (o[7], -1, 1, False),
        (o[8], 0, 2, False),
        (o[9], 0, 2, False),
    ]


def test_a_history_and_a_stale_run_resumed_reproduce_their_uninterrupted_twins(tmp_path, small_config, monkeypatch):
    """A history stopped after its checkpoint at step 3, between the two steps that generate its
    queue, and resumed ends with the weights and queues of the history trained straight; a stale
    run from it stopped after its checkpoint at step 3 and resumed equals the run trained
    straight, groups and all."""
    cfg = small_config(
        checkpoint_every=3, steps=4, **{"delay.d": 2, "delay.warmup": "history", "delay.history_steps": 4}
    )
    hist_cfg = history_config(cfg)
    Trainer(hist_cfg, tmp_path / "history", progress=False, queues=[2]).run()
    Trainer(cfg, tmp_path / "straight", progress=False, history=tmp_path / "history").run()

    step = Trainer.train_step

    def stop_at(n):
        def train_step(self):
            if self.step == n:
                raise RuntimeError("stopped")
            return step(self)

        return train_step

    monkeypatch.setattr(Trainer, "train_step", stop_at(3))
    with pytest.raises(RuntimeError, match="stopped"):
        Trainer(hist_cfg, tmp_path / "h2", progress=False, queues=[2]).run()
    assert RunDir(tmp_path / "h2").queue_batch(2, 0).exists() and not RunDir(tmp_path / "h2").queues([2])
    monkeypatch.setattr(Trainer, "train_step", step)
    Trainer(hist_cfg, tmp_path / "h2", resume=True, progress=False, queues=[2]).run()
    a, b = (torch.load(tmp_path / h / "checkpoint.pt", weights_only=False) for h in ("history", "h2"))
    assert all(torch.equal(a["model"][k], v) for k, v in b["model"].items())
    a, b = (
        [torch.load(RunDir(tmp_path / h).queue_batch(2, j), weights_only=False) for j in range(2)]
        for h in ("history", "h2")
    )
    for x, y in zip((g for batch in a for g in batch), (g for batch in b for g in batch), strict=True):
        assert x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k] for k in x)

    monkeypatch.setattr(Trainer, "train_step", stop_at(3))
    with pytest.raises(RuntimeError, match="stopped"):
        Trainer(cfg, tmp_path / "resumed", progress=False, history=tmp_path / "h2").run()
    monkeypatch.setattr(Trainer, "train_step", step)
    Trainer(cfg, tmp_path / "resumed", resume=True, progress=False).run()
    for name in ("metrics.jsonl", "groups.jsonl"):
        straight, resumed = (read_jsonl(tmp_path / r / name) for r in ("straight", "resumed"))
        assert without_time(straight) == without_time(resumed) if name == "metrics.jsonl" else straight == resumed


def test_a_history_made_for_other_settings_is_refused_and_one_without_a_queue_trained_again(tmp_path, small_config):
    from gmc.run.main import main_history
    from gmc.run.trainer import make_history
    from gmc.run.warmstart import made_queues

    maker = tmp_path / "d2.yaml"
    maker.write_text(yaml.safe_dump(to_dict(small_config(**{**HISTORY_RUN, "delay.d": 2}))))
    main_history(str(maker), [], str(tmp_path / "history"), queues=None)  # the maker's queue of 2
    with pytest.raises(ConfigError, match=r"history: made for other settings \(differing: seed\)"):
        Trainer(small_config(seed=1, **HISTORY_RUN), tmp_path / "a", progress=False, history=tmp_path / "history")
    with pytest.raises(
        ConfigError, match=r"holds no queue for d = 3 \(its queues: d = \[2\]\); make it with gmc history --queues 3"
    ):
        Trainer(small_config(**HISTORY_RUN), tmp_path / "b", progress=False, history=tmp_path / "history")

    # a delay added to the sweep: the history is trained again with every queue, the one it had unchanged
    def queue(d):
        return {
            p.name: [
                {k: v.tolist() if torch.is_tensor(v) else v for k, v in g.items()}
                for g in torch.load(p, weights_only=False)
            ]
            for p in (tmp_path / "history" / "queues" / f"d~{d}").iterdir()
        }

    before = queue(2)
    weights = (tmp_path / "history" / "checkpoint.pt").stat().st_size
    make_history(small_config(**HISTORY_RUN), tmp_path / "history", [2, 3])
    assert made_queues(tmp_path / "history") == [2, 3] and not (tmp_path / "history.again").exists()
    assert queue(2) == before
    assert (tmp_path / "history" / "checkpoint.pt").stat().st_size == weights
    with pytest.raises(ConfigError, match="delay.history_steps: --queues 6: a history of 5 steps"):
        main_history(str(maker), [], str(tmp_path / "long"), queues=[6])
    with pytest.raises(ConfigError, match="delay.history_steps: a history of 2 steps cannot fill a queue of d = 3"):
        small_config(**{**HISTORY_RUN, "delay.history_steps": 2})
    with pytest.raises(ConfigError, match="zero_variance_filter: a fixed delay after a history"):
        small_config(zero_variance_filter=True, **HISTORY_RUN)
    with pytest.raises(ConfigError, match=r"zero_variance_filter: .* a history's queues \(d = \[2\]\)"):
        make_history(small_config(zero_variance_filter=True, **{**HISTORY_RUN, "delay.d": 0}), tmp_path / "z", [2])
    with pytest.raises(ConfigError, match="delay.warmup: no history to make"):
        main_history(None, [f"model={small_config().model}", "delay.d=2"], str(tmp_path / "none"), queues=None)


def test_the_final_training_reward_carries_its_sampling_noise():
    """The standard error of the last steps' mean reward: their spread over steps, at least the
    binomial error of all their samples."""
    from gmc.run.summary import reward_se

    flat = [{"rollout/reward_mean": 0.5, "rollout/samples": 64.0}] * 2
    assert reward_se(flat) == pytest.approx(math.sqrt(0.25 / 128))
    steps = [{"rollout/reward_mean": v, "rollout/samples": 1e6} for v in (0.2, 0.8)]
    assert reward_se(steps) == pytest.approx(np.std([0.2, 0.8], ddof=1) / math.sqrt(2))
    assert reward_se([{"step": 0}]) is None


@pytest.mark.parametrize(
    "preset, delay", [("decoupled_geo_rs_token_tis", 0), ("decoupled_seq_is", 2), ("bypass_pg_is", 2)]
)
def test_a_corrected_run_records_every_trained_tokens_three_log_probs(tmp_path, train_small, preset, delay):
    """Each step's file holds the sampler's, the generating version's and the current log-probs of
    every trained token; the diagnostics are in the metrics. With the HF engine in the trainer's
    dtype the sampler is the trainer: the mismatch is float32 rounding. Bypass mode has no
    generating version's log-probs: its diagnostics compare the current policy, staleness included."""
    out = train(tmp_path, preset, train_small, **{"rollout_correction.preset": preset, "delay.d": delay})
    metrics = read_jsonl(out / "metrics.jsonl")
    bypass = preset.startswith("bypass")
    assert all(r["rollout_corr/training_ppl"] > 1 for r in metrics)
    assert bypass or all(r["rollout_corr/k3_kl"] < 1e-8 for r in metrics)
    assert [abs(r["rollout_corr/kl"]) < 1e-4 for r in metrics] == [True] + [not bypass] * 2
    groups = read_jsonl(out / "groups.jsonl")
    for step in range(3):
        tokens = torch.load(out / "logprobs" / f"step_{step:06d}.pt")
        assert tokens["step"] == step and tokens["lengths"].shape == (3, 4)
        n = int(tokens["lengths"].sum())
        assert n == sum(g["length_mean"] * 4 for g in groups if g["step"] == step) and n > 0
        assert all(tokens[k].shape == (n,) for k in ("sampler", "generating", "current"))
        if bypass:
            assert torch.equal(tokens["generating"], tokens["current"])
        else:
            torch.testing.assert_close(tokens["sampler"], tokens["generating"], atol=1e-4, rtol=0)
        if not bypass and step < delay:  # the prefill's theta_0 batches, trained later
            assert torch.equal(tokens["generating"], tokens["current"]) == (step == 0)
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["behaviour_logprobs"] == ("sampler" if bypass else "trainer")


def test_a_bfloat16_sampler_beside_a_float32_trainer_makes_the_mismatch_real(tmp_path, train_small):
    """``sampling.dtype: bfloat16``: the HF engine samples under bfloat16 autocast, the trainer's
    behaviour pass stays float32; their log-probs differ by bfloat16 rounding, which the
    diagnostics measure and a float32 sampler does not show."""
    out = train(
        tmp_path,
        "bf16",
        train_small,
        **{"sampling.dtype": "bfloat16", "delay.d": 1, "rollout_correction.preset": "decoupled_token_is"},
    )
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(r["rollout_corr/k3_kl"] > 1e-6 for r in metrics)
    tokens = torch.load(out / "logprobs" / "step_000001.pt")
    gap = (tokens["sampler"] - tokens["generating"]).abs()
    assert 1e-3 < float(gap.max()) < 1.0
    assert all(r["rollout_corr/rollout_is_mean"] != 1.0 for r in metrics)


def test_the_zero_variance_filter_refills_a_batch_with_the_next_prompts(tmp_path, train_small):
    """Groups whose rewards are all equal are dropped and replaced by groups of the next prompts,
    within the refill calls; every step still trains on one group per prompt asked, and only a
    batch the refills could not complete keeps equal-reward groups."""
    out = train(tmp_path, "filtered", train_small, zero_variance_filter=True, refill_calls=2)
    metrics = read_jsonl(out / "metrics.jsonl")
    groups = read_jsonl(out / "groups.jsonl")
    assert [sum(g["step"] == s for g in groups) for s in range(3)] == [3, 3, 3]
    assert sum(r["rollout/groups_zero_variance"] for r in metrics) > 0  # the tiny model often gets a group all wrong
    for r in metrics:
        assert 0 <= r["rollout/refill_calls"] <= 2
        assert r["rollout/samples"] >= 4 * (3 + r["rollout/refill_calls"])  # each refill asks at least one prompt
        assert r["rollout/groups_zero_variance"] >= 3 * r["train/frac_groups_all_same"]
        if r["rollout/refill_calls"] < 2:  # the batch was completed
            assert r["train/frac_groups_all_same"] == 0
    plain = read_jsonl(train(tmp_path, "plain", train_small) / "metrics.jsonl")
    assert "rollout/refill_calls" not in plain[0] and plain[0]["rollout/samples"] == 12
    with pytest.raises(ConfigError, match="zero_variance_filter"):
        load_train_config(None, ["zero_variance_filter=true", "delay.mode=trace", "delay.trace=x.jsonl"])


def test_bfloat16_live_weights_with_optimizer_masters_agree_with_the_autocast_update(tmp_path, train_small):
    """``master_weights: optimizer`` (bfloat16 parameters, float32 masters in the optimizer) against
    bfloat16 autocast over float32 parameters, three steps of one run: the losses agree within
    bfloat16's tolerance (2e-2); the masters move as far as the float32 parameters do (norms of
    the moves within 1%: no update is rounded away or inflated to bfloat16's grid, which moves
    bfloat16 weights without masters 4-17% further on the tiny model) and the same way (cosine
    > 0.75: Adam's first steps turn every gradient of bfloat16's noise level into a full step of
    either sign, so the cosine sits at 0.88-0.99 on the processors tried, not at 1); the
    checkpoint holds the masters, and the live weights are them rounded."""
    runs = {}
    for mode in ("true", "optimizer"):
        out = train(
            tmp_path,
            mode,
            train_small,
            model_dtype="bfloat16",
            master_weights=mode,
            checkpoint_every=3,
            keep_checkpoints="last",
        )
        runs[mode] = (read_jsonl(out / "metrics.jsonl"), torch.load(out / "checkpoint.pt", weights_only=False))
    (autocast, a_state), (masters, m_state) = runs["true"], runs["optimizer"]
    for a, m in zip(autocast, masters):
        assert (
            abs(a["train/loss"] - m["train/loss"]) < 2e-2 and abs(a["train/reward_mean"] - m["train/reward_mean"]) < 0.3
        )
    from gmc.policy.model import load_policy

    model_dir = yaml.safe_load((tmp_path / "true" / "config.yaml").read_text())["model"]
    start = dict(load_policy(model_dir, "float32", "cpu")[0].named_parameters())  # tied weights once
    assert a_state["masters"] is None and len(m_state["masters"]) == len(start)
    live = m_state["model"]
    moved_a, moved_m = [], []
    for (name, w0), m in zip(start.items(), m_state["masters"]):
        w0 = w0.detach()
        assert live[name].dtype == torch.bfloat16 and torch.equal(live[name], m.to(torch.bfloat16))
        moved_a.append((a_state["model"][name] - w0).flatten())
        moved_m.append((m - w0.to(torch.bfloat16).float()).flatten())  # its masters start from the bf16 weights
    moved_a, moved_m = torch.cat(moved_a), torch.cat(moved_m)
    assert moved_a.norm() > 0, "the autocast run never updated: no group in three steps had two rewards"
    assert abs(float(moved_m.norm() / moved_a.norm()) - 1) < 1e-2, (float(moved_m.norm()), float(moved_a.norm()))
    cos = torch.nn.functional.cosine_similarity(moved_a, moved_m, dim=0)
    assert cos > 0.75, float(cos)
