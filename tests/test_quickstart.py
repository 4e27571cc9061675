"""``gmc quickstart``: every step makes what it prints, the data root's absence is explained, an
earlier quick start is never overwritten, and a command run by hand uses one thread unless
``OMP_NUM_THREADS`` says otherwise."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

import gmc.quickstart as qs
from gmc.settings import ConfigError


@pytest.fixture
def small(monkeypatch):
    """The quick start at a few steps of everything (seconds)."""
    monkeypatch.setattr(qs, "QUICK_MODEL", {"max_steps": 4, "eval_every": 4, "eval_problems": 4, "batch_size": 8})
    monkeypatch.setattr(qs, "QUICK_RUN", {**qs.QUICK_RUN, "steps": 3, "prompts_per_step": 2, "group_size": 4})
    monkeypatch.setattr(qs, "QUICK_EVAL", {**qs.QUICK_EVAL, "synthetic_problems": 4, "samples": {"synthetic": 1}})
    monkeypatch.setattr(qs, "WINDOW", 1)


def test_the_quick_start_makes_what_it_prints(tmp_path, small, capsys):
    out = tmp_path / "qs"
    qs.quickstart(out, REPO / "published" / "default", data_root=tmp_path / "nodata")
    printed = capsys.readouterr().out
    assert f"no data at {tmp_path / 'nodata'}" in printed and "GMC_DATA_ROOT" in printed
    assert "gmc prepare-data --source hub" in printed
    assert (out / "figures" / "score_vs_delay.png").stat().st_size > 10_000
    assert json.loads((out / "model" / "build_summary.json").read_text())["steps"] == 4
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["async/staleness_mean"] > 0  # a fixed delay of 2
    for side in ("base", "trained"):
        scores = json.loads((out / "eval" / side / "synthetic.json").read_text())
        assert 0 <= scores["greedy"] <= 1
    assert f"gmc train --config {out / 'train.yaml'} --out {out / 'run'}" in printed
    assert f"gmc evaluate --model {out / 'model'}" in printed
    with pytest.raises(ConfigError, match="holds files already"):  # nothing of it overwritten
        qs.quickstart(out, REPO / "published" / "default")


def test_the_data_step_checks_the_data_root_and_writes_its_manifest(tmp_path, shared_data, capsys):
    qs.check_data(str(shared_data), tmp_path)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["sets"]["math500"]["rows"] == 500
    assert "math500 500" in capsys.readouterr().out


def test_a_missing_bundle_is_named_and_skipped(tmp_path, capsys):
    qs.redraw_published(tmp_path / "nobundle", tmp_path)
    assert f"no published bundle at {tmp_path / 'nobundle'}" in capsys.readouterr().out
    assert not (tmp_path / "figures").exists()


@pytest.mark.parametrize("given, threads", [(None, 1), ("2", 2)])
def test_a_command_run_by_hand_uses_one_thread_unless_told(tmp_path, given, threads):
    """torch reads OMP_NUM_THREADS once, when it is imported: gmc sets it first (its default,
    torch's own, is the number of cores)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | (
        {"OMP_NUM_THREADS": given} if given else {}
    )
    code = (
        "import sys; from gmc.cli import main; status = main(['quickstart', '--out', sys.argv[1]]); "
        "import torch; print(status, torch.get_num_threads())"
    )
    done = subprocess.run([sys.executable, "-c", code, str(REPO)], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", str(threads)], done.stderr
