"""Evaluation statistics and the tables built from run directories."""

import json
import math
import shutil

import pandas as pd
import pytest

from gmc.analysis import base_scores, collect, parse_point, to_latex, to_markdown, write_tables
from gmc.evaluate import EvalConfig, evaluate, pass_at_k, summarize
from gmc.stats import mean_interval

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
    import yaml

    from gmc.cli import main
    from gmc.settings import to_dict

    train_cfg, eval_cfg = tmp_path / "train.yaml", tmp_path / "eval.yaml"
    train_cfg.write_text(yaml.safe_dump({"model": str(tiny_model_dir), **SMALL_TRAIN}))
    eval_cfg.write_text(yaml.safe_dump(to_dict(EvalConfig(benchmarks=("synthetic",), samples={"synthetic": 2},
                                                          synthetic_problems=6, max_new_tokens=12, device="cpu"))))
    run = tmp_path / "run"
    assert main(["train", "--config", str(train_cfg), "--out", str(run), "--evaluate", str(eval_cfg),
                 "--eval-out", str(tmp_path / "in_job")]) in (0, None)
    assert main(["evaluate", "--model", str(run / "model"), "--out", str(tmp_path / "own_job"),
                 "--config", str(eval_cfg)]) in (0, None)
    for name in ("synthetic.completions.jsonl", "eval_config.json"):
        assert (tmp_path / "in_job" / name).read_text() == (tmp_path / "own_job" / name).read_text()
    in_job, own_job = (json.loads((tmp_path / d / "synthetic.json").read_text()) for d in ("in_job", "own_job"))
    assert {k: v for k, v in in_job.items() if k != "seconds"} == {k: v for k, v in own_job.items() if k != "seconds"}


def test_a_bad_evaluation_config_stops_a_training_job_before_it_trains(tmp_path, tiny_model_dir, capsys):
    import yaml

    from gmc.cli import main

    train_cfg, eval_cfg = tmp_path / "train.yaml", tmp_path / "eval.yaml"
    train_cfg.write_text(yaml.safe_dump({"model": str(tiny_model_dir), **SMALL_TRAIN}))
    eval_cfg.write_text("temprature: 0.6\n")
    assert main(["train", "--config", str(train_cfg), "--out", str(tmp_path / "run"), "--evaluate", str(eval_cfg),
                 "--eval-out", str(tmp_path / "eval")]) != 0
    assert "temprature" in capsys.readouterr().err and not (tmp_path / "run").exists()
    with pytest.raises(SystemExit, match="go together"):
        main(["train", "--config", str(train_cfg), "--out", str(tmp_path / "run"), "--evaluate", str(eval_cfg)])


def test_evaluate_on_a_real_benchmark(tmp_path, tiny_model_dir, shared_data):
    cfg = EvalConfig(benchmarks=("aime25",), samples={"aime25": 1}, limit=3, max_new_tokens=8,
                     data_root=str(shared_data), greedy=False)
    s = evaluate(str(tiny_model_dir), tmp_path, cfg, progress=False)["aime25"]
    assert s["problems"] == 3 and "greedy" not in s


def fake_run(results, algo, delay, group, seed, reward, score, se=None):
    d = results / "train" / f"algo~{algo}" / f"delay~{delay}" / f"group~{group}" / f"seed~{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"steps": 10, "rollout/reward_mean_last20": reward,
                                                "ratio/ess_frac": 0.9}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": t, "rollout/reward_mean": reward + 0.01 * t}) + "\n"
                                             for t in range(12)))
    e = results / "eval" / f"algo~{algo}" / f"delay~{delay}" / f"group~{group}" / f"seed~{seed}"
    e.mkdir(parents=True)
    ev = {"benchmark": "synthetic", "greedy": score, "pass_at_1": score / 2, "problems": 101}
    if se is not None:
        ev["pass_at_1_se"] = se
    (e / "synthetic.json").write_text(json.dumps(ev))


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
    sd = pd.Series([0.5, 0.7]).std()
    assert row["rollout/reward_mean_last20:std"] == pytest.approx(sd)
    assert row["rollout/reward_mean_last20:half"] == pytest.approx(12.7062047 * sd / math.sqrt(2))
    assert row["eval/mean/greedy:mean"] == pytest.approx(0.5) and row["n_seeds"] == 2
    # greedy: binomial standard error over the 101 problems, folded into the interval
    se = [math.sqrt(p * (1 - p) / 100) for p in (0.4, 0.6)]
    half = 12.7062047 * math.sqrt((sd**2 + (se[0] ** 2 + se[1] ** 2) / 2) / 2)
    assert row["eval/synthetic/greedy:half"] == pytest.approx(half)
    assert row["eval/mean/greedy:half"] == pytest.approx(half)
    md = to_markdown(main)
    assert "0.600 ± 1.271" in md and "synthetic Pass@1" in md
    grpo = main[main.algorithm == "grpo"].iloc[0]  # one seed: a mean, no interval
    assert grpo["n_seeds"] == 1 and math.isnan(grpo["eval/synthetic/pass_at_1:half"])
    assert r"$\pm$" in to_latex(main)
    assert (r / "tables" / "main.csv").exists() and (r / "tables" / "diagnostics.tex").exists()


