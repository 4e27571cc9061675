"""Reliability: no fault or hostile input loses a run, corrupts it, or stalls it.

Each test is one case a hostile user tried: a changed-config resume, two owners of one run
directory, damaged checkpoints, a checkpoint mapped to another device, a stop handler
replaced by another, non-finite weights, nonsense config values, hostile grading
input, bad data and model folders, and leftovers of interrupted writes."""

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import yaml

from gmc.config import ConfigError, load_config, load_train_config
from gmc.rundir import CheckpointError, ConfigMismatch, RunDir, RunDirBusy
from gmc.trainer import NonFiniteError, Trainer, read_jsonl, without_time

RUN = dict(steps=4, prompts_per_step=2, checkpoint_every=2, keep_checkpoints="all",
           **{"sampling.max_new_tokens": 24})
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


# ---------------------------------------------------------------------------------------------
# 1. a resume with another config is refused, never mixed


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


# ---------------------------------------------------------------------------------------------
# 2. one owner per run directory


def test_two_runs_on_one_directory(tmp_path, small):
    out = tmp_path / "run"
    first = Trainer(small(steps=1), out, progress=False)
    with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
        Trainer(small(steps=1, seed=1), out, progress=False)
    first.run()
    assert yaml.safe_load((out / "config.yaml").read_text())["seed"] == 0
    # the lock went with the run: the directory can be resumed
    Trainer(small(steps=1), out, resume=True, progress=False).run()


def test_lock_of_a_killed_owner_is_taken_over(tmp_path, caplog):
    out = tmp_path / "run"
    code = (f"from gmc.rundir import RunDir; import time; r = RunDir({str(out)!r}); r.acquire(); "
            "print('locked', flush=True); time.sleep(60)")
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


# ---------------------------------------------------------------------------------------------
# 3. checkpoints prove themselves


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
    from gmc import rundir

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


@pytest.mark.parametrize("keep,left", [("all", {"checkpoint.pt", "checkpoint.prev.pt", "checkpoint.rejected.pt"}),
                                       ("last", {"checkpoint.pt"}), ("none", set())])
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
        trainer = Trainer(small(**{"delay.d": 2}), resume_at_step_2(queued, tmp_path / "gpu"), resume=True,
                          progress=False)
    assert maps and states == [("cpu", torch.uint8)]
    assert trainer.step == 2 and trainer.source.queued_groups()
    assert {t.device.type for g in trainer.source.queued_groups() for t in g.state().values() if torch.is_tensor(t)} \
        == {"cpu"}
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


def test_the_stop_recorder_takes_the_signals_back_from_whatever_replaced_it():
    """What ``ray.init`` does to a run's stop handler: replaced by another, the recorder is set
    again by a second install (or reclaim, which leaves a process that never installed it
    alone); signals sent while they are blocked are recorded when the block ends; restore puts
    back the handlers of before the first install."""
    from gmc.rundir import StopRequests

    stop = StopRequests()

    def original(signum, frame):
        pass

    def rays(signum, frame):
        raise AssertionError("the replacing handler ran")

    before = {s: signal.signal(s, original) for s in stop.SIGNALS}
    try:
        stop.reclaim()
        assert all(signal.getsignal(s) is original for s in stop.SIGNALS)
        stop.install()
        signal.signal(signal.SIGTERM, rays)
        stop.reclaim()
        with stop.blocked():  # sent to this thread (to the process, another thread may take it)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            time.sleep(0.05)
            assert stop.received == []
        deadline = time.time() + 5
        while len(stop.received) < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert sorted(stop.received) == sorted(stop.SIGNALS)
        stop.install()
        stop.restore()
        assert all(signal.getsignal(s) is original for s in stop.SIGNALS) and not stop.received
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


# ---------------------------------------------------------------------------------------------
# 4. weights that are not finite are never checkpointed


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


# ---------------------------------------------------------------------------------------------
# 8. leftovers of interrupted writes are removed by the next owner


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


# ---------------------------------------------------------------------------------------------
# 5. nonsense values are refused, naming the key and where it came from


