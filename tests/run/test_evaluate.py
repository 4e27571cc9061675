"""Evaluation: pass@k and its standard error by hand, the files an evaluation writes (alone or
in a training job), and bad evaluation settings and data refused before the model loads."""

import json
import math
import re

import pytest
import yaml

from gmc.run.config import ConfigError, load_config
from gmc.run.evaluate import EvalConfig, evaluate, pass_at_k, summarize


def test_evaluation_values_are_checked_up_front():
    from gmc.run.evaluate import EvalConfig

    assert load_config(EvalConfig, None, ["temperature=0"]).temperature == 0  # greedy sampling is legal here
    for item, key in [
        ("limit=-195", "limit"),
        ("limit=0", "limit"),
        ("temperature=.nan", "temperature"),
        ("benchmarks=[math500, gsm9k]", "benchmarks"),
        ("samples={math500: -1}", "samples"),
        ("top_p=0", "top_p"),
        ("max_new_tokens=0", "max_new_tokens"),
        ("seed=-1", "seed"),
    ]:
        with pytest.raises(ConfigError, match=rf"^--set {re.escape(item)}: {key}"):
            load_config(EvalConfig, None, [item])


def test_evaluation_data_is_checked_before_the_model_loads(tmp_path, no_model_load):
    from gmc.run.evaluate import EvalConfig, evaluate
    from gmc.tasks.datasets import DataError

    bench = tmp_path / "data" / "benchmarks" / "aime24"
    bench.mkdir(parents=True)
    (bench / "test.jsonl").write_bytes(b'{"problem": "p", "answer": "1"}\n{"problem": "q", "answer": null}\n')
    cfg = EvalConfig(benchmarks=("synthetic", "aime24"), data_root=str(tmp_path / "data"), limit=1)
    with pytest.raises(DataError, match=r"aime24/test\.jsonl:2: missing or empty field 'answer'"):
        evaluate("unused", tmp_path / "eval", cfg, progress=False)


SMALL_TRAIN = dict(device="cpu", steps=2, group_size=2, prompts_per_step=2, checkpoint_every=0, seed=0)
"""A two-step training run of the tiny model, as a config file holds it."""


def test_pass_at_k_hand_computed():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_summarize_pass_at_1_and_standard_error():
    s = summarize("x", ["1", "2", "3"], [True, False, True], [[True, False], [False, False], [True, True]])
    assert s["greedy"] == pytest.approx(2 / 3)
    assert s["pass_at_1"] == pytest.approx(0.5)
    per = [0.5, 0.0, 1.0]
    se = math.sqrt(sum((p - 0.5) ** 2 for p in per) / 2 / 3)
    assert s["pass_at_1_se"] == pytest.approx(se)
    assert s["pass_at_k"]["2"] == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    # per problem, what the scores average, for pairing two evaluations problem by problem
    assert s["per_problem"] == {"greedy": [1, 0, 1], "correct": [1, 0, 2]} and "problems_sha256" not in s
    named = summarize("x", ["1", "2", "3"], None, [[True], [False], [True]], ids=["a", "b", "c"])
    assert named["per_problem"] == {"correct": [1, 0, 1]} and len(named["problems_sha256"]) == 16


def test_evaluate_writes_summary_and_completions(tmp_path, tiny_model_dir):
    cfg = EvalConfig(benchmarks=("synthetic",), samples={"synthetic": 2}, synthetic_problems=6, max_new_tokens=24)
    out = evaluate(str(tiny_model_dir), tmp_path, cfg, progress=False)
    s = json.loads((tmp_path / "synthetic.json").read_text())
    assert s == json.loads(json.dumps(out["synthetic"]))
    assert s["problems"] == 6 and s["k"] == 2 and 0 <= s["pass_at_1"] <= 1
    rows = [json.loads(line) for line in (tmp_path / "synthetic.completions.jsonl").read_text().splitlines()]
    assert len(rows) == 6 + 12 and {r["mode"] for r in rows} == {"greedy", "sample"}
    greedy = [r for r in rows if r["mode"] == "greedy"]
    assert s["greedy"] == pytest.approx(sum(r["correct"] for r in greedy) / 6)


def test_a_training_job_that_evaluates_writes_what_an_evaluation_job_writes(tmp_path, tiny_model_dir):
    """``gmc train --evaluate`` (resources.eval_with_training) and ``gmc evaluate`` on the model it
    trained: the same function on the same weights, so the same scores and completions."""

    from gmc.cli import main
    from gmc.settings import to_dict

    train_cfg, eval_cfg = tmp_path / "train.yaml", tmp_path / "eval.yaml"
    train_cfg.write_text(yaml.safe_dump({"model": str(tiny_model_dir), **SMALL_TRAIN}))
    eval_cfg.write_text(
        yaml.safe_dump(
            to_dict(
                EvalConfig(
                    benchmarks=("synthetic",),
                    samples={"synthetic": 2},
                    synthetic_problems=6,
                    max_new_tokens=12,
                    device="cpu",
                )
            )
        )
    )
    run = tmp_path / "run"
    assert main(
        [
            "train",
            "--config",
            str(train_cfg),
            "--out",
            str(run),
            "--evaluate",
            str(eval_cfg),
            "--eval-out",
            str(tmp_path / "in_job"),
        ]
    ) in (0, None)
    assert main(
        ["evaluate", "--model", str(run / "model"), "--out", str(tmp_path / "own_job"), "--config", str(eval_cfg)]
    ) in (0, None)
    for name in ("synthetic.completions.jsonl", "eval_config.json"):
        assert (tmp_path / "in_job" / name).read_text() == (tmp_path / "own_job" / name).read_text()
    in_job, own_job = (json.loads((tmp_path / d / "synthetic.json").read_text()) for d in ("in_job", "own_job"))
    assert {k: v for k, v in in_job.items() if k != "seconds"} == {k: v for k, v in own_job.items() if k != "seconds"}


def test_a_bad_evaluation_config_stops_a_training_job_before_it_trains(tmp_path, tiny_model_dir, capsys):

    from gmc.cli import main

    train_cfg, eval_cfg = tmp_path / "train.yaml", tmp_path / "eval.yaml"
    train_cfg.write_text(yaml.safe_dump({"model": str(tiny_model_dir), **SMALL_TRAIN}))
    eval_cfg.write_text("temprature: 0.6\n")
    assert (
        main(
            [
                "train",
                "--config",
                str(train_cfg),
                "--out",
                str(tmp_path / "run"),
                "--evaluate",
                str(eval_cfg),
                "--eval-out",
                str(tmp_path / "eval"),
            ]
        )
        != 0
    )
    assert "temprature" in capsys.readouterr().err and not (tmp_path / "run").exists()
    assert main(["train", "--config", str(train_cfg), "--out", str(tmp_path / "run"), "--evaluate", str(eval_cfg)]) == 1
    assert "go together" in capsys.readouterr().err


def test_evaluate_on_a_real_benchmark(tmp_path, tiny_model_dir, shared_data):
    cfg = EvalConfig(
        benchmarks=("aime25",),
        samples={"aime25": 1},
        limit=3,
        max_new_tokens=8,
        data_root=str(shared_data),
        greedy=False,
    )
    s = evaluate(str(tiny_model_dir), tmp_path, cfg, progress=False)["aime25"]
    assert s["problems"] == 3 and "greedy" not in s
