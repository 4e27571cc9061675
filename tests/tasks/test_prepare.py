"""Data preparation: the data root, the offline check and manifest (on the offline copy), and
the hub path's conversion (on locally built ``datasets.Dataset`` objects; no network)."""

import hashlib
import json
import shutil

import pytest
from helpers import REPO

from gmc.cli import main
from gmc.tasks.datasets import (
    BENCHMARKS,
    DEFAULT_DATA_ROOT,
    TRAIN_SETS,
    DataError,
    data_root,
    load_dataset,
)
from gmc.tasks.prepare import check_manifest, download, prepare, registered

ROWS = {
    "math": 7470,
    "math500": 500,
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "minerva_math": 272,
    "olympiadbench": 675,
}
"""Row counts of the offline copy (its README)."""


def test_data_root_is_the_repository_data_folder_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv("GMC_DATA_ROOT", raising=False)
    assert data_root() == DEFAULT_DATA_ROOT == REPO / "data"
    monkeypatch.setenv("GMC_DATA_ROOT", str(tmp_path))
    assert data_root() == tmp_path
    assert data_root(tmp_path / "x") == tmp_path / "x"
    assert "/data/" in (REPO / ".gitignore").read_text()


def test_registered_sets_are_the_training_split_and_six_benchmarks():
    assert registered() == ["math", *BENCHMARKS] and len(BENCHMARKS) == 6


def test_offline_check_writes_a_manifest_of_rows_sizes_and_checksums(shared_data, tmp_path, capsys):
    out = tmp_path / "manifest.json"
    assert main(["prepare-data", "--data-root", str(shared_data), "--out", str(out)]) == 0
    manifest = json.loads(out.read_text())
    assert manifest["source"] == "local" and sorted(manifest["sets"]) == sorted(registered())
    for name, entry in manifest["sets"].items():
        path = shared_data / entry["file"]
        assert entry["rows"] == ROWS[name]
        assert entry["bytes"] == path.stat().st_size
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # the same folder checks against its own manifest
    assert (
        main(
            [
                "prepare-data",
                "--data-root",
                str(shared_data),
                "--benchmarks",
                "aime24",
                "--check",
                str(out),
                "--out",
                str(tmp_path / "again.json"),
            ]
        )
        == 0
    )


def test_check_names_the_file_that_changed(shared_data, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(shared_data / "benchmarks" / "aime25", copy / "benchmarks" / "aime25")
    manifest = prepare(["aime25"], copy)
    path = copy / "benchmarks" / "aime25" / "test.jsonl"
    path.write_text(path.read_text().replace('"answer": 70', '"answer": 71', 1))
    with pytest.raises(DataError, match=r"aime25/test.jsonl: sha256 .* differs"):
        check_manifest(manifest, copy)


def test_a_bad_row_fails_naming_file_and_line(tmp_path):
    path = tmp_path / "benchmarks" / "amc23" / "test.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"problem": "1+1?", "answer": 2}\n{"problem": "no answer"}\n')
    with pytest.raises(DataError, match=r"amc23/test.jsonl:2: missing or empty field 'answer'"):
        prepare(["amc23"], tmp_path)
    with pytest.raises(DataError, match="file not found .*GMC_DATA_ROOT"):
        prepare(["aime24"], tmp_path)


def test_synthetic_and_training_files_by_path(tmp_path):
    train = tmp_path / "mine.jsonl"
    train.write_text('{"problem": "2+2?", "answer": "4"}\n')
    manifest = prepare(["synthetic", str(train)], tmp_path)
    assert manifest["sets"]["synthetic"] == {"generated": True}
    assert manifest["sets"][str(train)]["rows"] == 1


def _hub_copies():
    datasets = pytest.importorskip("datasets")
    return {
        # MATH train: no answer field; the answer is the last \boxed{} of the solution
        "math": datasets.Dataset.from_list(
            [
                {
                    "problem": "What is $1+1$?",
                    "solution": "Add: $1+1=\\boxed{2}$.",
                    "level": "Level 1",
                    "type": "Algebra",
                },
                {
                    "problem": "Simplify $\\frac{2}{4}$.",
                    "solution": "It is $\\boxed{\\frac{1}{2}}$.",
                    "level": "Level 2",
                    "type": "Prealgebra",
                },
            ]
        ),
        # AMC 2023: problem under `question`, float answers
        "amc23": datasets.Dataset.from_list([{"id": 0, "question": "How many?", "answer": 27.0}]),
        # OlympiadBench: `question` and a `final_answer` list
        "olympiadbench": datasets.Dataset.from_list(
            [{"id": 1606, "question": "Find x and y.", "final_answer": ["$69$,$84$"], "solution": ["..."]}]
        ),
    }


def test_hub_rows_become_the_local_layout(tmp_path):
    for name, ds in _hub_copies().items():
        path = download(name, tmp_path, rows=ds)
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert all({"problem", "answer"} <= set(r) for r in rows)
    assert [r.answer for r in load_dataset("math", root=tmp_path)] == ["2", "\\frac{1}{2}"]
    amc = load_dataset("amc23", root=tmp_path)
    assert (amc[0].problem, amc[0].answer, amc[0].id) == ("How many?", "27", "0")
    olympiad = load_dataset("olympiadbench", root=tmp_path)
    assert (olympiad[0].answer, olympiad[0].id) == ("69,84", "1606")


def test_prepare_from_the_hub_downloads_then_checks(tmp_path, monkeypatch):
    """The whole ``--source hub`` path, with the hub replaced by the local copies above."""
    import datasets

    copies = _hub_copies()
    names = {spec.hub_id: name for name, spec in {**TRAIN_SETS, **BENCHMARKS}.items()}
    monkeypatch.setattr(datasets, "load_dataset", lambda hub_id, config, split: copies[names[hub_id]])
    out = tmp_path / "data"
    assert (
        main(
            [
                "prepare-data",
                "--source",
                "hub",
                "--data-root",
                str(out),
                "--train",
                "math",
                "--benchmarks",
                "amc23",
                "olympiadbench",
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert {n: e["rows"] for n, e in manifest["sets"].items()} == {"math": 2, "amc23": 1, "olympiadbench": 1}
    assert manifest["sets"]["math"]["file"] == "train/math/train.jsonl"
    # and the folder then checks offline against that manifest
    check_manifest(manifest, out)


def test_data_tests_skip_naming_the_variable_without_data(tmp_path):
    """A clone without the offline copy: the tests that need it skip and say what to set."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "GMC_DATA_ROOT": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            f"{REPO}/tests/tasks/test_datasets.py::test_gold_answers_are_normalised",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "1 skipped" in out.stdout, out.stdout[-2000:]
    assert f"GMC_DATA_ROOT={tmp_path} has no benchmarks/" in out.stdout