@pytest.mark.parametrize("item, key", [
    ("max_grad_norm=-1", "max_grad_norm"),
    ("max_grad_norm=0", "max_grad_norm"),
    ("sampling.temperature=.nan", "sampling.temperature"),
    ("sampling.temperature=0", "sampling.temperature"),
    ("sampling.temperature=11", "sampling.temperature"),
    ("seed=-1", "seed"),
    ("logprob_chunk_size=0", "logprob_chunk_size"),
    ("lr=.nan", "lr"),
    ("lr=.inf", "lr"),
    ("weight_decay=.nan", "weight_decay"),
    ("weight_decay=-0.1", "weight_decay"),
    ("warmup_steps=-1", "warmup_steps"),
    ("estimator.is_log_ratio_clamp=.nan", "estimator"),
    ("delay.beta=.nan", "delay"),
])
def test_nonsense_values_are_refused_naming_the_key(tmp_path, item, key):
    config = tmp_path / "c.yaml"
    config.write_text("steps: 10\n")
    with pytest.raises(ConfigError, match=rf"^--set {re.escape(item)}: .*{re.escape(key)}"):
        load_train_config(config, [item])


def test_bad_values_in_the_file_are_blamed_on_the_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("seed: -1\nmax_grad_norm: -1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: seed"):
        load_train_config(config, ["lr=1e-4"])
    with pytest.raises(ConfigError, match=r"c\.yaml: max_grad_norm"):
        load_train_config(config, ["seed=0"])  # fixes one value; the file's other is still bad
    with pytest.raises(ConfigError, match=r"^--set max_grad_norm=-2: max_grad_norm"):
        load_train_config(config, ["seed=0", "max_grad_norm=-2"])
    with pytest.raises(ConfigError, match=r"--set lr=\[1: invalid YAML"):
        load_train_config(config, ["lr=[1"])
    with pytest.raises(ConfigError, match=r"--set seed.x=1: seed is not a mapping"):
        load_train_config(config, ["seed.x=1"])


def test_evaluation_values_are_checked_up_front():
    from gmc.evaluate import EvalConfig

    assert load_config(EvalConfig, None, ["temperature=0"]).temperature == 0  # greedy sampling is legal here
    for item, key in [("limit=-195", "limit"), ("limit=0", "limit"), ("temperature=.nan", "temperature"),
                      ("benchmarks=[math500, gsm9k]", "benchmarks"), ("samples={math500: -1}", "samples"),
                      ("top_p=0", "top_p"), ("max_new_tokens=0", "max_new_tokens"), ("seed=-1", "seed")]:
        with pytest.raises(ConfigError, match=rf"^--set {re.escape(item)}: {key}"):
            load_config(EvalConfig, None, [item])


# ---------------------------------------------------------------------------------------------
# 6. grading cannot crash or stall


HOSTILE = {
    "newlines": "\n" * 1_000_000,
    "unbalanced boxes": "\\boxed{" * 20_000,
    "nested braces": "\\boxed{" + "{" * 50_000 + "}" * 49_999,
    "phrase then spaces": "the answer is x" + " " * 200_000 + "y",
    "answer line then spaces": "Answer: x" + " " * 200_000 + "y",
    "many phrases": "the answer is $5$ so " * 50_000,
    "nested bold": "\\boxed{" + "\\mathbf{" * 5_000 + "1" + "}" * 5_001,
}


@pytest.mark.parametrize("name", HOSTILE)
def test_answer_extraction_is_linear_time(name):
    from gmc.answers import extract_answer

    start = time.perf_counter()
    extract_answer(HOSTILE[name])
    assert time.perf_counter() - start < 1.0  # a backtracking extraction took 10 s and 5.7 s here


def test_extraction_keeps_its_meaning():
    from gmc.answers import extract_answer

    assert extract_answer("The answer is 3.5.") == "3.5"  # a decimal point does not end the answer
    assert extract_answer("The answer is 5. The final answer is 6.") == "6"
    assert extract_answer("the final answer is $5$ dollars") is None
    assert extract_answer("The final answer is:\n\n42") == "42"
    assert extract_answer("x\n  **Answer**: $7$ .\n") == "7"


