"""The run directory: no fault loses a run, corrupts it, or stalls it. A changed-config resume,
two owners of one directory, a killed owner, damaged checkpoints, a checkpoint mapped to
another device, non-finite weights and leftovers of interrupted writes."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import yaml

from gmc.io import read_jsonl
from gmc.run.config import ConfigError, load_train_config
from gmc.run.rundir import CheckpointError, ConfigMismatch, RunDir, RunDirBusy
from gmc.run.summary import without_time
from gmc.run.trainer import NonFiniteError, Trainer

RUN = dict(steps=4, prompts_per_step=2, checkpoint_every=2, keep_checkpoints="all", **{"sampling.max_new_tokens": 24})
"""Four steps with checkpoints at steps 2 and 4, both kept when the run finishes."""


@pytest.fixture(scope="session")
def small(small_config):
    """``small(**overrides)``: the config of this module's run, :data:`RUN`."""
    return lambda **overrides: small_config(**{**RUN, **overrides})


@pytest.fixture(scope="module")
def straight(tmp_path_factory, small):
    """An uninterrupted 4-step run with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("straight") / "run"
    Trainer(small(), out, progress=False).run()
    return out


def copy_run(src, dst):
    shutil.copytree(src, dst)
    (dst / "summary.json").unlink()
    return dst


def test_resume_with_a_changed_config_is_refused(straight, tmp_path, small):
    out = copy_run(straight, tmp_path / "run")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".lock"}
    with pytest.raises(ConfigMismatch, match=r"changed: lr\b"):
        Trainer(small(lr=1e-4), out, resume=True, progress=False)
    # refused twice in a row: nothing of the old run was touched or replaced
    with pytest.raises(ConfigMismatch, match="mix two runs"):
        Trainer(small(lr=1e-4), out, resume=True, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".lock"} == before


def test_finished_run_resumed_with_another_config_is_refused(straight, tmp_path, small):
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    with pytest.raises(ConfigMismatch, match="seed"):
        Trainer(small(seed=1), out, resume=True, progress=False)
    assert (out / "summary.json").exists() and (out / "model").is_dir()


def test_resume_from_an_earlier_checkpoint_unmarks_the_finished_run(straight, tmp_path, small):
    out = tmp_path / "run"
    shutil.copytree(straight, out)
    (out / "checkpoint.pt").write_bytes(b"")  # the latest is lost: the run goes back to step 2
    trainer = Trainer(small(), out, resume=True, progress=False)
    assert trainer.step == 2
    assert not (out / "summary.json").exists() and not (out / "model").exists()
    trainer.run()
    assert without_time(read_jsonl(out / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))


def test_two_runs_on_one_directory(tmp_path, small):
    out = tmp_path / "run"
    first = Trainer(small(steps=1), out, progress=False)
    with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
        Trainer(small(steps=1, seed=1), out, progress=False)
    first.run()
    assert yaml.safe_load((out / "config.yaml").read_text())["seed"] == 0
    # the lock went with the run: the directory can be resumed
    Trainer(small(steps=1), out, resume=True, progress=False).run()


def test_an_abandoned_start_removes_only_a_folder_it_made_and_left_empty_of_a_run(tmp_path):
    """What a start that fails before training leaves: nothing, where open() made the folder and it
    holds no more than the lock, the config and the run's record; a folder that was there before
    (or that holds more) stays."""
    made = RunDir(tmp_path / "new")
    made.open({"seed": 0}, resume=False)
    (made.path / "config.yaml").write_text("seed: 0\n")
    made.abandon()
    assert not made.path.exists()
    (tmp_path / "old").mkdir()
    there = RunDir(tmp_path / "old")
    there.open({"seed": 0}, resume=False)
    there.abandon()
    assert there.path.is_dir()
    more = RunDir(tmp_path / "more")
    more.open({"seed": 0}, resume=False)
    (more.path / "metrics.jsonl").write_text("{}\n")
    more.abandon()
    assert (more.path / "metrics.jsonl").exists()


def test_lock_of_a_killed_owner_is_taken_over(tmp_path, caplog):
    out = tmp_path / "run"
    code = (
        f"from gmc.run.rundir import RunDir; import time; r = RunDir({str(out)!r}); r.acquire(); "
        "print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirBusy, match=f"pid {proc.pid}"):
            RunDir(out).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with caplog.at_level(logging.WARNING), RunDir(out) as rd:
        rd.acquire()
    assert f"pid {proc.pid}" in caplog.text and "ended without closing" in caplog.text
    assert (out / ".lock").read_text() == ""  # closed cleanly this time


def test_corrupted_checkpoint_falls_back_to_the_previous_one(straight, tmp_path, small, caplog):
    out = copy_run(straight, tmp_path / "run")
    data = bytearray((out / "checkpoint.pt").read_bytes())
    mid = len(data) // 2
    data[mid : mid + 14] = b"\x13" * 14  # 14 bytes of garbage inside a tensor record
    (out / "checkpoint.pt").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        trainer = Trainer(small(), out, resume=True, progress=False)
    assert trainer.step == 2
    assert "checkpoint.pt: corrupted" in caplog.text and "previous checkpoint checkpoint.prev.pt" in caplog.text
    trainer.run()
    assert without_time(read_jsonl(out / "metrics.jsonl")) == without_time(read_jsonl(straight / "metrics.jsonl"))
    assert (out / "checkpoint.rejected.pt").exists()


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_unreadable_checkpoints_name_the_files(straight, tmp_path, small, damage):
    out = copy_run(straight, tmp_path / "run")
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        path = out / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2] if damage == "truncated" else b"")
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt: not a complete checkpoint.*checkpoint\.prev\.pt"):
        Trainer(small(), out, resume=True, progress=False)
    RunDir(out).acquire()  # the failed start released the lock


def test_checkpoint_write_is_durable_and_rotates(tmp_path, monkeypatch):
    from gmc.run import rundir

    synced, real = [], rundir.fsync_path
    # the run directory's fsync alone, not os.fsync for every thread of the process
    monkeypatch.setattr(rundir, "fsync_path", lambda path: (synced.append(str(path)), real(path)))
    with RunDir(tmp_path) as rd:
        rd.open({"a": 1}, resume=False)
        rd.write_checkpoint({"step": 1})
        rd.write_checkpoint({"step": 2})
        assert rd.load_checkpoint()["step"] == 2
        assert torch.load(rd.previous, weights_only=False)["step"] == 1
    # the temporary file is synced before its rename, the folder after it
    assert [p.endswith(".tmp") for p in synced] == [True, False, True, False]
    assert synced[1] == str(tmp_path)


@pytest.mark.parametrize(
    "keep,left",
    [
        ("all", {"checkpoint.pt", "checkpoint.prev.pt", "checkpoint.rejected.pt"}),
        ("last", {"checkpoint.pt"}),
        ("none", set()),
    ],
)
def test_a_finished_run_keeps_the_checkpoints_its_setting_says(tmp_path, keep, left):
    with RunDir(tmp_path) as rd:
        rd.open({"a": 1}, resume=False)
        for step in (1, 2):
            rd.write_checkpoint({"step": step})
        (tmp_path / "checkpoint.rejected.pt").write_bytes(b"")
        rd.finish({"steps": 2}, keep)
    assert {p.name for p in tmp_path.glob("checkpoint*")} == left
    assert json.loads((tmp_path / "summary.json").read_text()) == {"steps": 2}


def test_a_run_keeps_its_last_checkpoint_by_default(tmp_path, small):
    Trainer(small(keep_checkpoints="last"), tmp_path / "run", progress=False).run()
    assert load_train_config(None, []).keep_checkpoints == "last"
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint*")) == ["checkpoint.pt"]
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["step"] == 4


def on_meta(value):
    """``value`` with every tensor in it moved to the ``meta`` device (containers rebuilt)."""
    if torch.is_tensor(value):
        return value.to("meta")
    if isinstance(value, dict):
        return {k: on_meta(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_meta(v) for v in value)
    return value


@pytest.fixture(scope="module")
def queued(tmp_path_factory, small):
    """An uninterrupted 4-step run at delay 2 (its checkpoints hold queued groups)."""
    out = tmp_path_factory.mktemp("queued") / "run"
    Trainer(small(**{"delay.d": 2}), out, progress=False).run()
    return out


def resume_at_step_2(src, dst):
    """A copy of the run in ``src`` whose latest checkpoint is the one of step 2."""
    out = copy_run(src, dst)
    os.replace(out / "checkpoint.prev.pt", out / "checkpoint.pt")
    return out


def test_a_checkpoint_resumes_on_any_device(queued, tmp_path, small, monkeypatch):
    """A run on a GPU once loaded its checkpoint mapped to that device, which moved the saved CPU
    random states there, and torch.set_rng_state refused them. Here the run's device is a GPU
    (``meta`` stands in for it) and torch.load puts a checkpoint's tensors wherever
    map_location names (anything but the CPU: on ``meta``). The resume still restores the CPU
    random state from a CPU byte tensor, keeps the queued groups on the CPU and trains to the
    uninterrupted run's metrics; so does a plain CPU resume."""
    real_load, real_set, real_resume = torch.load, torch.set_rng_state, Trainer._load_checkpoint
    maps, states = [], []

    def load_as_on_a_gpu(f, map_location=None, **kwargs):
        maps.append(map_location)
        state = real_load(f, map_location="cpu", **kwargs)
        on_cpu = isinstance(map_location, (str, torch.device)) and torch.device(map_location).type == "cpu"
        return state if on_cpu else on_meta(state)

    def resume_on_a_gpu(self):
        device, self.device = self.device, torch.device("meta")  # what a GPU run's device would be
        try:
            real_resume(self)
        finally:
            self.device = device

    def set_rng_state(state):
        states.append((state.device.type, state.dtype))
        real_set(state)

    with monkeypatch.context() as m:
        m.setattr(torch, "load", load_as_on_a_gpu)
        m.setattr(torch, "set_rng_state", set_rng_state)
        m.setattr(Trainer, "_load_checkpoint", resume_on_a_gpu)
        trainer = Trainer(
            small(**{"delay.d": 2}), resume_at_step_2(queued, tmp_path / "gpu"), resume=True, progress=False
        )
    assert maps and states == [("cpu", torch.uint8)]
    assert trainer.step == 2 and trainer.source.queued_groups()
    assert {
        t.device.type for g in trainer.source.queued_groups() for t in g.state().values() if torch.is_tensor(t)
    } == {"cpu"}
    trainer.run()
    straight = without_time(read_jsonl(queued / "metrics.jsonl"))
    assert without_time(read_jsonl(tmp_path / "gpu" / "metrics.jsonl")) == straight

    out = resume_at_step_2(queued, tmp_path / "cpu")
    Trainer(small(**{"delay.d": 2}), out, resume=True, progress=False).run()
    assert without_time(read_jsonl(out / "metrics.jsonl")) == straight


