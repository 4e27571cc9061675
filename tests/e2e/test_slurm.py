"""The sweep through profiles/slurm on a real one-node SLURM (run by `make test-slurm`).

Needs the cluster of .ci/slurm/cluster.sh (GMC_SLURM_PARTITION and GMC_SLURM_ACCOUNT set
as in its env file). A reduced sweep (one algorithm, two seeds, a few steps, the tiny model)
goes through `sbatch` with the project's own profile (the tiny model is built once, for both
runs); at the same time the same config runs locally. One training job is cancelled with `scancel` after its first checkpoint: Snakemake's
retry resubmits it and the trainer resumes. Checked: every SLURM job COMPLETED (the cancelled
one CANCELLED), the resumed run kept the rows written before its checkpoint, and every metric
and evaluation equals the local run's, wall-clock times aside. In a second sweep SLURM signals
the running training job's steps with SIGTERM, as the profile's time-limit warning
(`--signal=TERM@900`) does: the trainer checkpoints at a step boundary, the job requeues itself,
resumes, and the run equals the local run.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "slurm"
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
TARGETS = ["train_all", "eval_all", "tables"]
# one thread per job in both runs, so that the two compute the same numbers
THREADS = ["--set-threads", "build_tiny_model=1", "train=1", "evaluate=1", "evaluate_base=1"]
STEPS, CHECKPOINT_EVERY = 12, 3
CANCELLED_RUN = "train/algo~gmc/delay~0/group~4/seed~1"
CANCELLED_JOB = "rule_train_wildcards_gmc_0_4_1"  # the comment the executor gives its SLURM job
TIMEOUT = 900  # the executor plugin can hang (profiles/slurm): never wait forever
# each test: a few minutes; past this, it fails with the stacks (pytest-timeout) and the next one runs
pytestmark = [
    pytest.mark.timeout(2 * TIMEOUT),
    pytest.mark.skipif(
        not os.environ.get("GMC_SLURM_ACCOUNT"),
        reason="needs the one-node SLURM of .ci/slurm/cluster.sh: make test-slurm",
    ),
]


def config() -> dict:
    cfg = yaml.safe_load((REPO / "tests" / "data" / "workflow_config.yaml").read_text())
    cfg["tiny_model"]["max_steps"] = 30  # enough to earn some reward, so that training moves
    # 20 ms of wall clock per decoding step (no CPU), about half a second a step: a job can be
    # cancelled mid-run on a fast machine too; the numbers are those of the same runs without it
    cfg["train"].update(steps=STEPS, checkpoint_every=CHECKPOINT_EVERY, hf={"token_seconds": 0.02})
    cfg["sweep"].update(algorithm=["gmc"], delay=[0], group_size=[4], seed=[0, 1])
    cfg["sweep"].pop("references")  # the reduced sweep is the grid only
    cfg["latency"]["enabled"] = False
    cfg["resources"]["eval_with_training"] = False  # evaluation jobs of their own, as at paper scale
    return cfg


def env() -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def timeless(obj):
    """Drop wall-clock values (time/* metrics, timestamps, evaluation seconds) and per-run ids."""
    if isinstance(obj, dict):
        return {
            k: timeless(v)
            for k, v in obj.items()
            if not k.startswith("time/") and k not in ("time", "seconds", "run_id")
        }
    if isinstance(obj, list):
        return [timeless(v) for v in obj]
    return obj


def sacct() -> list[dict]:
    out = subprocess.run(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-a",
            "-S",
            "now-1hour",
            "-o",
            "JobID,JobName,State,Comment,AllocTRES,Partition,Account",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    keys = ["id", "name", "state", "comment", "tres", "partition", "account"]
    return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line]


def cancel_mid_run(run_dir: Path, found: dict, stop: threading.Event) -> None:
    """After the run's first checkpoint, remember its metrics so far and scancel its job."""
    metrics = run_dir / "metrics.jsonl"
    while not stop.is_set():
        if metrics.exists() and len(rows(metrics)) >= CHECKPOINT_EVERY + 2:
            found["before"] = rows(metrics)
            queue = subprocess.run(["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True).stdout
            for line in queue.splitlines():
                job, comment = line.split("|", 1)
                if comment == CANCELLED_JOB:
                    subprocess.run(["scancel", job], check=True)
                    found["job"] = job
                    return
        time.sleep(0.2)


def test_sweep_through_slurm_equals_local_and_survives_a_cancelled_job(tmp_path):
    for name in ("local", "slurm"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(config()))
    # the base models (one per seed) once, for both runs (their build is not what is compared)
    models = [f"results/models/tiny/seed~{s}" for s in config()["sweep"]["seed"]]
    build = subprocess.run(
        [*SNAKEMAKE, *models, "--cores", "2", *THREADS],
        cwd=tmp_path / "local",
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    shutil.copytree(tmp_path / "local" / "results", tmp_path / "slurm" / "results")
    local = subprocess.Popen(
        [*SNAKEMAKE, *TARGETS, "--cores", "8", *THREADS],
        cwd=tmp_path / "local",
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    found, stop = {}, threading.Event()
    watcher = threading.Thread(
        target=cancel_mid_run, args=(tmp_path / "slurm" / "results" / CANCELLED_RUN, found, stop), daemon=True
    )
    watcher.start()
    start = time.time()
    try:
        slurm = subprocess.run(
            [
                "timeout",
                str(TIMEOUT),
                *SNAKEMAKE,
                *TARGETS,
                "--workflow-profile",
                str(PROFILE),
                *THREADS,
                "--slurm-init-seconds-before-status-checks",
                "2",
                "--seconds-between-status-checks",
                "3",
            ],
            cwd=tmp_path / "slurm",
            env=env(),
            capture_output=True,
            text=True,
        )
        stop.set()
        seconds = time.time() - start
        local_out = local.communicate(timeout=TIMEOUT)[0]
    finally:
        stop.set()
        local.kill()
    log = slurm.stdout + slurm.stderr
    print(f"SLURM run: {seconds:.0f} s")
    assert slurm.returncode == 0, log[-6000:]
    assert local.returncode == 0, local_out[-4000:]
    assert "workflow specific profile" in log and str(PROFILE) in log

    # every job went through sbatch with the profile's resources and ended COMPLETED, except
    # the one cancelled, whose resubmission completed
    jobs = sacct()
    assert "job" in found, "the training job was not cancelled mid-run"
    states = {j["id"]: j["state"] for j in jobs}
    assert states[found["job"]].startswith("CANCELLED"), jobs
    assert all(s == "COMPLETED" for i, s in states.items() if i != found["job"]), jobs
    by_rule = {}
    for j in jobs:
        by_rule.setdefault(j["comment"].split("_wildcards")[0].removeprefix("rule_"), []).append(j)
    # a base model per seed: two base evaluations
    assert {r: len(v) for r, v in by_rule.items()} == {"train": 3, "evaluate": 2, "evaluate_base": 2}, jobs
    assert all(j["account"] == os.environ["GMC_SLURM_ACCOUNT"] for j in jobs)
    assert all(j["partition"] == os.environ["GMC_SLURM_PARTITION"] for j in jobs)
    for j in by_rule["train"]:  # the profile's train request: 16 CPUs, 125 GB, one GPU
        assert "cpu=16" in j["tres"] and "mem=125G" in j["tres"] and "gres/gpu=1" in j["tres"], j
    # small jobs ran on the submitting machine (localrules), not through sbatch
    assert "tables" not in by_rule and (tmp_path / "slurm" / "results" / "tables" / "main.csv").exists()

    # the resubmitted job resumed: the rows written before its checkpoint are kept as they
    # were, wall-clock times included (a fresh start would rewrite them)
    resumed = rows(tmp_path / "slurm" / "results" / CANCELLED_RUN / "metrics.jsonl")
    kept = [r for r in found["before"] if r["step"] < CHECKPOINT_EVERY]
    assert len(kept) == CHECKPOINT_EVERY and resumed[:CHECKPOINT_EVERY] == kept
    assert len(resumed) == STEPS

    # results equal the local run's, wall-clock times aside
    results = {name: tmp_path / name / "results" for name in ("local", "slurm")}
    files = sorted(
        p.relative_to(results["local"])
        for pattern in ("train/**/metrics.jsonl", "train/**/summary.json", "eval/**/*.json")
        for p in results["local"].glob(pattern)
    )
    # two runs, their evaluations, and each seed's base model evaluation
    assert sorted(f.name for f in files) == sorted(
        ["metrics.jsonl", "summary.json"] * 2 + ["eval_config.json", "synthetic.json"] * 4
    ), files
    trained = [rows(p) for p in (tmp_path / "slurm" / "results").glob("train/**/metrics.jsonl")]
    assert any(r["train/grad_norm"] > 0 for run in trained for r in run), "no update: the comparison is vacuous"
    for rel in files:
        a, b = (results[n] / rel for n in ("local", "slurm"))
        read = rows if rel.suffix == ".jsonl" else (lambda p: json.loads(p.read_text()))
        assert timeless(read(a)) == timeless(read(b)), rel


