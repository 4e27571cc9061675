"""The Snakemake workflow without running a job: lint, the dry runs of config.yaml and every
preset, each job's inputs, reruns of exactly what a changed key reaches, and the profiles."""

import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, workdir


def test_lint(snakemake):
    out = snakemake(["--lint", "--cores", "1"], cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations" in out.stdout + out.stderr


def test_default_config_dry_run_plans_the_sweep(tmp_path, snakemake):
    out = snakemake(["-n", "--cores", "2"], cwd=workdir(tmp_path, REPO / "config.yaml"))
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "theory_lab" in text
    jobs = {
        line.split()[0]: int(line.split()[-1])
        for line in text.splitlines()
        if line.strip() and line.split()[-1].isdigit() and len(line.split()) == 2
    }
    assert jobs["build_tiny_model"] == jobs["evaluate_base"] == jobs["history"] == 5  # a base model, a history per seed
    assert "results/train/algo~gmc/delay~64/group~8/seed~4/summary.json" in text
    # (grid + latency gmc) x 5 seeds, less gmc at delay 0: tic's run (one on-policy class)
    assert jobs["train"] == (3 * 2 + 1) * 5 - 5
    assert "results/train/algo~gmc/delay~0/group~8/seed~4/shared.json" in text
    assert "results/models/tiny/seed~4" in text and "results/eval/base/seed~4/synthetic.json" in text
    # resources.eval_with_training: each training job evaluates its run, no evaluation job of its own
    assert "evaluate" not in jobs and "results/eval/algo~gmc/delay~64/group~8/seed~4/synthetic.json" in text


@pytest.mark.parametrize(
    "preset",
    [None, *sorted((REPO / "workflow" / "presets").glob("*.yaml"))],
    ids=lambda p: p.name if p else "config.yaml",
)
def test_at_the_largest_delay_half_of_the_updates_train_on_the_runs_own_batches(load_workflow, tmp_path, preset):
    """Every sweep's runs are at least twice as long as its largest fixed delay, and under the
    history warm-up the history covers that delay: the first d updates train on the history's
    batches, the rest on the run's own."""
    sweep = load_workflow(tmp_path, configfiles=[preset] if preset else []).globals["SWEEP"]
    largest = max(sweep.config.sweep.delay)
    assert sweep.config.train["steps"] >= 2 * largest
    if sweep.run_delay.warmup == "history":
        assert sweep.history_steps >= largest


def test_paper_preset_dry_run_plans_the_full_sweep(tmp_path, snakemake):
    """The preset alone: the default config.yaml beside it (with its reference rows) does not leak in."""
    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    out = snakemake(
        ["-n", "--cores", "2", "--configfile", str(REPO / "workflow" / "presets" / "paper.yaml")], cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    train_jobs = [line for line in text.splitlines() if line.strip().startswith("train ")]
    n_train = int(train_jobs[0].split()[-1]) if train_jobs else 0
    # (algorithms x delays x G + latency) x 3 seeds, less gmc at delay 0 (tic's run) for every G and seed
    assert n_train == (3 * 5 * 3 + 3) * 3 - 3 * 3 == 135
    assert "seed~2/summary.json" in text and "algo~is" not in text and "algo~none" not in text
    assert "fetch_model" in text and "delay~128/group~32" in text


@pytest.mark.parametrize(
    "preset,n_train,corrections",
    [
        # at delay 0 the 18 estimators train three runs per seed, one per on-policy class
        (
            "corrections.yaml",
            (3 + 18) * 7,
            ["cispo", "icepop", "seq_mask", "m2po", "gmpo", "dppo", "sapo", "kpop", "dppo_kl", "prime_dppo", "opsm"],
        ),
        ("corrections_long.yaml", 3 * 2 * 5 + 2 * 2 * 5 - 2 * 5, ["is", "cispo"]),
    ],
)
def test_the_league_presets_plan_every_correction_and_their_table(
    tmp_path, snakemake, load_workflow, preset, n_train, corrections
):
    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    out = snakemake(
        ["-n", "-p", "--cores", "2", "--configfile", str(REPO / "workflow" / "presets" / preset)], cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    train_jobs = [line for line in text.splitlines() if line.strip().startswith("train ")]
    assert int(train_jobs[0].split()[-1]) == n_train
    for name in corrections:
        assert f"algo~{name}/delay~0/group~8/seed~4" in text
    stale = 64 if preset == "corrections.yaml" else 32
    for name in corrections:
        assert f"algo~{name}/delay~{stale}/group~8/seed~4" in text
    assert "tables/league.md" in text
    if preset == "corrections_long.yaml":  # the warm start learns the long task's format
        for seed in range(5):  # one warm start per seed
            assert f"--config results/corrections_long/configs/model/seed~{seed}.yaml" in text
        sweep = load_workflow(tmp_path / "wf", configfiles=[REPO / "workflow" / "presets" / preset]).globals["SWEEP"]
        assert sweep.model_settings(2)["synthetic"]["min_operands"] == 11
        assert sweep.model_settings(2)["seed"] == 2
        # the warm start's acceptance rule, judged on a validation split no run trains or evaluates on
        assert sweep.model_settings(2)["accept_accuracy"] == 0.2
        assert sweep.model_settings(2)["synthetic"]["validation_fraction"] == 0.1


def test_the_real_asynchrony_preset_plans_ray_points_beside_the_simulated_ones(tmp_path, snakemake):
    out = snakemake(
        ["-n", "-p", "--cores", "2", "--configfile", str(REPO / "workflow/presets/real_async.yaml")], cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "delay~ray/group~8/seed~2/summary.json" in text and "delay~latency/group~8" in text
    assert "--config results/real_async/configs/train/algo~gmc/delay~ray/group~8/seed~2.yaml" in text
    train_jobs = [line for line in text.splitlines() if line.strip().startswith("train ")]
    assert int(train_jobs[0].split()[-1]) == (3 * 2 + 3 + 3) * 3 - 3  # gmc at delay 0: tic's run


def test_the_group_size_preset_plans_four_group_sizes_at_one_sampling_budget(tmp_path, snakemake, load_workflow):
    preset = REPO / "workflow/presets/group_size.yaml"
    out = snakemake(
        ["-n", "-p", "--cores", "2", "--configfile", str(preset)], cwd=workdir(tmp_path, REPO / "config.yaml")
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    train_jobs = [line for line in text.splitlines() if line.strip().startswith("train ")]
    assert int(train_jobs[0].split()[-1]) == (3 * 2 - 1) * 4 * 5  # gmc at delay 0: tic's run
    for g in (4, 8, 16, 32):
        assert f"algo~gmc/delay~64/group~{g}/seed~4/summary.json" in text
    sweep = load_workflow(tmp_path / "wf", configfiles=[preset]).globals["SWEEP"]
    runs = [sweep.run(p) for p in sweep.points]
    assert {cfg.group_size * cfg.prompts_per_step for cfg in runs} == {64}
    assert sorted({cfg.seed for cfg in runs}) == [0, 1, 2, 3, 4]


def test_the_gradient_lab_preset_plans_the_lab_on_its_seeds_history(tmp_path, snakemake):
    out = snakemake(
        ["-n", "-p", "--cores", "2", "--configfile", str(REPO / "workflow/presets/gradient_lab.yaml")],
        cwd=workdir(tmp_path, REPO / "config.yaml"),
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    history = next(
        line.split("--out results/gradient_lab/history/")[1].split()[0]
        for line in text.splitlines()
        if " history --config " in line
    )
    assert (
        f"gmc gradient-lab --history results/gradient_lab/history/{history} "
        "--config results/gradient_lab/configs/gradient_lab.yaml --out results/gradient_lab/gradient_lab" in text
    )
    for name in ("gradients.csv", "claims.csv", "gradient_excess_vs_G.png"):
        assert f"results/gradient_lab/gradient_lab/{name}" in text
    (tmp_path / "plain").mkdir()
    plain = snakemake(["-n", "-p", "--cores", "2"], cwd=workdir(tmp_path / "plain", REPO / "config.yaml"))
    assert plain.returncode == 0 and "gradient-lab" not in plain.stdout + plain.stderr  # off by default


def test_a_trace_is_a_sweep_point(tmp_path, snakemake):
    trace = tmp_path / "staleness_trace.jsonl"
    trace.write_text('{"prompt_index": 1, "version": 0, "consumed_version": 0}\n')
    extra = tmp_path / "traces.yaml"
    extra.write_text(f"traces: {{run7: {{trace: {trace}, algorithm: [gmc, tic], group_size: [8]}}}}\n")
    out = snakemake(
        ["-n", "-p", "--cores", "2", "--configfile", "config.yaml", str(extra)],
        cwd=workdir(tmp_path, REPO / "config.yaml"),
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "algo~tic/delay~trace-run7/group~8/seed~2/summary.json" in text
    assert "--config results/configs/train/algo~tic/delay~trace-run7/group~8/seed~2.yaml" in text


PRESETS = sorted((REPO / "workflow" / "presets").glob("*.yaml"))


@pytest.mark.parametrize("preset", [None, *PRESETS], ids=lambda p: p.name if p else "config.yaml")
def test_every_train_job_reads_its_resolved_config_file_and_nothing_else(tmp_path, snakemake, load_workflow, preset):
    """``snakemake -n -p`` shows each training job as ``workflow/scripts/requeue.sh <log> train
    --config <results>/configs/train/<point>.yaml`` (``gmc train``) with no ``--set``;
    the files written by the workflow (one per kind of delay of the preset, made for real) hold
    what :meth:`gmc.sweep.resolve.Sweep.run` returns for their point."""
    import re

    import yaml

    from gmc.run.config import TrainConfig
    from gmc.settings import from_dict, to_dict

    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    (tmp_path / "published").symlink_to(REPO / "published")  # a tuned preset's choice, as in a checkout
    extra = ["--configfile", str(preset)] if preset else []
    out = snakemake(["-n", "-p", "--cores", "2", *extra], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = (out.stdout + out.stderr).splitlines()
    commands = [line for line in lines if "workflow/scripts/requeue.sh " in line and " train --config " in line]
    sweep = load_workflow(tmp_path / "wf", configfiles=[preset] if preset else []).globals["SWEEP"]
    points, shared, results = sweep.points, sweep.shared, sweep.config.results
    assert len(commands) == len(points) - len(shared)
    for command in commands:
        assert "--set" not in command
        assert re.search(
            rf"requeue\.sh \S+ train --config {results}/configs/train/algo~[^ ]+\.yaml --out {results}/train/", command
        )
    assert {re.search(r"--config (\S+)", c)[1] for c in commands} == {
        f"{results}/configs/train/{p.path}.yaml" for p in points if p not in shared
    }
    # one prefill per class of fixed-delay runs that differ only in the estimator; its members start from it
    prefills = sweep.prefills
    makers = [line for line in lines if "python -m gmc prefill " in line]
    assert sorted(re.search(r"--config (\S+) --out (\S+)", c).groups() for c in makers) == sorted(
        {
            (f"{results}/configs/train/{first.path}.yaml", f"{results}/prefill/{name}.pt")
            for name, first in prefills.values()
        }
    )
    for command in commands:
        point = next(p for p in points if f"/configs/train/{p.path}.yaml " in command)
        given = re.search(r"--prefill (\S+)", command)
        assert (given[1] if given else None) == (
            f"{results}/prefill/{prefills[point][0]}.pt" if point in prefills else None
        )
        assert point not in prefills or sweep.run(point).delay.d > 0
    # one history per class of runs that differ only in the estimator and the delay; its members start from it
    histories = sweep.histories
    makers = [line for line in lines if "workflow/scripts/requeue.sh " in line and " history --config " in line]
    assert sorted(re.search(r"--config (\S+) --out (\S+) --queues([\d ]*)$", c).groups() for c in makers) == sorted(
        {
            (
                f"{results}/configs/train/{first.path}.yaml",
                f"{results}/history/{name}",
                "".join(f" {d}" for d in queues),
            )
            for name, (first, queues) in {
                n: (next(p for p in points if histories.get(p, ("",))[0] == n), q) for n, q in histories.values()
            }.items()
        }
    )
    # a history generates one queue for each fixed delay above 0 that starts from it
    for name, queues in histories.values():
        members = [sweep.run(p).delay for p in points if histories.get(p, ("",))[0] == name]
        assert queues == tuple(sorted({m.d for m in members if m.mode == "fixed" and m.d > 0}))
    for command in commands:
        point = next(p for p in points if f"/configs/train/{p.path}.yaml " in command)
        given = re.search(r"--history (\S+)", command)
        assert (given[1] if given else None) == (
            f"{results}/history/{histories[point][0]}" if point in histories else None
        )
        cfg = sweep.run(point)
        assert point not in histories or (cfg.delay.warmup == "history" and cfg.delay.history_length >= cfg.delay.d)
    sample = list({p.delay.mode: p for p in points}.values())
    files = [f"{results}/configs/train/{p.path}.yaml" for p in sample]
    made = snakemake(["--cores", "1", *extra, "--", *files], cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]
    for point, file in zip(sample, files):
        written = yaml.safe_load((tmp_path / file).read_text())
        assert written == to_dict(sweep.run(point))
        assert from_dict(TrainConfig, written) == sweep.run(point)


def test_a_changed_key_reruns_exactly_the_runs_it_reaches(tmp_path, snakemake):
    """A key of one delay mode's section changes the config files of that mode's runs alone, and
    only those training jobs are planned again."""
    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    made = snakemake(
        [
            "--cores",
            "1",
            "--allowed-rules",
            "train_config",
            "--",
            *[f"results/configs/train/algo~gmc/delay~{d}/group~8/seed~0.yaml" for d in ("0", "latency")],
        ],
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    before = {
        d: (tmp_path / f"results/configs/train/algo~gmc/delay~{d}/group~8/seed~0.yaml").read_text()
        for d in ("0", "latency")
    }
    again = snakemake(
        [
            "--cores",
            "1",
            "--config",
            "latency={delay: {slots: 12}}",
            "--",
            *[f"results/configs/train/algo~gmc/delay~{d}/group~8/seed~0.yaml" for d in ("0", "latency")],
        ],
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    after = {
        d: (tmp_path / f"results/configs/train/algo~gmc/delay~{d}/group~8/seed~0.yaml").read_text()
        for d in ("0", "latency")
    }
    assert after["0"] == before["0"] and after["latency"] != before["latency"] and "slots: 12" in after["latency"]


@pytest.mark.parametrize("preset", [None, *PRESETS], ids=lambda p: p.name if p else "config.yaml")
def test_a_preset_is_the_whole_science(tmp_path, load_workflow, preset):
    """The configuration the workflow uses is the preset's file alone, completed by the settings
    classes' defaults, whatever config.yaml says (config.yaml is that file without --configfile)."""
    from gmc.workflow import load_file

    stand_in = tmp_path / "config.yaml"
    stand_in.write_text(
        "sweep: {algorithm: [none], delay: [3], group_size: [2], seed: [9], "
        "references: {algorithm: [is], delay: [3]}}\ntrain: {lr: 0.5}\n"
    )
    used = load_workflow(tmp_path, configfiles=[preset] if preset else []).globals["CONFIG"]
    assert used == load_file(preset or stand_in).config
    if preset is not None and "paper" in preset.name:
        assert used.train["behaviour_logprobs"] == "trainer"  # the trainer's numerics, stated


@pytest.mark.parametrize("preset", [None, *PRESETS], ids=lambda p: p.name if p else "config.yaml")
def test_the_reports_text_reads_the_loaded_configuration(preset):
    """The HTML report's text (workflow/report/workflow.rst) renders from what the Snakefile leaves
    in Snakemake's config (:func:`gmc.workflow.plain_config`), every value it names defined."""
    import jinja2

    from gmc.workflow import load_file, plain_config

    sweep = load_file(preset or REPO / "config.yaml")

    class Snakemake:
        config = plain_config(sweep)

    template = (REPO / "workflow" / "report" / "workflow.rst").read_text()
    text = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(snakemake=Snakemake)
    run = sweep.run(sweep.points[0])
    assert f"Model ``{sweep.config.model}``, {run.steps} optimizer steps" in text
    assert f"Estimators {', '.join(sweep.config.sweep.algorithm)} at fixed delays" in text
    assert all(f"The {m} delay" in text for m in ("latency", "ray") if getattr(sweep.config, m).enabled)
    assert f"temperature\n{sweep.evaluation.temperature}" in text


def test_the_dag_builds_each_run_config_once(tmp_path, monkeypatch):
    """Planning a sweep (the Snakefile read, the DAG built and dry-run) builds one TrainConfig per
    point, not one per rule or helper that reads it: the sweep resolves each once
    (:class:`gmc.sweep.resolve.Sweep`), and histories are named from plain values."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    from gmc.run.config import TrainConfig
    from gmc.settings import to_dict

    built = []
    post_init = TrainConfig.__post_init__

    def counting(self):
        built.append(self)
        post_init(self)

    monkeypatch.setattr(TrainConfig, "__post_init__", counting)
    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    monkeypatch.chdir(tmp_path)
    with SnakemakeApi(OutputSettings(dryrun=True, quiet={"all"})) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(),
            snakefile=REPO / "Snakefile",
            workdir=tmp_path,
        )
        dag = wf.dag(dag_settings=DAGSettings())
        dag.execute_workflow(executor="dryrun")
    namespace = wf._workflow.globals
    points = namespace["SWEEP"].points
    assert len(points) == 35 and len(built) == len(points)
    assert {(c.algorithm, c.seed) for c in built} == {(p.algorithm, p.seed) for p in points}
    # the rules read the resolved sweep: each train_config job's values (common.smk's run_config)
    # are its point's kept config, and reading them builds none
    for point in points:
        wildcards = {"algo": point.algorithm, "delay": str(point.delay), "group": point.group, "seed": point.seed}
        assert namespace["run_config"](type("W", (), wildcards)) == to_dict(namespace["SWEEP"].run(point))
    assert len(built) == len(points)


def test_bad_config_value_names_key_and_allowed_values(tmp_path, snakemake):
    cfg = (REPO / "config.yaml").read_text().replace("algorithm: [grpo, tic, gmc]", "algorithm: [grpo, ppo]", 1)
    (tmp_path / "config.yaml").write_text(cfg)
    out = snakemake(["-n", "--cores", "1"], cwd=tmp_path)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "sweep.algorithm[1]" in text and "ppo" in text and "gmc" in text


def test_unknown_config_key_is_rejected(tmp_path, snakemake):
    cfg = (REPO / "config.yaml").read_text() + "\nsweeep: {}\n"
    (tmp_path / "config.yaml").write_text(cfg)
    out = snakemake(["-n", "--cores", "1"], cwd=tmp_path)
    assert out.returncode != 0 and "sweeep" in out.stdout + out.stderr


SLURM_PROFILE = REPO / "profiles" / "slurm" / "config.yaml"


SITE_VARS = ("GMC_SLURM_ACCOUNT", "GMC_SLURM_PARTITION", "GMC_SLURM_GPU_PARTITION", "GMC_SLURM_GPU_MODEL")


def test_default_profile_is_loaded_without_profile_option(tmp_path, snakemake):
    out = snakemake(["-n", "--cores", "2"], cwd=workdir(tmp_path, REPO / "config.yaml"))
    assert out.returncode == 0, out.stderr
    assert f"workflow specific profile {REPO / 'profiles' / 'default'}" in out.stderr
    # its settings reach the jobs: commands printed (printshellcmds), one thread per job
    assert "OMP_NUM_THREADS=1 python -m gmc evaluate --model results/models/tiny/seed~0" in out.stdout
    assert "OMP_NUM_THREADS=1 python -m gmc build-tiny-model --out results/models/tiny/seed~0" in out.stdout


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
    site_keys = ("slurm_account", "slurm_partition", "gpu_model")
    assert not any(k in v for k in site_keys for v in unset["default-resources"] + unset["set-resources"])
    # the time-limit signal is the profile's own, site or not
    assert any(v.startswith("train:slurm_extra=") and "--signal=TERM@" in v for v in unset["set-resources"])
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
    out = snakemake(
        ["-n", "--workflow-profile", str(SLURM_PROFILE.parent)], cwd=workdir(tmp_path, REPO / "config.yaml")
    )
    assert out.returncode == 0, out.stderr
    assert "runtime=1440, cpus_per_task=16, gpu=1" in out.stdout  # the train jobs, as the profile sizes them


def test_small_jobs_run_on_the_submitting_machine(tmp_path, load_rules):
    rules = load_rules(tmp_path)
    local = {name for name, rule in rules.items() if name in rule.workflow._localrules}
    assert {
        "prepare_data",
        "train_config",
        "eval_config",
        "mlflow_sweep",
        "mlflow_sync",
        "tables",
        "figures_from_results",
    } <= local
    assert not {"build_tiny_model", "train", "evaluate", "evaluate_base"} & local


def test_what_starts_a_seed_goes_first_with_the_small_jobs_it_waits_on(tmp_path, load_rules):
    """Warm starts, then histories and prefills, before the training runs; Snakemake passes a
    job's priority to none of its inputs, so the small jobs they wait on (the model's config, the
    run configs, the data) carry it themselves: a seed's warm start cannot wait behind the other
    seeds' training for its config."""
    rules = load_rules(tmp_path)
    build, start = rules["build_tiny_model"].priority, rules["history"].priority
    assert build > start > rules["train"].priority and rules["prefill"].priority == start
    assert rules["model_config"].priority >= build
    assert rules["train_config"].priority >= start and rules["prepare_data"].priority >= start


def test_conda_env_per_rule_follows_the_gpus_the_profile_gives(tmp_path, load_rules):
    cpu_only = load_rules(tmp_path / "cpu")
    assert {r.conda_env for r in cpu_only.values() if r.conda_env} == {"../../envs/cpu.yaml"}
    (tmp_path / "gpu").mkdir()  # evaluation jobs of their own, on the GPUs the profile gives them
    (tmp_path / "gpu" / "config.yaml").write_text(
        (REPO / "config.yaml").read_text().replace("eval_with_training: true", "eval_with_training: false")
    )
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
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--no-deps",
                "--no-index",
                "--no-build-isolation",
                "-r",
                "condaenv.requirements.txt",
            ],
            cwd=copied,
            env={**os.environ, "GMC_REPO": str(REPO)},
            capture_output=True,
            text=True,
            timeout=300,
        )

    out = resolve(project[0])
    assert out.returncode == 0 and "Would install gmc-" in out.stdout, out.stdout + out.stderr
    # the form it replaces, `-e ..`, names a folder that is not the project from there
    assert resolve("-e ..").returncode != 0


def test_workflow_sets_the_checkout_for_the_conda_envs(tmp_path, monkeypatch, load_rules):
    monkeypatch.delenv("GMC_REPO", raising=False)
    load_rules(tmp_path)
    assert os.environ["GMC_REPO"] == str(REPO)
