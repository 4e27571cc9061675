"""Real asynchrony on Ray (delay mode ``ray``), on the tiny model with a real Ray runtime: bound 0
with one worker equals the synchronous loop; two workers train within the bound and record
every group; with two updates per batch versions and the bound count updates; generation runs ahead as far as the bound admits; partial rollouts take new
weights mid-answer; the trace of a run replays with its lags; a killed worker (under either
weight transport) and a killed driver end in finished runs with nothing trained twice; a worker
that raises fails the run with its error;
the collective weight transport (gloo) trains too; SIGTERM and SIGUSR1 stop a run with a
checkpoint that resumes to the uninterrupted run."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from gmc.io import read_jsonl
from gmc.rollouts.sources import trace_line
from gmc.run.summary import without_time
from gmc.run.trainer import Trainer

ray = pytest.importorskip("ray")


pytestmark = pytest.mark.ray


REAL = {"delay.mode": "ray", "sampling.max_new_tokens": 24}


def consumed(out):
    return read_jsonl(out / "groups.jsonl")


def check_records(out, steps, per_step, bound, updates_per_batch=1):
    """Every step's batch is full, no prompt is trained twice, every lag is within the bound and
    every group carries its worker, versions and wall-clock times; the trace counts steps."""
    groups = consumed(out)
    assert len(groups) == steps * per_step
    assert [sum(g["step"] == s for g in groups) for s in range(steps)] == [per_step] * steps
    assert len({g["prompt_index"] for g in groups}) == len(groups)  # nothing trained twice
    assert {g["reused"] for g in groups} == {False}
    for g in groups:
        assert g["staleness"] == g["consumed_version"] - g["version"] <= bound
        assert g["worker"] is not None and g["submit_wall"] <= g["finish_wall"] <= g["consume_wall"]
        assert g["generation_seconds"] > 0
    trace = read_jsonl(out / "staleness_trace.jsonl")
    assert trace == [trace_line(g, updates_per_batch) for g in groups]
    return groups


def test_bound_zero_with_one_worker_equals_the_synchronous_loop(tmp_path, train_small):
    sync = train_small(tmp_path / "sync", steps=3, **{"delay.mode": "sync", "sampling.max_new_tokens": 24})
    real = train_small(tmp_path / "ray", steps=3, **REAL, **{"delay.workers": 1, "delay.max_staleness": 0})
    for a, b in zip(without_time(sync), without_time(real)):
        for key in ("train/loss", "train/grad_norm", "train/reward_mean", "rollout/reward_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key  # float32 rounding
    check_records(tmp_path / "ray", 3, 3, bound=0)
    assert {r["async/dropped"] for r in real} == {0.0}


def test_two_workers_train_within_the_bound_and_the_trace_replays(tmp_path, train_small):
    metrics = train_small(
        tmp_path / "ray", steps=5, prompts_per_step=4, **REAL, **{"delay.workers": 2, "delay.max_staleness": 2}
    )
    groups = check_records(tmp_path / "ray", 5, 4, bound=2)
    assert max(g["staleness"] for g in groups) >= 1  # the workers ran ahead
    assert all(r["async/weight_sync_bytes"] > 0 and r["async/weight_sync_seconds"] >= 0 for r in metrics)
    assert all(sum(v for k, v in r.items() if k.startswith("async/staleness_hist/")) == 4 for r in metrics)
    assert {"async/trainer_idle_seconds", "async/worker_idle_seconds", "async/buffer_groups"} <= set(metrics[0])
    # the recorded pattern, replayed in one process with another estimator: the same lags, group by group
    trace = tmp_path / "ray" / "staleness_trace.jsonl"
    train_small(
        tmp_path / "replay",
        steps=5,
        prompts_per_step=4,
        algorithm="tic",
        **{"delay.mode": "trace", "delay.trace": str(trace), "sampling.max_new_tokens": 24},
    )
    replay = consumed(tmp_path / "replay")
    assert [(g["prompt_index"], g["version"], g["consumed_version"]) for g in replay] == [
        (g["prompt_index"], g["version"], g["consumed_version"]) for g in groups
    ]
    with pytest.raises(ValueError, match="^prompts_per_step: the trace"):
        train_small(
            tmp_path / "wrong", steps=5, prompts_per_step=3, **{"delay.mode": "trace", "delay.trace": str(trace)}
        )


def test_weights_sent_every_second_step_label_the_groups_and_are_counted(tmp_path, train_small, small_config):
    """``delay.publish_every: 2``: the workers get the weights of versions 0, 2 and 4 only, so every
    group is labelled with one of them, and the steps in between send nothing; an interval the
    bound cannot wait out, or one outside real asynchrony, is refused naming the key."""
    from gmc.settings import ConfigError

    metrics = train_small(
        tmp_path / "ray",
        steps=5,
        prompts_per_step=4,
        **REAL,
        **{"delay.workers": 2, "delay.max_staleness": 2, "delay.publish_every": 2},
    )
    groups = check_records(tmp_path / "ray", 5, 4, bound=2)
    assert {g["version"] for g in groups} <= {0, 2, 4}
    assert [r["async/weights_version"] for r in metrics] == [0.0, 2.0, 2.0, 4.0, 4.0]
    assert [r["async/weight_sync_bytes"] > 0 for r in metrics] == [False, True, False, True, False]
    with pytest.raises(ConfigError, match="delay.publish_every"):
        Trainer(
            small_config(**REAL, **{"delay.max_staleness": 1, "delay.publish_every": 3}),
            tmp_path / "long",
            progress=False,
        )
    with pytest.raises(ConfigError, match="publish_every"):
        small_config(**{"delay.d": 2, "delay.publish_every": 2})


def test_two_updates_per_batch_count_versions_and_the_bound_in_updates(tmp_path, train_small):
    """``updates_per_batch: 2``: the workers' groups carry the updates whose weights were sent (2 s
    after step s - 1), step s's mini-batches are consumed by updates 2 s and 2 s + 1, no group is
    trained more than ``max_staleness`` updates after its weights, the lags are counted at each
    group's own update, and the trace counts steps."""
    metrics = train_small(
        tmp_path / "ray",
        steps=4,
        prompts_per_step=4,
        updates_per_batch=2,
        **REAL,
        **{"delay.workers": 2, "delay.max_staleness": 2},
    )
    groups = check_records(tmp_path / "ray", 4, 4, bound=2, updates_per_batch=2)
    assert {g["version"] % 2 for g in groups} == {0}
    assert [g["consumed_version"] for g in groups] == [u for u in range(8) for _ in range(2)]
    for s, r in enumerate(metrics):
        lags = Counter(g["staleness"] for g in groups if g["step"] == s)
        hist = {k: v for k, v in r.items() if k.startswith("async/staleness_hist/")}
        assert hist == {f"async/staleness_hist/{lag}": float(n) for lag, n in lags.items()}
    assert [r["async/weights_version"] for r in metrics] == [2.0, 4.0, 6.0, 8.0]


