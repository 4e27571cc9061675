# Sweep points, paths and helpers shared by the rules. Every output path names its parameters
# (gmc.sweep.POINT); tables, figures and theory files come from the registries of gmc.outputs.
import os
from pathlib import Path

from gmc.outputs import FIGURES, TABLES, THEORY_FILES, figure_files, table_files
from gmc.preflight import check_model_dir
from gmc.settings import to_dict
from gmc.sweep import (
    ALGO_WILDCARD,
    POINT,
    Point,
    delay_wildcard,
    eval_values,
    model_dir,
    resolve_eval,
    resolve_run,
    sweep_points,
)

RESULTS = config["results"]
# conda environments for --sdm conda: envs/cpu.yaml for every job except those given GPUs, which
# get envs/gpu.yaml (CUDA torch, vLLM). The env files install the project from GMC_REPO (this
# checkout), since Snakemake runs them from copies under .snakemake/conda/.
os.environ.setdefault("GMC_REPO", workflow.basedir)
CONDA_ENV = "../../envs/cpu.yaml"


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


MODEL_NAME = config["model"]["name"]
MODEL_DIR = model_dir(config)
# a local folder of weights is used where it is (checked now, before any job: config, weights,
# tokenizer); a hub id is fetched once into the results folder, a built model made there
LOCAL_MODEL = MODEL_DIR == MODEL_NAME
if LOCAL_MODEL:
    check_model_dir(MODEL_NAME)


POINTS = sweep_points(config)
RUN_DIRS = [f"{RESULTS}/train/{p.path}" for p in POINTS]
# the training set every run reads (the train section's, shared by the sweep)
TRAIN_DATA = resolve_run(config, POINTS[0]).train_data
TRAIN_DONE = [f"{d}/summary.json" for d in RUN_DIRS]
EVAL_DIRS = [
    str(Path(RESULTS, "eval", Path(d).relative_to(Path(RESULTS, "train"))))
    for d in RUN_DIRS
] + [f"{RESULTS}/eval/base"]
EVAL_DONE = [f"{d}/{b}.json" for d in EVAL_DIRS for b in BENCHMARKS]
MLFLOW_DONE = f"{RESULTS}/mlflow/synced.json"
TABLE_FILES = [f"{RESULTS}/tables/{f}" for t in TABLES for f in table_files(t)]
FIGURE_FILES = [
    f"{RESULTS}/figures/{f}" for name in FIGURES for f in figure_files(name)
]
THEORY = [f"{RESULTS}/theory/{f}" for f in THEORY_FILES]


def run_config(wildcards):
    """The whole TrainConfig of the run at a point, as plain values (gmc.sweep.resolve_run)."""
    point = Point(
        wildcards.algo, wildcards.delay, int(wildcards.group), int(wildcards.seed)
    )
    return to_dict(resolve_run(config, point))
