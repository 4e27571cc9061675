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


def workdir(tmp_path, config: Path) -> Path:
    shutil.copy(config, tmp_path / "config.yaml")
    return tmp_path


def test_lint(snakemake):
    out = snakemake(["--lint", "--cores", "1"], cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations" in out.stdout + out.stderr


def test_default_config_dry_run_plans_the_sweep(tmp_path, snakemake):
    out = snakemake(["-n", "--cores", "2"], cwd=workdir(tmp_path, REPO / "config.yaml"))
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "build_tiny_model" in text and "theory_lab" in text
    for run_dir in ("algo~gmc/delay~128/group~8/seed~2", "algo~none/delay~128/group~8/seed~2"):  # grid, reference
        assert f"results/train/{run_dir}/summary.json" in text
    train_jobs = [line for line in text.splitlines() if line.strip().startswith("train ")]
    assert int(train_jobs[0].split()[-1]) == (3 * 2 + 2 + 1) * 3  # (grid + is, none + latency gmc) x 3 seeds


def test_paper_preset_dry_run_plans_the_full_sweep(tmp_path, snakemake):
    out = snakemake(["-n", "--cores", "2"], cwd=workdir(tmp_path, REPO / "workflow" / "presets" / "paper.yaml"))
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    train_jobs = [line for line in text.splitlines() if line.strip().startswith("train ")]
    n_train = int(train_jobs[0].split()[-1]) if train_jobs else 0
    assert n_train == (3 * 5 * 3 + 3) * 3 >= 135  # (algorithms x delays x G + latency) x 3 seeds
    assert "seed~2/summary.json" in text
    assert "fetch_model" in text and "delay~128/group~32" in text


def test_bad_config_value_names_key_and_allowed_values(tmp_path, snakemake):
    cfg = (REPO / "config.yaml").read_text().replace("algorithms: [grpo, tic, gmc]", "algorithms: [grpo, ppo]", 1)
    (tmp_path / "config.yaml").write_text(cfg)
    out = snakemake(["-n", "--cores", "1"], cwd=tmp_path)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "ppo" in text and "algorithms" in text and "gmc" in text


def test_unknown_config_key_is_rejected(tmp_path, snakemake):
    cfg = (REPO / "config.yaml").read_text() + "\nsweeep: {}\n"
    (tmp_path / "config.yaml").write_text(cfg)
    out = snakemake(["-n", "--cores", "1"], cwd=tmp_path)
    assert out.returncode != 0 and "sweeep" in out.stdout + out.stderr


@pytest.mark.slow
def test_end_to_end_tiny_sweep(tmp_path, snakemake):
    wd = workdir(tmp_path, REPO / "tests" / "data" / "workflow_config.yaml")
    out = snakemake(["--cores", "2"], cwd=wd, timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    results = wd / "results"
    runs = sorted((results / "train").glob("algo~*/delay~*/group~*/seed~*/summary.json"))
    assert len(runs) == 2 * 2 + 1 + 1  # grid, the reference none at delay 2, latency
    main = pd.read_csv(results / "tables" / "main.csv")
    assert set(main["algorithm"]) == {"base", "grpo", "gmc", "none"} and "eval/synthetic/pass_at_1:mean" in main.columns
    assert (results / "tables" / "main.md").read_text().startswith("| algorithm")
    assert "\\begin{tabular}" in (results / "tables" / "main.tex").read_text()
    paired = pd.read_csv(results / "tables" / "paired.csv")
    # latency runs are gmc only here: no partner among the estimators, a row for gmc's cost of staleness
    comparisons = {c: set(g["delay"].astype(str)) for c, g in paired.groupby("comparison")}
    assert comparisons == {"gmc − grpo": {"0", "2"}, "gmc − none": {"2"}, "grpo: stale − on-policy": {"2"},
                           "gmc: stale − on-policy": {"2", "latency"}}
    assert "Differences whose interval excludes zero" in (results / "tables" / "paired.md").read_text()
    assert len(pd.read_csv(results / "theory" / "claims.csv")) > 0
    for name in ("reward_vs_step", "score_vs_delay", "score_vs_group", "ratio_diagnostics", "staleness_vs_length"):
        assert (results / "figures" / f"{name}.png").stat().st_size > 5000
        assert (results / "figures" / f"{name}.pdf").exists()
    synced = json.loads((results / "mlflow" / "synced.json").read_text())
    assert len(synced["runs"]) == 6
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
    assert (tmp_path / "report.html").stat().st_size > 10_000


# -- machine settings: profiles, localrules, conda environments ------------------------------

SLURM_PROFILE = REPO / "workflow" / "profiles" / "slurm" / "config.yaml"
SITE_VARS = ("GMC_SLURM_ACCOUNT", "GMC_SLURM_PARTITION", "GMC_SLURM_GPU_PARTITION", "GMC_SLURM_GPU_MODEL")


def test_default_profile_is_loaded_without_profile_option(tmp_path, snakemake):
    out = snakemake(["-n", "-p", "--cores", "2"], cwd=workdir(tmp_path, REPO / "config.yaml"))
    assert out.returncode == 0, out.stderr
    assert f"workflow specific profile {REPO / 'profiles' / 'default'}" in out.stderr
    # its set-threads reach the jobs: evaluate_base gets 2 threads
    assert "OMP_NUM_THREADS=2 python -m gmc evaluate --model results/models/tiny" in out.stdout


def test_slurm_profile_takes_site_values_from_the_environment(monkeypatch):
    from snakemake.profiles import ProfileConfigFileParser

    def parse(**site):
        for var in SITE_VARS:
            monkeypatch.delenv(var, raising=False)
        for var, value in site.items():
            monkeypatch.setenv(var, value)
        with SLURM_PROFILE.open() as fh:
            return ProfileConfigFileParser().parse(fh)

    unset = parse()
    assert not any("slurm_" in v or "gpu_model" in v for v in unset["default-resources"] + unset["set-resources"])
    assert "train:gpu=1" in unset["set-resources"] and unset["executor"] == "slurm"
    site = parse(GMC_SLURM_ACCOUNT="lab", GMC_SLURM_PARTITION="cpu", GMC_SLURM_GPU_MODEL="a100")
    assert {"slurm_account=lab", "slurm_partition=cpu"} <= set(site["default-resources"])
    assert {"train:slurm_partition=cpu", "train:gpu_model=a100", "evaluate_base:gpu=1"} <= set(site["set-resources"])
    gpus = parse(GMC_SLURM_PARTITION="cpu", GMC_SLURM_GPU_PARTITION="gpu")
    assert {"train:slurm_partition=gpu", "evaluate:slurm_partition=gpu"} <= set(gpus["set-resources"])
    # threads and CPUs per job agree for every rule the profile sizes
    threads = dict(v.split("=") for v in site["set-threads"])
    cpus = {v.split(":")[0]: v.split("=")[1] for v in site["set-resources"] if ":cpus_per_task=" in v}
    assert threads == cpus


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs the SLURM client commands (make test-slurm)")
def test_slurm_profile_dry_run(tmp_path, snakemake):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    out = snakemake(["-n", "--workflow-profile", str(SLURM_PROFILE.parent)], cwd=workdir(tmp_path, REPO / "config.yaml"))
    assert out.returncode == 0, out.stderr
    assert "runtime=1440, cpus_per_task=16, gpu=1" in out.stdout  # the train jobs, as the profile sizes them


def test_small_jobs_run_on_the_submitting_machine(tmp_path, load_rules):
    rules = load_rules(tmp_path)
    local = {name for name, rule in rules.items() if name in rule.workflow._localrules}
    assert {"prepare_data", "train_config", "eval_config", "mlflow_sweep", "mlflow_sync", "tables",
            "figures_from_results"} <= local
    assert not {"build_tiny_model", "train", "evaluate", "evaluate_base"} & local


def test_conda_env_per_rule_follows_the_gpus_the_profile_gives(tmp_path, load_rules):
    cpu_only = load_rules(tmp_path / "cpu")
    assert {r.conda_env for r in cpu_only.values() if r.conda_env} == {"../../envs/cpu.yaml"}
    with_gpus = load_rules(tmp_path / "gpu", {"train": {"gpu": 1}, "evaluate": {"gpu": 1}})
    gpu_rules = {name for name, r in with_gpus.items() if r.conda_env == "../../envs/gpu.yaml"}
    assert gpu_rules == {"train", "evaluate"}  # tables, figures, MLflow, data: the CPU env
    assert with_gpus["tables"].conda_env == "../../envs/cpu.yaml"


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_conda_env_installs_the_project_from_its_copied_location(tmp_path, name):
    """`--sdm conda` runs envs/<name>.yaml from .snakemake/conda/<hash>.yaml, and conda hands its
    pip section to pip as a requirements file in that folder: the project line must resolve there.
    (Resolved with pip, offline; the conda part needs conda-forge, out of reach here.)"""
    import yaml

    env = yaml.safe_load((REPO / "envs" / f"{name}.yaml").read_text())
    pip = next(dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict))
    project = [line for line in pip if "GMC_REPO" in line]
    assert len(project) == 1, pip
    copied = tmp_path / ".snakemake" / "conda"
    copied.mkdir(parents=True)
    shutil.copy(REPO / "envs" / f"{name}.yaml", copied / "0123456789abcdef.yaml")

    def resolve(line):
        (copied / "condaenv.requirements.txt").write_text(line.replace("[gpu]", "") + "\n")
        return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
                               "--no-build-isolation", "-r", "condaenv.requirements.txt"], cwd=copied,
                              env={**os.environ, "GMC_REPO": str(REPO)}, capture_output=True, text=True, timeout=300)

    out = resolve(project[0])
    assert out.returncode == 0 and "Would install gmc-" in out.stdout, out.stdout + out.stderr
    # the form it replaces, `-e ..`, names a folder that is not the project from there
    assert resolve("-e ..").returncode != 0


def test_workflow_sets_the_checkout_for_the_conda_envs(tmp_path, monkeypatch, load_rules):
    monkeypatch.delenv("GMC_REPO", raising=False)
    load_rules(tmp_path)
    assert os.environ["GMC_REPO"] == str(REPO)
