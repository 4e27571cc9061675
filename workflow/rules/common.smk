# Sweep points, paths and helpers shared by the rules, all read from the resolved sweep (SWEEP,
# gmc.sweep.resolve.Sweep) and its configuration (CONFIG, gmc.workflow.WorkflowConfig). Every output
# path names its parameters (gmc.sweep.points.POINT); tables, figures and theory files come from the
# registries of gmc.results.outputs.
import os
from pathlib import Path

from gmc.results.outputs import (
    ANALYSIS,
    FIGURES,
    GRADIENT_LAB_FILES,
    LAB_FOLDER,
    TABLES,
    THEORY_FILES,
    TUNED,
    figure_files,
    table_entry,
    table_files,
    table_names,
)
from gmc.policy.preflight import check_model_dir
from gmc.run.rundir import SHARED as SHARED_FILE
from gmc.settings import to_dict
from gmc.sweep.points import ALGO_WILDCARD, POINT, Delay, Point
from gmc.sweep.resolve import BUILT_MODELS

RESULTS = CONFIG.results
# conda environments for --sdm conda: envs/cpu.yaml for every job except those given GPUs, which
# get envs/gpu.yaml (CUDA torch, vLLM). The env files install the project from GMC_REPO (this
# checkout), since Snakemake runs them from copies under .snakemake/conda/.
os.environ.setdefault("GMC_REPO", workflow.basedir)
CONDA_ENV = "../../envs/cpu.yaml"
# what starts a seed's runs goes first: its base model's warm start, then its history or
# prefill, so that no seed's chain of long jobs is left for the end while the other cores idle;
# the small jobs they wait on (the model's config, the run configs, the data) as early (Snakemake
# gives a job's priority to none of its inputs)
BUILD_PRIORITY = 20
START_PRIORITY = 10
TRAIN_GPUS = CONFIG.resources.train_gpus
EVAL_GPUS = CONFIG.resources.eval_gpus


def conda_env(rule, config_gpus):
    """envs/gpu.yaml if `rule` gets GPUs (the profile's set-resources, else the config), else cpu."""
    profile = workflow.resource_settings.overwrite_resources.get(rule, {})
    gpus = profile["gpu"] if "gpu" in profile else config_gpus
    gpus = getattr(gpus, "value", gpus)
    return "../../envs/gpu.yaml" if int(gpus or 0) > 0 else CONDA_ENV


BENCHMARKS = list(SWEEP.evaluation.benchmarks)


wildcard_constraints:
    algo=ALGO_WILDCARD,
    delay=Delay.wildcard(),
    group=r"\d+",
    seed=r"\d+",
    history=r"[0-9a-f]{16}",
    prefill=r"[0-9a-f]{16}",


MODEL_NAME = CONFIG.model
# one base model for every seed, or one per seed (the tiny model's warm start: gmc.sweep.resolve.PER_SEED_MODELS)
MODEL_DIR = None if SWEEP.per_seed_model else SWEEP.model_dir()
# a local folder of weights is used where it is (checked now, before any job: config, weights,
# tokenizer); a hub id is fetched once into the results folder, a built model made there
LOCAL_MODEL = MODEL_DIR == MODEL_NAME
if LOCAL_MODEL:
    check_model_dir(MODEL_NAME)


def per_seed(path, ext=""):
    """``path`` with a ``seed~{seed}`` level where each seed has its own base model, then ``ext``."""
    return SWEEP.per_seed_path(path, ext=ext)


def seed_of(wildcards):
    """The seed of a job whose paths have one (a model built per seed), else None."""
    return int(wildcards.seed) if "seed" in wildcards.keys() else None


def base_model(wildcards):
    """The base model of a point's (or a base evaluation's) seed."""
    return SWEEP.model_dir(seed_of(wildcards))


