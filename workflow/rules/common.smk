# Sweep points, paths and helpers shared by the rules. Every output path names its parameters.
import itertools
import os
from pathlib import Path

from gmc.asynchrony import named_delays

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
NAMED_DELAYS = {
    m: config[m] for m in named_delays() if m in config and config[m]["enabled"]
}
BENCHMARKS = config["evaluate"]["benchmarks"]


wildcard_constraints:
    algo="[a-z]+",
    delay="|".join([r"\d+", *named_delays()]),
    group=r"\d+",
    seed=r"\d+",


def _run_dirs():
    points = list(
        itertools.product(
            SWEEP["algorithms"], SWEEP["delays"], SWEEP["group_sizes"], SWEEP["seeds"]
        )
    )
    refs = SWEEP.get("references") or {"algorithms": [], "delays": []}
    points += itertools.product(
        refs["algorithms"], refs["delays"], SWEEP["group_sizes"], SWEEP["seeds"]
    )
    dirs = list(
        dict.fromkeys(
            f"{RESULTS}/train/algo~{a}/delay~{d}/group~{g}/seed~{s}"
            for a, d, g, s in points
        )
    )
    for mode, section in NAMED_DELAYS.items():
        dirs += [
            f"{RESULTS}/train/algo~{a}/delay~{mode}/group~{g}/seed~{s}"
            for a, g, s in itertools.product(
                section["algorithms"], section["group_sizes"], SWEEP["seeds"]
            )
        ]
    return dirs


def _model_dir():
    name = config["model"]["name"]
    if name == "tiny":
        return f"{RESULTS}/models/tiny"
    return f"{RESULTS}/models/{'--'.join(Path(name).parts)}"


RUN_DIRS = _run_dirs()
MODEL_DIR = _model_dir()
TRAIN_DONE = [f"{d}/summary.json" for d in RUN_DIRS]
EVAL_DIRS = [
    str(Path(RESULTS, "eval", Path(d).relative_to(Path(RESULTS, "train"))))
    for d in RUN_DIRS
] + [f"{RESULTS}/eval/base"]
EVAL_DONE = [f"{d}/{b}.json" for d in EVAL_DIRS for b in BENCHMARKS]
MLFLOW_DONE = f"{RESULTS}/mlflow/synced.json"
TABLE_NAMES = ["main", "diagnostics", "paired"]
TABLES = [
    f"{RESULTS}/tables/{t}.{ext}" for t in TABLE_NAMES for ext in ("csv", "md", "tex")
]
FIGURE_NAMES = [
    "reward_vs_step",
    "score_vs_delay",
    "score_vs_group",
    "ratio_diagnostics",
    "staleness_vs_length",
]
FIGURES = [f"{RESULTS}/figures/{f}.png" for f in FIGURE_NAMES]
THEORY = [
    f"{RESULTS}/theory/{f}"
    for f in (
        "fixed_policy.csv",
        "claims.csv",
        "delayed_summary.csv",
        "theory_bias_vs_G_exact_baseline.png",
        "theory_bias_vs_eps.png",
        "theory_shortfall_vs_eps.png",
        "theory_reward_vs_delay.png",
    )
]


def train_values():
    """The TrainConfig keys every run shares: the train section, with the data and mlflow
    settings (the model and the sweep point are set per job)."""
    return dict(
        config["train"],
        data_source=config["data"]["source"],
        data_root=config["data"]["root"],
        experiment=config["mlflow"]["experiment"],
    )


def eval_values():
    """The EvalConfig of every evaluation job: the evaluate section with the data settings."""
    return dict(
        config["evaluate"],
        data_source=config["data"]["source"],
        data_root=config["data"]["root"],
    )


def train_overrides(wildcards):
    sets = {
        "algorithm": wildcards.algo,
        "group_size": wildcards.group,
        "seed": wildcards.seed,
    }
    if wildcards.delay in NAMED_DELAYS:
        sets["delay.mode"] = wildcards.delay
        sets.update(
            {f"delay.{k}": v for k, v in NAMED_DELAYS[wildcards.delay]["delay"].items()}
        )
    else:
        sets["delay.mode"] = "fixed"
        sets["delay.d"] = wildcards.delay
    return " ".join(f"--set {k}={v}" for k, v in sets.items())