def test_long_integers_and_hostile_text_grade_without_crashing():
    from gmc.rewards import Grader

    big = "9" * 5_000  # past Python's 4,300-digit int conversion limit
    completions = [f"\\boxed{{{big}}}", f"\\boxed{{0{big}}}", f"\\boxed{{{big[:-1]}8}}", "\\boxed{" + "x+" * 2_000 + "1}",
                   *HOSTILE.values()]
    golds = [big, big, big, "1", *["1"] * len(HOSTILE)]
    with Grader(workers=2, timeout=1.0) as grader:
        start = time.perf_counter()
        grades = grader.grade_batch(completions, golds)
        elapsed = time.perf_counter() - start
    assert [g.reason for g in grades[:4]] == ["ok", "ok", "wrong", "too_long"]
    assert all(g.reason in ("no_answer", "wrong", "parse_error", "timeout", "too_long") for g in grades[4:])
    assert elapsed < 30


# ---------------------------------------------------------------------------------------------
# 7. bad data and model folders are caught before the model loads


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr("gmc.trainer.load_policy", refuse)
    monkeypatch.setattr("gmc.policy.load_policy", refuse)


@pytest.mark.parametrize("line, message", [
    (b'{"problem": "1+1", "answer": "2\xff"}', r"train\.jsonl:2: not UTF-8 text \(byte 0xff\)"),
    (b'{"problem": "1+1", "answer": true}', r"train\.jsonl:2: field 'answer' must be text"),
    (b'{"problem": "1+1", "answer": {"a": 1}}', r"train\.jsonl:2: field 'answer' must be text"),
    (b'{"problem": 7, "answer": "2"}', r"train\.jsonl:2: field 'problem' must be text"),
])
def test_bad_training_data_is_named_before_the_model_loads(tmp_path, small, no_model_load, line, message):
    from gmc.data import DataError

    data = tmp_path / "train.jsonl"
    data.write_bytes(b'{"problem": "2+2", "answer": "4"}\n' + line + b"\n")
    with pytest.raises(DataError, match=message):
        Trainer(small(train_data=str(data)), tmp_path / "run", progress=False)
    RunDir(tmp_path / "run").acquire()  # the failed start released the lock


def test_long_integer_answers_load_as_text(tmp_path):
    from gmc.data import load_file

    big = "1" + "0" * 4_999
    data = tmp_path / "train.jsonl"
    data.write_text(f'{{"problem": "p", "answer": {big}}}\n{{"problem": "q", "answer": "000{big}"}}\n')
    assert [r.answer for r in load_file(data)] == [big, big]


def test_model_folders_are_checked_before_loading(tmp_path, tiny_model_dir):
    from gmc.policy import load_policy
    from gmc.preflight import ModelFolderError

    def broken(name, damage):
        folder = tmp_path / name
        shutil.copytree(tiny_model_dir, folder)
        damage(folder)
        return str(folder)

    no_tokenizer = broken("no_tokenizer", lambda f: (f / "tokenizer.json").unlink())
    with pytest.raises(ModelFolderError, match="lacks a tokenizer"):
        load_policy(no_tokenizer, device="cpu")

    def truncate(folder):
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-1000])

    with pytest.raises(ModelFolderError, match=r"model\.safetensors: incomplete safetensors file"):
        load_policy(broken("half_written", truncate), device="cpu")
    with pytest.raises(ModelFolderError, match=r"lacks config\.json; weights"):
        load_policy(broken("empty", lambda f: [p.unlink() for p in f.iterdir() if not p.name.startswith("tok")]),
                    device="cpu")
    with pytest.raises(ModelFolderError, match="not found"):
        load_policy(str(tmp_path / "nowhere" / "tiny"), device="cpu")


def test_evaluation_data_is_checked_before_the_model_loads(tmp_path, no_model_load):
    from gmc.data import DataError
    from gmc.evaluate import EvalConfig, evaluate

    bench = tmp_path / "data" / "benchmarks" / "aime24"
    bench.mkdir(parents=True)
    (bench / "test.jsonl").write_bytes(b'{"problem": "p", "answer": "1"}\n{"problem": "q", "answer": null}\n')
    cfg = EvalConfig(benchmarks=("synthetic", "aime24"), data_root=str(tmp_path / "data"), limit=1)
    with pytest.raises(DataError, match=r"aime24/test\.jsonl:2: missing or empty field 'answer'"):
        evaluate("unused", tmp_path / "eval", cfg, progress=False)