def test_generation_runs_ahead_as_far_as_the_bound_admits(tmp_path, train_small):
    """Generation-bound (decoding slowed to 0.01 s a token): each worker keeps a task queued behind
    the one it generates, so more than a step's groups are in flight and the lags spread past 1,
    within the bound; the trainer waits for groups, the workers hardly for work."""
    metrics = train_small(
        tmp_path / "ray",
        steps=8,
        prompts_per_step=4,
        **REAL,
        **{"delay.workers": 2, "delay.max_staleness": 4, "hf.token_seconds": 0.01},
    )
    groups = check_records(tmp_path / "ray", 8, 4, bound=4)
    assert max(r["async/in_flight"] for r in metrics) > 4  # more than one step's groups
    assert max(g["staleness"] for g in groups) >= 2
    assert sum(r["async/trainer_idle_seconds"] for r in metrics) > sum(r["async/worker_idle_seconds"] for r in metrics)


def test_partial_rollouts_take_new_weights_mid_answer(tmp_path, train_small, small_config):
    """With ``delay.partial_rollouts`` a worker takes in the weights published while it decodes:
    some groups' tokens come from more than one version, the oldest being the group's version."""
    from gmc.run.config import ConfigError

    train_small(
        tmp_path / "ray",
        steps=6,
        prompts_per_step=4,
        behaviour_logprobs="sampler",
        **REAL,
        **{"delay.workers": 2, "delay.max_staleness": 4, "delay.partial_rollouts": True, "hf.token_seconds": 0.01},
    )
    groups = check_records(tmp_path / "ray", 6, 4, bound=4)
    assert all(g["versions"][0] == g["version"] and g["versions"] == sorted(set(g["versions"])) for g in groups)
    assert any(len(g["versions"]) > 1 for g in groups)
    with pytest.raises(ConfigError, match="delay.partial_rollouts: partial rollouts need behaviour_logprobs: sampler"):
        Trainer(
            small_config(behaviour_logprobs="trainer", **REAL, **{"delay.partial_rollouts": True}),
            tmp_path / "refused",
            progress=False,
        )


