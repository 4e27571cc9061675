# Sweep points, paths and helpers shared by the rules. Every output path names its parameters
# (gmc.sweep.POINT); tables, figures and theory files come from the registries of gmc.outputs.
import itertools
import os
import shlex
from pathlib import Path

from gmc.asynchrony import named_delays
from gmc.config import TrainConfig
from gmc.evaluate import EvalConfig
from gmc.preflight import check_model_dir, looks_local
from gmc.outputs import FIGURES, TABLES, THEORY_FILES, figure_files, table_files
from gmc.settings import from_dict
from gmc.sweep import (
    ALGO_WILDCARD,
    POINT,
    TRACE_PREFIX,
    delay_settings,
    delay_wildcard,
    point_path,
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


SWEEP = config["sweep"]
# delay modes swept by name (delay~latency), each with its config section (gmc.asynchrony.DELAY_MODES)
NAMED_DELAYS = {m: config[m] for m in named_delays() if config[m]["enabled"]}
TRACES = config[
    "traces"
]  # name -> {file, algorithms, group_sizes}: points delay~trace-<name>
# the train and evaluate sections as the jobs read them (the settings classes fill their defaults)
TRAIN = from_dict(TrainConfig, config["train"])
BENCHMARKS = list(from_dict(EvalConfig, config["evaluate"]).benchmarks)


wildcard_constraints:
    algo=ALGO_WILDCARD,
    delay=delay_wildcard(),
    group=r"\d+",
    seed=r"\d+",


def _run_dirs():
    points = list(
        itertools.product(
            SWEEP["algorithms"], SWEEP["delays"], SWEEP["group_sizes"], SWEEP["seeds"]
        )
    )
    refs = SWEEP["references"]
    points += itertools.product(
        refs["algorithms"], refs["delays"], SWEEP["group_sizes"], SWEEP["seeds"]
    )
    sections = {**NAMED_DELAYS, **{f"{TRACE_PREFIX}{n}": t for n, t in TRACES.items()}}
    for delay, section in sections.items():
        points += [
            (a, delay, g, s)
            for a, g, s in itertools.product(
                section["algorithms"], section["group_sizes"], SWEEP["seeds"]
            )
        ]
    return list(dict.fromkeys(f"{RESULTS}/train/{point_path(*p)}" for p in points))


BUILT_MODELS = ("tiny", "random-qwen3")  # built locally by a rule of model.smk
MODEL_NAME = config["model"]["name"]
# a local folder of weights is used where it is (checked now, before any job: config, weights,
# tokenizer); a hub id is fetched once into the results folder
LOCAL_MODEL = MODEL_NAME not in BUILT_MODELS and looks_local(MODEL_NAME)
if LOCAL_MODEL:
    check_model_dir(MODEL_NAME)


def _model_dir():
    if LOCAL_MODEL:
        return MODEL_NAME
    if MODEL_NAME in BUILT_MODELS:
        return f"{RESULTS}/models/{MODEL_NAME}"
    return f"{RESULTS}/models/{'--'.join(Path(MODEL_NAME).parts)}"


RUN_DIRS = _run_dirs()
MODEL_DIR = _model_dir()
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


def train_values():
    """The TrainConfig keys every run shares: the train section, with the data and mlflow
    settings (the model and the sweep point are set per job)."""
    return dict(
        config["train"],
        data_source=config["data"]["source"],
        data_root=config["data"]["root"],
        experiment=config["mlflow"]["experiment"],
        synthetic=config["synthetic"],
    )


def eval_values():
    """The EvalConfig of every evaluation job: the evaluate section with the data and synthetic
    task settings."""
    return dict(
        config["evaluate"],
        data_source=config["data"]["source"],
        data_root=config["data"]["root"],
        synthetic=config["synthetic"],
    )


def settings_overrides(values, prefix=""):
    """`--set key=value` items of a (nested) mapping of settings."""
    out = []
    for k, v in values.items():
        if isinstance(v, dict):
            out.append(settings_overrides(v, f"{prefix}{k}."))
        else:
            out.append(f"--set {shlex.quote(f'{prefix}{k}={v}')}")
    return " ".join(o for o in out if o)


def train_overrides(wildcards):
    sets = {
        "algorithm": wildcards.algo,
        "group_size": wildcards.group,
        "seed": wildcards.seed,
    }
    sets.update(delay_settings(wildcards.delay, NAMED_DELAYS, TRACES))
    return settings_overrides(sets)
