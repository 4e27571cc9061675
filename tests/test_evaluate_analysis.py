"""Evaluation statistics and the tables built from run directories."""

import json
import math

import pandas as pd
import pytest

from gmc.analysis import collect, parse_point, to_latex, to_markdown, write_tables
from gmc.evaluate import EvalConfig, evaluate, pass_at_k, summarize


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


def test_evaluate_on_a_real_benchmark(tmp_path, tiny_model_dir, shared_data):
    cfg = EvalConfig(benchmarks=("aime25",), samples={"aime25": 1}, limit=3, max_new_tokens=8,
                     data_root=str(shared_data), greedy=False)
    s = evaluate(str(tiny_model_dir), tmp_path, cfg, progress=False)["aime25"]
    assert s["problems"] == 3 and "greedy" not in s


def fake_run(results, algo, delay, group, seed, reward, score):
    d = results / "train" / f"algo~{algo}" / f"delay~{delay}" / f"group~{group}" / f"seed~{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"steps": 10, "rollout/reward_mean_last20": reward,
                                                "ratio/ess_frac": 0.9}))
    e = results / "eval" / f"algo~{algo}" / f"delay~{delay}" / f"group~{group}" / f"seed~{seed}"
    e.mkdir(parents=True)
    (e / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": score, "pass_at_1": score / 2}))


def test_tables_aggregate_seeds(tmp_path):
    r = tmp_path / "results"
    fake_run(r, "gmc", 16, 8, 0, 0.5, 0.4)
    fake_run(r, "gmc", 16, 8, 1, 0.7, 0.6)
    fake_run(r, "grpo", 0, 8, 0, 0.3, 0.2)
    fake_run(r, "grpo", "latency", 8, 0, 0.1, 0.1)
    frame = collect(r)
    assert list(frame["delay"]) == ["16", "16", "0", "latency"]
    tables = write_tables(r)
    main = tables["main"]
    row = main[(main.algorithm == "gmc")].iloc[0]
    assert row["rollout/reward_mean_last20:mean"] == pytest.approx(0.6)
    assert row["rollout/reward_mean_last20:std"] == pytest.approx(pd.Series([0.5, 0.7]).std())
    assert row["eval/mean/greedy:mean"] == pytest.approx(0.5) and row["n_seeds"] == 2
    md = to_markdown(main)
    assert "0.600 ± 0.141" in md and "synthetic Pass@1" in md
    assert r"$\pm$" in to_latex(main)
    assert (r / "tables" / "main.csv").exists() and (r / "tables" / "diagnostics.tex").exists()


def test_parse_point_and_missing_runs(tmp_path):
    assert parse_point("results/train/algo~gmc/delay~latency/group~8/seed~2") == {
        "algorithm": "gmc", "delay": "latency", "group": 8, "seed": 2}
    assert parse_point("results/train/other") is None
    with pytest.raises(FileNotFoundError, match="no finished runs"):
        collect(tmp_path)
