# Sweep points, paths and helpers shared by the rules. Every output path names its parameters
# (gmc.sweep.points.POINT); tables, figures and theory files come from the registries of gmc.results.outputs.
import os
from pathlib import Path

from gmc.results.outputs import (
    ANALYSIS,
    FIGURES,
    GRADIENT_LAB_FILES,
    LAB_FOLDER,
    TABLES,
    THEORY_FILES,
    figure_files,
    table_files,
)
from gmc.policy.preflight import check_model_dir
from gmc.run.rundir import SHARED as SHARED_FILE
from gmc.settings import to_dict
from gmc.workflow import lab_values
from gmc.sweep.points import (
    ALGO_WILDCARD,
    base_eval_dirs,
    BUILT_MODELS,
    PER_SEED_MODELS,
    POINT,
    Point,
    delay_wildcard,
    model_dir,
    model_settings,
    per_seed_path,
    sweep_points,
)
from gmc.sweep.resolve import (
    eval_values,
    lab_history,
    resolve_eval,
    resolve_run,
    shared_histories,
    shared_prefills,
    shared_runs,
)

RESULTS = config["results"]
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


def conda_env(rule, config_gpus):
    """envs/gpu.yaml if `rule` gets GPUs (the profile's set-resources, else the config), else cpu."""
    profile = workflow.resource_settings.overwrite_resources.get(rule, {})
    gpus = profile["gpu"] if "gpu" in profile else config_gpus
    gpus = getattr(gpus, "value", gpus)
    return "../../envs/gpu.yaml" if int(gpus or 0) > 0 else CONDA_ENV


BENCHMARKS = list(resolve_eval(config).benchmarks)


wildcard_constraints:
    algo=ALGO_WILDCARD,
    delay=delay_wildcard(),
    group=r"\d+",
    seed=r"\d+",
    history=r"[0-9a-f]{16}",
    prefill=r"[0-9a-f]{16}",


MODEL_NAME = config["model"]["name"]
# one base model for every seed, or one per seed (the tiny model's warm start: gmc.sweep.points.PER_SEED_MODELS)
MODEL_DIR = None if MODEL_NAME in PER_SEED_MODELS else model_dir(config)
# a local folder of weights is used where it is (checked now, before any job: config, weights,
# tokenizer); a hub id is fetched once into the results folder, a built model made there
LOCAL_MODEL = MODEL_DIR == MODEL_NAME
if LOCAL_MODEL:
    check_model_dir(MODEL_NAME)


def per_seed(path, ext=""):
    """``path`` with a ``seed~{seed}`` level where each seed has its own base model, then ``ext``."""
    return per_seed_path(config, path, ext=ext)


def seed_of(wildcards):
    """The seed of a job whose paths have one (a model built per seed), else None."""
    return int(wildcards.seed) if "seed" in wildcards.keys() else None


def base_model(wildcards):
    """The base model of a point's (or a base evaluation's) seed."""
    return model_dir(config, seed_of(wildcards))


POINTS = sweep_points(config)
# points whose run is provably identical to another's (on-policy, one on-policy class): trained once
SHARED = shared_runs(config, POINTS)
# fixed-delay runs of one prefill class (every setting but the estimator): the prefill generated once
PREFILLS = shared_prefills(config, POINTS)
PREFILL_MAKERS = {name: point for name, point in PREFILLS.values()}
# runs that start from one on-policy history (warmup: history; every setting but the estimator
# and the delay): the history trained once, keeping the batches the largest fixed delay needs
HISTORIES = shared_histories(config, POINTS)
HISTORY_MAKERS = {}
for _point, (_name, _keep) in HISTORIES.items():
    HISTORY_MAKERS.setdefault(_name, (_point, _keep))
RUN_DIRS = [f"{RESULTS}/train/{p.path}" for p in POINTS]
# the training set every run reads (the train section's, shared by the sweep)
TRAIN_DATA = resolve_run(config, POINTS[0]).train_data
TRAIN_DONE = [
    f"{RESULTS}/train/{p.path}/{SHARED_FILE if p in SHARED else 'summary.json'}"
    for p in POINTS
]
EVAL_DIRS = [
    f"{RESULTS}/eval/{p.path}" for p in POINTS if p not in SHARED
] + base_eval_dirs(config)
EVAL_DONE = [f"{d}/{b}.json" for d in EVAL_DIRS for b in BENCHMARKS]
# each trained run evaluated by its own training job (gmc train --evaluate), not a job of its own
EVAL_WITH_TRAINING = config["resources"]["eval_with_training"]
POINT_EVAL = [f"{RESULTS}/eval/{POINT}/{b}.json" for b in BENCHMARKS]
MLFLOW_DONE = f"{RESULTS}/mlflow/synced.json"
TABLE_FILES = [f"{RESULTS}/tables/{f}" for t in TABLES for f in table_files(t)]
FIGURE_FILES = [
    f"{RESULTS}/figures/{f}" for name in FIGURES for f in figure_files(name)
]
THEORY = [f"{RESULTS}/theory/{f}" for f in THEORY_FILES]
GRADIENT_LAB = [f"{RESULTS}/{LAB_FOLDER}/{f}" for f in GRADIENT_LAB_FILES]
LAB_HISTORY = lab_history(config, POINTS) if config["gradient_lab"]["enabled"] else None


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
    return Point(
        wildcards.algo, wildcards.delay, int(wildcards.group), int(wildcards.seed)
    )


def run_config(wildcards):
    """The whole TrainConfig of the run at a point, as plain values (gmc.sweep.resolve.resolve_run)."""
    return to_dict(resolve_run(config, point_of(wildcards)))


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