def test_a_base_model_per_seed_gives_the_base_row_an_interval(tmp_path):
    r = tmp_path / "results"
    fake_run(r, "gmc", 0, 8, 0, 0.5, 0.4)
    for seed, score in enumerate((0.30, 0.36, 0.42)):
        d = r / "eval" / "base" / f"seed~{seed}"
        d.mkdir(parents=True)
        (d / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": score, "problems": 101}))
    assert list(base_scores(r)["seed"]) == [0, 1, 2]
    base = write_tables(r)["main"].iloc[0]
    assert base["algorithm"] == "base" and base["n_seeds"] == 3
    se = [math.sqrt(p * (1 - p) / 100) for p in (0.30, 0.36, 0.42)]
    half = 4.30265273 * math.sqrt((0.06**2 + sum(x**2 for x in se) / 3) / 3)
    assert base["eval/synthetic/greedy:mean"] == pytest.approx(0.36)
    assert base["eval/synthetic/greedy:half"] == pytest.approx(half)
    runs = write_tables(r)["runs"]  # what the interval is made of: one row per seed, base models first
    assert [(a, s) for a, s in zip(runs["algorithm"], runs["seed"])] == [("base", 0), ("base", 1), ("base", 2),
                                                                         ("gmc", 0)]
    assert list(runs["eval/synthetic/greedy"]) == pytest.approx([0.30, 0.36, 0.42, 0.4])
    assert "| base | - | 0 | 1 | - | 0.360 | - | 0.360 | - |" in (r / "tables" / "runs.md").read_text()
    # one base model for every seed (a hub model): one row, no interval
    shutil.rmtree(r / "eval" / "base")
    (r / "eval" / "base").mkdir()
    (r / "eval" / "base" / "synthetic.json").write_text(json.dumps({"benchmark": "synthetic", "greedy": 0.3,
                                                                    "problems": 101}))
    base = write_tables(r)["main"].iloc[0]
    assert base["algorithm"] == "base" and base["n_seeds"] == 1 and math.isnan(base["eval/synthetic/greedy:half"])


def test_a_shared_run_appears_under_both_names_and_differs_from_itself_by_exactly_zero(tmp_path):
    r = tmp_path / "results"
    for seed, score in enumerate((0.40, 0.55, 0.47)):
        fake_run(r, "gmc", 0, 8, seed, score, score, se=0.02)
        tic = r / "train" / "algo~tic" / "delay~0" / "group~8" / f"seed~{seed}"
        tic.mkdir(parents=True)
        (tic / "shared.json").write_text(json.dumps({"run": f"algo~gmc/delay~0/group~8/seed~{seed}"}))
    frame = collect(r)
    assert sorted(frame["algorithm"]) == ["gmc"] * 3 + ["tic"] * 3
    assert set(frame.loc[frame.algorithm == "tic", "shared_with"]) == {"gmc"}
    tables = write_tables(r)
    row = tables["paired"][(tables["paired"].comparison == "gmc − tic")
                           & (tables["paired"].metric == "eval/synthetic/pass_at_1")].iloc[0]
    assert row["diff"] == 0 and row["half"] == 0  # one evaluation: no evaluation noise between them
    assert "tic (run of gmc)" in (r / "tables" / "main.md").read_text()


def test_parse_point_and_missing_runs(tmp_path):
    assert parse_point("results/train/algo~gmc/delay~latency/group~8/seed~2") == {
        "algorithm": "gmc", "delay": "latency", "group": 8, "seed": 2}
    assert parse_point("results/train/other") is None
    with pytest.raises(FileNotFoundError, match="no finished runs"):
        collect(tmp_path)


def test_paired_differences_at_equal_delay_group_and_seed(tmp_path):
    r = tmp_path / "results"
    for seed, (g, t, p) in enumerate([(0.70, 0.50, 0.60), (0.72, 0.56, 0.74), (0.74, 0.52, 0.62)]):
        fake_run(r, "gmc", 16, 8, seed, 0.5, g, se=0.02)
        fake_run(r, "tic", 16, 8, seed, 0.5, t, se=0.02)
        fake_run(r, "grpo", 16, 8, seed, 0.5, p, se=0.02)
    fake_run(r, "gmc", 0, 8, 1, 0.5, 0.9)  # on-policy partner of gmc's seed 1 only
    fake_run(r, "tic", 16, 4, 0, 0.5, 0.7)  # no partner: skipped
    paired = write_tables(r)["paired"]
    assert list(dict.fromkeys(paired["comparison"])) == ["gmc − tic", "gmc − grpo", "tic − grpo",
                                                         "gmc: stale − on-policy"]
    assert set(zip(paired["delay"], paired["group"])) == {("16", 8)}
    stale = paired[(paired.comparison == "gmc: stale − on-policy") & (paired.metric == "eval/synthetic/pass_at_1")]
    assert len(stale) == 1 and stale.iloc[0]["n_seeds"] == 1  # seed 1 alone is paired
    assert stale.iloc[0]["diff"] == pytest.approx((0.72 - 0.9) / 2)
    row = paired[(paired.comparison == "tic − grpo") & (paired.metric == "eval/synthetic/pass_at_1")].iloc[0]
    assert row["diff"] == pytest.approx(((0.50 - 0.60) + (0.56 - 0.74) + (0.52 - 0.62)) / 6)
    row = paired[(paired.comparison == "gmc − tic") & (paired.metric == "eval/synthetic/pass_at_1")].iloc[0]
    d = [(0.70 - 0.50) / 2, (0.72 - 0.56) / 2, (0.74 - 0.52) / 2]  # pass_at_1 = score / 2
    half = 4.30265273 * math.sqrt((pd.Series(d).var() + 2 * 0.02**2) / 3)
    assert row["diff"] == pytest.approx(sum(d) / 3) and row["half"] == pytest.approx(half)
    assert row["n_seeds"] == 3 and row["n_sign"] == 3 and row["excludes_zero"]
    row = paired[(paired.comparison == "gmc − grpo") & (paired.metric == "eval/synthetic/pass_at_1")].iloc[0]
    assert row["n_sign"] == 2 and not row["excludes_zero"]
    reward = paired[paired.metric == "rollout/reward_mean_last20"]
    assert (reward["diff"] == 0).all() and not reward["excludes_zero"].any()
    md = (r / "tables" / "paired.md").read_text()
    assert "gmc − tic at delay 16, G = 8, synthetic Pass@1: +0.097" in md and "(3/3) *" in md
    assert "gmc − grpo at delay 16, G = 8, synthetic Pass@1" not in md
    assert "$-$" in (r / "tables" / "paired.tex").read_text()
    assert len(pd.read_csv(r / "tables" / "paired.csv")) == len(paired)


def test_figures_show_intervals_over_seeds(tmp_path):
    import matplotlib.pyplot as plt

    from gmc import plots

    r = tmp_path / "results"
    for seed, (g, t) in enumerate([(0.70, 0.50), (0.72, 0.56), (0.74, 0.52)]):
        fake_run(r, "gmc", 16, 8, seed, 0.5 + 0.1 * seed, g, se=0.02)
        fake_run(r, "tic", 16, 8, seed, 0.5, t, se=0.02)
    fake_run(r, "gmc", 0, 8, 0, 0.5, 0.7, se=0.02)
    paths = plots.run_figures(r)
    assert {p.stem for p in paths} >= {"reward_vs_step", "score_vs_delay", "score_vs_group"}
    frame = collect(r)
    plots._score_column(frame)
    fig, ax = plt.subplots()
    gmc = plots._numeric_delays(frame[frame.algorithm == "gmc"])
    plots._line_by_algorithm(ax, gmc, "delay", "score", "score_se")
    bars = ax.containers[0]  # errorbar container: (line, caps, bar collections)
    segs = bars.lines[2][0].get_segments()
    half = {int(float(seg[0][0])): (seg[1][1] - seg[0][1]) / 2 for seg in segs}
    expected = mean_interval([0.35, 0.36, 0.37], [0.02] * 3).half
    assert half[0] == 0 and half[16] == pytest.approx(expected)  # one seed at delay 0: no bar
    plt.close(fig)
