"""The Snakemake workflow: lint, dry runs, schema validation and one real end-to-end run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def run(args, cwd, timeout=600):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def workdir(tmp_path, config: Path) -> Path:
    shutil.copy(config, tmp_path / "config.yaml")
    return tmp_path


def test_lint():
    out = run(["--lint", "--cores", "1"], cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations" in out.stdout + out.stderr


def test_default_config_dry_run_plans_the_sweep(tmp_path):
    out = run(["-n", "--cores", "2"], cwd=workdir(tmp_path, REPO / "config.yaml"))
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "build_tiny_model" in text and "theory_lab" in text
    assert "results/train/algo~gmc/delay~32/group~8/seed~0/summary.json" in text


def test_paper_preset_dry_run_plans_the_full_sweep(tmp_path):
    out = run(["-n", "--cores", "2"], cwd=workdir(tmp_path, REPO / "workflow" / "presets" / "paper.yaml"))
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    train_jobs = [line for line in text.splitlines() if line.strip().startswith("train ")]
    n_train = int(train_jobs[0].split()[-1]) if train_jobs else 0
    assert n_train == (3 * 5 * 3 + 3) * 3 >= 135  # (algorithms x delays x G + latency) x 3 seeds
    assert "seed~2/summary.json" in text
    assert "fetch_model" in text and "delay~128/group~32" in text


def test_bad_config_value_names_key_and_allowed_values(tmp_path):
    cfg = (REPO / "config.yaml").read_text().replace("algorithms: [grpo, tic, gmc]", "algorithms: [grpo, ppo]", 1)
    (tmp_path / "config.yaml").write_text(cfg)
    out = run(["-n", "--cores", "1"], cwd=tmp_path)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "ppo" in text and "algorithms" in text and "gmc" in text


def test_unknown_config_key_is_rejected(tmp_path):
    cfg = (REPO / "config.yaml").read_text() + "\nsweeep: {}\n"
    (tmp_path / "config.yaml").write_text(cfg)
    out = run(["-n", "--cores", "1"], cwd=tmp_path)
    assert out.returncode != 0 and "sweeep" in out.stdout + out.stderr


@pytest.mark.slow
def test_end_to_end_tiny_sweep(tmp_path):
    wd = workdir(tmp_path, REPO / "tests" / "data" / "workflow_config.yaml")
    out = run(["--cores", "2"], cwd=wd, timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    results = wd / "results"
    runs = sorted((results / "train").glob("algo~*/delay~*/group~*/seed~*/summary.json"))
    assert len(runs) == 2 * 2 + 1
    main = pd.read_csv(results / "tables" / "main.csv")
    assert set(main["algorithm"]) == {"base", "grpo", "gmc"} and "eval/synthetic/pass_at_1:mean" in main.columns
    assert (results / "tables" / "main.md").read_text().startswith("| algorithm")
    assert "\\begin{tabular}" in (results / "tables" / "main.tex").read_text()
    paired = pd.read_csv(results / "tables" / "paired.csv")
    # latency runs are gmc only here: no partner, no row
    assert set(paired["comparison"]) == {"gmc − grpo"} and set(paired["delay"].astype(str)) == {"0", "2"}
    assert "Differences whose interval excludes zero" in (results / "tables" / "paired.md").read_text()
    assert len(pd.read_csv(results / "theory" / "claims.csv")) > 0
    for name in ("reward_vs_step", "score_vs_delay", "score_vs_group", "ratio_diagnostics", "staleness_vs_length"):
        assert (results / "figures" / f"{name}.png").stat().st_size > 5000
        assert (results / "figures" / f"{name}.pdf").exists()
    synced = json.loads((results / "mlflow" / "synced.json").read_text())
    assert len(synced["runs"]) == 5
    # logged live (tracking_uri is set), nested under the sweep's run, with the evaluation scores
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    mlflow_runs = client.search_runs([client.get_experiment_by_name("gmc").experiment_id])
    parents = [r for r in mlflow_runs if "gmc.sweep" in r.data.tags]
    children = [r for r in mlflow_runs if "gmc.run_id" in r.data.tags]
    assert len(parents) == 1 and sorted(r.info.run_id for r in children) == sorted(synced["runs"].values())
    assert all(r.data.tags["mlflow.parentRunId"] == synced["sweep"] == parents[0].info.run_id for r in children)
    assert all("eval/synthetic/pass_at_1" in r.data.metrics for r in [*children, *parents])
    base = json.loads((results / "eval" / "base" / "synthetic.json").read_text())
    assert base["problems"] == 8 and base["k"] == 2

    # a second invocation has nothing to do
    again = run(["--cores", "2"], cwd=wd)
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
    rep = run(["--report", str(tmp_path / "report.html")], cwd=wd)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert (tmp_path / "report.html").stat().st_size > 10_000