POINTS = SWEEP.points
# points whose run is provably identical to another's (on-policy, one on-policy class): trained once
SHARED = SWEEP.shared
# fixed-delay runs of one prefill class (every setting but the estimator): the prefill generated once
PREFILLS = SWEEP.prefills
PREFILL_MAKERS = {name: point for name, point in PREFILLS.values()}
# runs that start from one on-policy history (warmup: history; every setting but the estimator
# and the delay): the history trained once, generating the queue of each fixed delay among them
HISTORIES = SWEEP.histories
HISTORY_MAKERS = SWEEP.history_makers()
# the training set every run reads (the train section's, shared by the sweep)
TRAIN_DATA = SWEEP.run(POINTS[0]).train_data
TRAIN_DONE = [
    f"{RESULTS}/train/{p.path}/{SHARED_FILE if p in SHARED else 'summary.json'}"
    for p in POINTS
]
EVAL_DIRS = [
    f"{RESULTS}/eval/{p.path}" for p in POINTS if p not in SHARED
] + SWEEP.base_eval_dirs()
EVAL_DONE = [f"{d}/{b}.json" for d in EVAL_DIRS for b in BENCHMARKS]
# each trained run evaluated by its own training job (gmc train --evaluate), not a job of its own
EVAL_WITH_TRAINING = CONFIG.resources.eval_with_training
POINT_EVAL = [f"{RESULTS}/eval/{POINT}/{b}.json" for b in BENCHMARKS]
MLFLOW_DONE = f"{RESULTS}/mlflow/synced.json"
TABLE_FILES = [
    f"{RESULTS}/tables/{f}"
    for t in table_names(CONFIG.analysis)
    for f in table_files(t)
]
# a tuning sweep's choice, which another sweep trains with
if CONFIG.analysis.get("tune"):
    TABLE_FILES.append(f"{RESULTS}/{TUNED}")
FIGURE_FILES = [
    f"{RESULTS}/figures/{f}" for name in FIGURES for f in figure_files(name)
]
THEORY = [f"{RESULTS}/theory/{f}" for f in THEORY_FILES]
GRADIENT_LAB = [f"{RESULTS}/{LAB_FOLDER}/{f}" for f in GRADIENT_LAB_FILES]
LAB_HISTORY = (
    SWEEP.lab_history(CONFIG.lab.history_seed, CONFIG.lab.history_group_size)
    if CONFIG.lab.enabled
    else None
)


def folder(side, key=0, up=1):
    """A params function: the folder ``up`` levels above the rule's ``side`` ("input" or
    "output") file ``key`` (an index or a name)."""

    def folder_of(wildcards, input, output):
        files = {"input": input, "output": output}[side]
        path = getattr(files, key) if isinstance(key, str) else files[key]
        return str(Path(path).parents[up - 1])

    return folder_of


# a job that may stop with a checkpoint (gmc train, gmc history), and the requeue of a SLURM job
# stopped before its time limit
REQUEUE_SCRIPT = Path(workflow.basedir, "workflow", "scripts", "requeue.sh")


def point_of(wildcards):
    """The sweep point a job's wildcards name."""
    return Point.of(wildcards.algo, wildcards.delay, wildcards.group, wildcards.seed)


def run_config(wildcards):
    """The whole TrainConfig of the run at a point, as plain values (SWEEP.run: built once)."""
    return to_dict(SWEEP.run(point_of(wildcards)))


def shared_run(wildcards):
    """The point whose run a shared point's is."""
    return SHARED[point_of(wildcards)]


def history_summary(wildcards):
    """The shared history a point's run starts from (none without warmup: history)."""
    point = point_of(wildcards)
    return (
        [f"{RESULTS}/history/{HISTORIES[point][0]}/summary.json"]
        if point in HISTORIES
        else []
    )


def prefill_file(wildcards):
    """The shared prefill a point's run starts from (none where it generates its own)."""
    point = point_of(wildcards)
    return [f"{RESULTS}/prefill/{PREFILLS[point][0]}.pt"] if point in PREFILLS else []