def test_a_checkpoint_of_another_optimizer_is_refused(queued, tmp_path, small):
    """optimizer: auto is 8-bit AdamW on CUDA and AdamW elsewhere: a checkpoint whose optimizer
    state is another optimizer's is refused by name, not loaded into the wrong optimizer."""
    out = resume_at_step_2(queued, tmp_path / "run")
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    torch.save({**state, "optimizer_class": "AdamW8bit"}, out / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="optimizer state is AdamW8bit's, this run's optimizer is AdamW"):
        Trainer(small(**{"delay.d": 2}), out, resume=True, progress=False)


def test_nonfinite_weights_are_not_checkpointed(tmp_path, small):
    with pytest.raises(ConfigError, match="lr: must be a finite number, got inf"):
        small(lr=".inf")
    with pytest.raises(ConfigError, match="lr: must be a valid number, got 'inf'"):
        small(lr="inf")
    # finite settings whose first update overflows float32: a norm weight near 1 times -3.3e38, minus 3e37
    cfg = small(lr=3e37, weight_decay=11.0, checkpoint_every=1)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError, match="weight tensors are not finite after step 1"):
        Trainer(cfg, out, progress=False).run()
    assert not (out / "checkpoint.pt").exists() and not (out / "summary.json").exists()


def test_temp_files_of_interrupted_writes_are_cleaned(straight, tmp_path, small):
    out = copy_run(straight, tmp_path / "run")
    (out / ".checkpoint.pt.k2j3.tmp").write_bytes(b"x" * 1000)
    (out / ".metrics.jsonl.abc.tmp").write_text("{}\n")
    (out / ".model.q9x.tmp").mkdir()
    (out / ".model.q9x.tmp" / "model.safetensors").write_bytes(b"partial")
    (out / ".model.old").mkdir()
    trainer = Trainer(small(), out, resume=True, progress=False)
    trainer.run()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".lock"]