LONG_STEPS = 40
SIGNALLED_JOB = "rule_train_wildcards_gmc_0_4_0"
SIGNAL_AFTER = 2  # metrics rows: the trainer is in its loop with LONG_STEPS - 2 steps to go


def signal_mid_run(run_dir: Path, found: dict, stop: threading.Event) -> None:
    """Once the run has written SIGNAL_AFTER rows and its job is RUNNING, remember the rows and
    have SLURM send SIGTERM to the job's steps (`scancel --signal`, no --batch: what the
    time-limit warning does; the job stays RUNNING, unlike a plain scancel, which ends it)."""
    metrics = run_dir / "metrics.jsonl"
    while not stop.is_set():
        try:
            written = rows(metrics) if metrics.exists() else []
        except json.JSONDecodeError:  # a line being written
            written = []
        if len(written) >= SIGNAL_AFTER:
            queue = subprocess.run(["squeue", "-h", "-o", "%i|%k|%T"], capture_output=True, text=True).stdout
            for line in queue.splitlines():
                job, comment, state = line.split("|", 2)
                if comment == SIGNALLED_JOB and state == "RUNNING":
                    found["before"] = written
                    subprocess.run(["scancel", "--signal=TERM", job], check=True)
                    found["job"] = job
                    return
        time.sleep(0.2)