@pytest.mark.parametrize("transport, workers", [("object_store", 2), ("collective", 2), ("collective", 1)])
def test_a_killed_worker_is_restarted_and_nothing_is_lost_or_trained_twice(tmp_path, small_config, transport, workers):
    """Under either transport: the killed worker's tasks go again, it comes back (under
    ``collective`` the group is formed again without it, and with it once it is back; a lone
    worker back before the next step's publish makes the waiting trainer publish its weights
    again) and the run ends with every batch full."""
    # decoding slowed to 0.05 s per token, so that the kill lands while a task is generating
    trainer = Trainer(
        small_config(
            steps=8,
            prompts_per_step=4,
            **REAL,
            **{
                "delay.workers": workers,
                "delay.max_staleness": 1,
                "hf.token_seconds": 0.05,
                "delay.transport": transport,
            },
        ),
        tmp_path / "run",
        progress=False,
    )
    pool = trainer.source.pool
    killed = []
    real_step = trainer.train_step

    def step_then_kill():
        out = real_step()
        if trainer.step == 1:  # the next tasks are in flight: kill a worker's process under one
            with pool.lock:  # the dispatcher thread changes what is pending
                (k, *_), *_ = pool.pending.values()
            pid = ray.get(pool.workers[k].pid.remote())
            os.kill(pid, signal.SIGKILL)
            killed.append((k, pid, time.time()))
        elif trainer.step == 2:  # its process back before the run goes on: a loaded machine restarts it slowly
            ray.get(pool.workers[killed[0][0]].pid.options(max_task_retries=-1).remote(), timeout=120)
        return out

    trainer.train_step = step_then_kill
    trainer.run()
    assert killed
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert metrics[-1]["async/lost_tasks"] >= 1
    groups = check_records(tmp_path / "run", 8, 4, bound=1)
    k, _, when = killed[0]
    assert any(g["worker"] == k and g["submit_wall"] > when for g in groups), "the restarted worker delivers again"


def test_a_worker_killed_unseen_fails_a_broadcast_that_reaches_the_others_again(tmp_path, small_config):
    """A worker killed where only the collective broadcast notices it: the publish finds it dead,
    forms the group again without it and broadcasts to the others, which then load that version;
    the source watches the dead worker until Ray has restarted it."""
    trainer = Trainer(
        small_config(steps=2, **REAL, **{"delay.workers": 2, "delay.transport": "collective"}),
        tmp_path / "run",
        progress=False,
    )
    source, pool = trainer.source, trainer.source.pool
    try:
        with source.lock:  # the dispatcher cannot see the death first
            os.kill(ray.get(pool.workers[1].pid.remote()), signal.SIGKILL)
            time.sleep(1)
            pool.transport.publish(trainer.model, 7)
            assert pool.transport.found_dead == {1} and pool.transport.members == (0,)
            assert pool.transport.task_weights(1)["ref"] is not None  # it pulls the copy once back
        assert ray.get(pool.workers[0].generate.remote([0], 7, 99, pool.transport.task_weights(0)))["version"] == 7
    finally:
        source.close()


def test_a_killed_driver_resumes_with_the_bound_holding(tmp_path, small_config):
    import yaml

    from gmc.run.config import to_dict

    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            to_dict(
                small_config(
                    steps=6,
                    prompts_per_step=4,
                    checkpoint_every=2,
                    **REAL,
                    **{"delay.workers": 2, "delay.max_staleness": 2},
                )
            )
        )
    )
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gmc", "train", "--config", str(config), "--out", str(out)]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not (out / "checkpoint.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray processes it started
    proc.wait()
    ray_cli = str(Path(sys.executable).parent / "ray")
    subprocess.run([ray_cli, "stop", "--force"], capture_output=True)  # what a killed Ray leaves behind
    assert (out / "checkpoint.pt").exists() and not (out / "summary.json").exists()
    done = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    check_records(out, 6, 4, bound=2)


def faulty(how):
    """A stand-in for the rollout worker's class: raises on a bad prompt, or dies whenever it generates."""

    @ray.remote(max_restarts=-1, max_task_retries=0)
    class Faulty:
        def __init__(self, config, records, worker):
            pass

        def pid(self):
            return os.getpid()

        def generate(self, prompts, version, task, weights):
            if how == "raise":
                raise ValueError(f"bad prompt {prompts[0]}")
            os._exit(1)

    return Faulty


@pytest.mark.parametrize(
    "how, message",
    [
        ("raise", r"rollout worker 0 failed: ValueError\('bad prompt \d+'\)"),
        ("die", r"rollout worker 0 died 3 times generating prompts \["),
    ],
)
def test_a_worker_that_raises_or_keeps_dying_fails_the_run_with_its_error(
    tmp_path, small_config, how, message, monkeypatch
):
    from gmc.rollouts.ray import worker
    from gmc.rollouts.ray.pool import RolloutWorkerError

    monkeypatch.setattr(worker, "RolloutWorker", faulty(how))
    with pytest.raises(RolloutWorkerError, match=message):
        Trainer(small_config(steps=2, **REAL, **{"delay.workers": 1}), tmp_path / "run", progress=False).run()


