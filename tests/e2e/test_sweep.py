"""The tiny sweep run for real end to end through Snakemake, and a sweep on a local folder of
weights: every stage's files, MLflow's runs and the tables."""

import json
import re
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from helpers import REPO, WORKFLOW_TIMEOUT, workdir

from gmc.results import outputs


@pytest.mark.slow
@pytest.mark.timeout(WORKFLOW_TIMEOUT)
def test_end_to_end_tiny_sweep(tmp_path, snakemake):
    wd = workdir(tmp_path, REPO / "tests" / "data" / "workflow_config.yaml")
    out = snakemake(["--cores", "2"], cwd=wd, timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    results = wd / "results"
    runs = sorted((results / "train").glob("algo~*/delay~*/group~*/seed~*/summary.json"))
    assert len(runs) == 2 * 2 + 1 + 1  # grid, the reference none at delay 2, latency
    # none at delay 0 trains no run of its own: on-policy it is gmc's loss, and its row is gmc's run
    shared = json.loads((results / "train/algo~none/delay~0/group~4/seed~0/shared.json").read_text())
    assert shared["run"] == "algo~gmc/delay~0/group~4/seed~0" and shared["on_policy_class"] == ["pg", "seq_sum_const"]
    assert not (results / "eval/algo~none/delay~0").exists()
    main = pd.read_csv(results / "tables" / "main.csv")
    assert set(main["algorithm"]) == {"base", "grpo", "gmc", "none"} and "eval/synthetic/pass_at_1:mean" in main.columns
    none0, gmc0 = (main[(main["algorithm"] == a) & (main["delay"].astype(str) == "0")].iloc[0] for a in ("none", "gmc"))
    assert (
        none0["shared_with"] == "gmc"
        and none0["eval/synthetic/pass_at_1:mean"] == gmc0["eval/synthetic/pass_at_1:mean"]
    )
    assert "none (run of gmc)" in (results / "tables" / "main.md").read_text()
    assert (results / "tables" / "main.md").read_text().startswith("| algorithm")
    assert "\\begin{tabular}" in (results / "tables" / "main.tex").read_text()
    paired = pd.read_csv(results / "tables" / "paired.csv")
    # latency runs are gmc only here: no partner among the estimators, a row for gmc's cost of staleness
    comparisons = {c: set(g["delay"].astype(str)) for c, g in paired.groupby("comparison")}
    assert comparisons == {
        "gmc − grpo": {"0", "2"},
        "gmc − none": {"0", "2"},
        "grpo: stale − on-policy": {"2"},
        "gmc: stale − on-policy": {"2", "latency"},
        "none: stale − on-policy": {"2"},
    }
    assert "Resolved differences:" in (results / "tables" / "paired.md").read_text()
    assert "## Pass@1" in (results / "tables" / "conclusions.md").read_text()
    assert len(pd.read_csv(results / "theory" / "claims.csv")) > 0
    for name in outputs.FIGURES:
        assert (results / "figures" / f"{name}.png").stat().st_size > 5000
        assert (results / "figures" / f"{name}.pdf").exists()
    synced = json.loads((results / "mlflow" / "synced.json").read_text())
    assert len(synced["runs"]) == 7  # every point: none at delay 0 too, with gmc's run
    # logged live (tracking_uri is set), nested under the sweep's run, with the evaluation scores
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    mlflow_runs = client.search_runs([client.get_experiment_by_name("gmc").experiment_id])
    parents = [r for r in mlflow_runs if "gmc.sweep.points" in r.data.tags]
    children = [r for r in mlflow_runs if "gmc.run_id" in r.data.tags]
    assert len(parents) == 1 and sorted(r.info.run_id for r in children) == sorted(synced["runs"].values())
    assert all(r.data.tags["mlflow.parentRunId"] == synced["sweep"] == parents[0].info.run_id for r in children)
    assert all("eval/synthetic/pass_at_1" in r.data.metrics for r in children)
    (shared_none,) = [r for r in children if "gmc.shared_with" in r.data.tags]
    assert shared_none.data.params["algorithm"] == "none" and shared_none.data.tags["gmc.shared_with"] == shared["run"]
    assert all(r.info.end_time - r.info.start_time < 1000 * 600 for r in children)  # training's time, not the import's
    assert "seed-0/eval/synthetic/pass_at_1" in parents[0].data.metrics  # the base model of seed 0
    base = json.loads((results / "eval" / "base" / "seed~0" / "synthetic.json").read_text())
    assert base["problems"] == 8 and base["k"] == 2

    # a second invocation has nothing to do
    again = snakemake(["--cores", "2"], cwd=wd)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # figures and tables from cached results: from an exported bundle, without training
    bundle = tmp_path / "bundle.tar.gz"
    gmc = [sys.executable, "-m", "gmc"]
    subprocess.run([*gmc, "export-results", "--results", str(results), "--out", str(bundle)], check=True)
    fresh = tmp_path / "fresh"
    subprocess.run([*gmc, "import-results", str(bundle), "--results", str(fresh)], check=True)
    subprocess.run([*gmc, "report", "--results", str(fresh)], check=True, capture_output=True)
    assert pd.read_csv(fresh / "tables" / "main.csv").equals(main)
    assert (fresh / "figures" / "score_vs_delay.png").exists()
    assert not list(fresh.glob("train/**/checkpoint.pt"))

    # the HTML report
    rep = snakemake(["--report", str(tmp_path / "report.html")], cwd=wd)
    assert rep.returncode == 0, rep.stderr[-3000:]
    html = (tmp_path / "report.html").read_text()
    assert len(html) > 10_000 and "What this sweep ran" in html
    # the report's results (the files it shows): every table as HTML, shown inline, none as Markdown
    shown = json.loads(re.search(r"var results = (\{.*\});\n", html)[1])
    assert "results/tables/conclusions.html" in shown and not [f for f in shown if f.endswith(".md")]


@pytest.mark.slow
@pytest.mark.timeout(WORKFLOW_TIMEOUT)
def test_two_group_sizes_at_one_budget_and_the_gradient_lab_end_to_end(tmp_path, snakemake):
    """The G axis on a model that answers some problems right: two group sizes at 8 rollouts a step
    (4 prompts of 2, 2 of 4), each from its own history, in the tables and score_vs_group; the
    gradient lab on the first history, in the bundle, redrawn from it by gmc report."""
    wd = workdir(tmp_path, REPO / "tests" / "data" / "group_size_config.yaml")
    out = snakemake(["--cores", "2"], cwd=wd, timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    results = wd / "results"
    for G, prompts in ((2, 4), (4, 2)):
        run = results / f"train/algo~grpo/delay~2/group~{G}/seed~0"
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert {s["rollout/samples"] for s in steps} == {8.0} and len({s["async/staleness_mean"] for s in steps}) == 1
        assert yaml.safe_load((run / "config.yaml").read_text())["prompts_per_step"] == prompts
        # the warm-started model answers some problems: rewards to learn from at either G
        assert max(s["train/reward_mean"] for s in steps) > 0
    assert len(list((results / "history").glob("*/summary.json"))) == 2
    main = pd.read_csv(results / "tables" / "main.csv")
    assert set(main.loc[main["algorithm"] != "base", "group"]) == {2, 4}
    assert (results / "figures" / "score_vs_group.png").stat().st_size > 5000
    lab = results / outputs.LAB_FOLDER
    assert all((lab / f).exists() for f in outputs.GRADIENT_LAB_FILES)
    rows = pd.read_csv(lab / "gradients.csv")
    assert set(rows["G"]) == {2, 4} and set(rows["delay"]) == {2} and "cispo" in set(rows["algorithm"])

    gmc = [sys.executable, "-m", "gmc"]
    bundle = tmp_path / "published"
    subprocess.run([*gmc, "publish", "--results", str(results), "--out", str(bundle)], check=True, capture_output=True)
    assert not (bundle / outputs.LAB_FOLDER / "gradient_bias_vs_G.png").exists()
    subprocess.run([*gmc, "report", "--results", str(bundle)], check=True, capture_output=True)
    assert (bundle / outputs.LAB_FOLDER / "gradient_bias_vs_G.png").stat().st_size > 5000
    assert (bundle / outputs.LAB_FOLDER / "gradient_lab.md").read_text() == (lab / "gradient_lab.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(WORKFLOW_TIMEOUT)
def test_a_local_weights_folder_is_used_where_it_is(tmp_path, snakemake, shared_data):
    """model may be a local folder of HF weights: checked before any job (what is missing is
    named), used in place (nothing fetched, no copy), end to end through training and evaluation."""
    import yaml

    weights = tmp_path / "shared-storage" / "random-qwen3"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gmc",
            "build-random-model",
            "--out",
            str(weights),
            "--set",
            "hidden_size=32",
            "--set",
            "intermediate_size=64",
            "--set",
            "num_layers=1",
            "--data-root",
            str(shared_data),
        ],
        check=True,
        capture_output=True,
    )
    config = yaml.safe_load((REPO / "tests" / "data" / "workflow_config.yaml").read_text())
    config["model"] = str(weights)
    config["train"].update(steps=2, prompts_per_step=1, **{"sampling": {"max_new_tokens": 8}})
    config["sweep"].update(algorithm=["gmc"], delay=[1], seed=[0], references={})
    config["latency"]["enabled"] = False
    config["evaluate"].update(synthetic_problems=2, max_new_tokens=8)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "preset.yaml").write_text(yaml.safe_dump(config))
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    args = ["--cores", "2", "--configfile=preset.yaml", "train_all", "eval_all"]
    plan = snakemake(["-n", *args], cwd=run_dir, env=offline)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "fetch_model" not in plan.stdout + plan.stderr and "build_random_model" not in plan.stdout
    out = snakemake(args, cwd=run_dir, env=offline, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    trained = yaml.safe_load((run_dir / "results/train/algo~gmc/delay~1/group~4/seed~0/config.yaml").read_text())
    assert trained["model"] == str(weights) and not (run_dir / "results" / "models").exists()
    assert (run_dir / "results/eval/base/synthetic.json").exists()
    # a folder lacking its weights stops the plan naming what is missing
    (weights / "model.safetensors").rename(weights / "moved.safetensors")
    bad = snakemake(["-n", *args], cwd=run_dir, env=offline)
    assert bad.returncode != 0 and "lacks weights" in bad.stdout + bad.stderr