def test_a_training_job_signalled_before_its_time_limit_is_requeued_and_resumed(tmp_path):
    """SLURM's SIGTERM to a running training job (what `--signal=TERM@<lead>` sends before the time
    limit), sent by the test at a known point of the run, so that the outcome does not rest on
    the machine's speed against SLURM's signal timing: the trainer checkpoints at the step
    boundary and exits 75 while the job is RUNNING, the job requeues itself (one job id, no
    Snakemake retry), resumes from the checkpoint and ends equal to an uninterrupted local run."""
    earlier = {j["id"] for j in sacct()}
    cfg = config()
    # about half a second a step (the first test's pace): when the signal comes the run has tens
    # of steps to go, far longer than SLURM takes to deliver it; checked below, not assumed
    cfg["train"].update(steps=LONG_STEPS, checkpoint_every=0)
    cfg["sweep"].update(seed=[0])
    for name in ("local", "slurm"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(cfg))
    build = subprocess.run(
        [*SNAKEMAKE, "results/models/tiny/seed~0", "--cores", "2", *THREADS],
        cwd=tmp_path / "local",
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    shutil.copytree(tmp_path / "local" / "results", tmp_path / "slurm" / "results")
    local = subprocess.run(
        [*SNAKEMAKE, "train_all", "--cores", "2", *THREADS],
        cwd=tmp_path / "local",
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert local.returncode == 0, local.stderr[-3000:]
    run = "train/algo~gmc/delay~0/group~4/seed~0"
    found, stop = {}, threading.Event()
    watcher = threading.Thread(
        target=signal_mid_run, args=(tmp_path / "slurm" / "results" / run, found, stop), daemon=True
    )
    watcher.start()
    try:
        slurm = subprocess.run(
            [
                "timeout",
                str(TIMEOUT),
                *SNAKEMAKE,
                "train_all",
                "--workflow-profile",
                str(PROFILE),
                *THREADS,
                "--slurm-init-seconds-before-status-checks",
                "2",
                "--seconds-between-status-checks",
                "3",
            ],
            cwd=tmp_path / "slurm",
            env=env(),
            capture_output=True,
            text=True,
        )
    finally:
        stop.set()
    assert slurm.returncode == 0, (slurm.stdout + slurm.stderr)[-6000:]
    assert "job" in found, "the training job was not signalled mid-run"
    # one SLURM job, requeued by the rule (a Snakemake retry would be a second job id), completed
    jobs = sorted({j["id"] for j in sacct() if j["id"] not in earlier and j["comment"].startswith("rule_train")})
    history = subprocess.run(
        ["sacct", "-j", ",".join(jobs), "-D", "-X", "-n", "-P", "-o", "JobID,State"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    print(f"jobs {jobs}: {history}")
    assert jobs == [found["job"]], history
    assert any(h.endswith("|REQUEUED") for h in history), history
    assert {j["id"]: j["state"] for j in sacct()}[found["job"]] == "COMPLETED", history
    # it resumed: the rows written before the signal are kept as they were, wall-clock times
    # included (a fresh start would rewrite them), and the steps after the stop came a requeue later
    runs = {n: rows(tmp_path / n / "results" / run / "metrics.jsonl") for n in ("local", "slurm")}
    before = found["before"]
    assert runs["slurm"][: len(before)] == before
    gaps = [b["time"] - a["time"] for a, b in zip(runs["slurm"], runs["slurm"][1:])]
    stopped = max(range(len(gaps)), key=gaps.__getitem__) + 1  # the first step of the resumed job
    assert len(before) <= stopped < LONG_STEPS and gaps[stopped - 1] > 3, gaps
    assert len(runs["slurm"]) == LONG_STEPS and timeless(runs["slurm"]) == timeless(runs["local"])


def test_a_ray_training_job_inside_a_slurm_allocation(tmp_path):
    """profiles/slurm/ray_cluster.sh starts Ray in the allocation; gmc train joins it with
    delay.ray_address auto; two rollout workers train within the bound."""
    cfg = config()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    build = subprocess.run(
        [*SNAKEMAKE, "results/models/tiny/seed~0", "--cores", "2", *THREADS],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "gmc",
        "train",
        "--set",
        f"model={tmp_path / 'results/models/tiny/seed~0'}",
        "--set",
        "device=cpu",
        "--set",
        "steps=4",
        "--set",
        "prompts_per_step=4",
        "--set",
        "group_size=4",
        "--set",
        "delay.mode=ray",
        "--set",
        "delay.workers=2",
        "--set",
        "delay.max_staleness=2",
        "--set",
        "delay.ray_address=auto",
        "--out",
        str(out),
    ]
    job = subprocess.run(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "-A",
            os.environ["GMC_SLURM_ACCOUNT"],
            "-p",
            os.environ["GMC_SLURM_PARTITION"],
            "--nodes=1",
            "--cpus-per-task=2",
            "--time=10",
            "-o",
            str(tmp_path / "ray-%j.log"),
            str(PROFILE / "ray_cluster.sh"),
            *cmd,
        ],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    log = "".join(p.read_text() for p in tmp_path.glob("ray-*.log"))
    assert job.returncode == 0, job.stderr + log[-4000:]
    (state,) = {j["state"] for j in sacct() if j["id"] == job.stdout.strip().split(";")[0]}
    assert state == "COMPLETED"
    groups = rows(out / "groups.jsonl")
    assert len(groups) == 16 and {g["worker"] for g in groups} <= {0, 1} and max(g["staleness"] for g in groups) <= 2
    assert (out / "summary.json").exists() and "Started a local Ray instance" not in log  # it joined the allocation's