def test_a_worker_that_cannot_start_is_not_restarted_forever(tmp_path, small_config):
    from gmc.rollouts.ray.pool import RolloutWorkerError

    with pytest.raises(RolloutWorkerError, match="rollout worker 0 could not start"):
        Trainer(small_config(steps=2, **REAL, **{"delay.worker_device": "xpu"}), tmp_path / "run", progress=False).run()
    with pytest.raises(RolloutWorkerError, match="asks Ray for 0.5 of a GPU per worker: 1 workers, 0 GPUs free"):
        Trainer(
            small_config(steps=2, **REAL, **{"delay.worker_device": "cuda", "delay.worker_gpus": 0.5}),
            tmp_path / "run2",
            progress=False,
        )


def test_the_model_folder_is_checked_on_every_node(tmp_path, tiny_model_dir):
    """A folder the nodes cannot read is an error naming the node, before any worker starts."""
    from gmc.rollouts.ray.pool import RolloutWorkerError, check_model_on_every_node

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        check_model_on_every_node(str(tiny_model_dir))
        with pytest.raises(RolloutWorkerError, match=r"node [\d.]+: model folder .*missing-model not found"):
            check_model_on_every_node(str(tmp_path / "missing-model"))
    finally:
        ray.shutdown()


def test_the_collective_transport_trains_too(tmp_path, train_small):
    metrics = train_small(tmp_path / "run", steps=3, **REAL, **{"delay.workers": 2, "delay.transport": "collective"})
    check_records(tmp_path / "run", 3, 3, bound=4)
    assert all(r["async/weight_sync_bytes"] > 0 for r in metrics)


def reproducible(rows, wall=("submit_wall", "finish_wall", "consume_wall")):
    """Metrics or group lines without what the wall clock decides (``time/``, every ``_seconds``
    and the groups' wall-clock stamps)."""
    return [{k: v for k, v in r.items() if not k.endswith("_seconds") and k not in wall} for r in without_time(rows)]


@pytest.mark.timeout(900)  # four runs of the driver, each starting Ray
def test_stop_signals_end_a_ray_run_with_a_checkpoint_and_the_resumes_equal_the_uninterrupted_run(
    tmp_path, small_config
):
    """SIGTERM to a ``gmc train`` of a Ray run, then SIGUSR1 after a resume to the whole process
    group (as SLURM signals every process of a job: Ray's head and raylet too): each time the
    run ends at the next step boundary with a checkpoint and exit status 75 (``ray.init``
    installs Ray's own SIGTERM handler; the run takes the signals back, and Ray's processes
    start with them blocked), its workers and Ray shut down, and the resumed run's metrics and
    groups are the uninterrupted run's (one worker at bound 0 is deterministic)."""
    import yaml

    from gmc.run.config import to_dict

    steps = 7
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            to_dict(
                small_config(steps=steps, checkpoint_every=0, **REAL, **{"delay.workers": 1, "delay.max_staleness": 0})
            )
        )
    )
    cmd = [sys.executable, "-m", "gmc", "train", "--config", str(config)]
    env = {**os.environ, "TQDM_DISABLE": "1"}
    straight = tmp_path / "straight"
    done = subprocess.run([*cmd, "--out", str(straight)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "stopped"
    step = 0
    for signum, send in ((signal.SIGTERM, os.kill), (signal.SIGUSR1, os.killpg)):
        args = [*cmd, "--out", str(out), *(["--resume"] if step else [])]
        proc = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )  # its own process group: the driver and its Ray
        try:
            deadline = time.time() + 300
            while len(read_jsonl(out / "metrics.jsonl")) < step + 2 and time.time() < deadline and proc.poll() is None:
                time.sleep(0.05)
            send(proc.pid, signum)
            _, err = proc.communicate(timeout=300)
            name = signal.Signals(signum).name
            assert proc.returncode == 75, f"{name}: exit status {proc.returncode}\n{err[-3000:]}"
            step = torch.load(out / "checkpoint.pt", weights_only=False)["step"]
            assert len(read_jsonl(out / "metrics.jsonl")) == step < steps
            assert f"stopped by {name} after step {step} of {steps}" in err
            deadline = time.time() + 60  # the Ray processes the driver started end with it
            while time.time() < deadline and group_alive(proc.pid):
                time.sleep(0.2)
            assert not group_alive(proc.pid), f"{name}: processes of the stopped run outlived it"
        finally:
            if group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert step >= 4  # two stops, each after at least two steps
    done = subprocess.run([*cmd, "--out", str(out), "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert reproducible(read_jsonl(out / "metrics.jsonl")) == reproducible(read_jsonl(straight / "metrics.jsonl"))
    assert reproducible(consumed(out)) == reproducible(consumed(straight))
    check_records(out, steps, 3, bound=0)


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is left (a zombie counts until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
