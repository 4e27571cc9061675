# gmc: asynchronous RL post-training with group-mass capping.
# data -> base model -> one training run per sweep point -> evaluation -> MLflow -> tables -> figures -> report
import os
import sys
from pathlib import Path

from snakemake.utils import min_version

import gmc.workflow

min_version("9.0")


# the jobs run `python -m gmc`: the folder of the interpreter that runs Snakemake (and imported gmc
# above) goes first on their PATH, so `.venv/bin/snakemake` needs no activated environment; a job's
# conda environment (--sdm conda) still comes before it, and a SLURM job is handed it (envvars)
envvars:
    "PATH",


os.environ["PATH"] = os.pathsep.join(
    [str(Path(sys.executable).parent), os.environ["PATH"]]
)


# a preset given with --configfile is the whole science: config.yaml is read only without one
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# read once: the previous release's keys renamed (a line each), --config's strings read as the
# jobs read values, validated by the settings classes (gmc.workflow.WorkflowConfig), and the sweep
# resolved (gmc.sweep.resolve.Sweep: every run's config built once); a bad key stops here, naming
# it and what it allows
SWEEP = gmc.workflow.load(config)
CONFIG = SWEEP.config
# what Snakemake holds as the config is the loaded one, in today's spelling with its classes'
# defaults: the report's text reads it (snakemake.config, workflow/report/workflow.rst)
config.clear()
config.update(gmc.workflow.plain_config(SWEEP))


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/mlflow.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/theory.smk"


report: "workflow/report/workflow.rst"


# Rules marked `localrule: True` run on the submitting machine, not as cluster jobs: the named
# targets, downloads (it has the network), config writers, the data check, the MLflow parent run
# and import, tables and figures (seconds each).


rule all:
    default_target: True
    input:
        TABLE_FILES,
        FIGURE_FILES,
        MLFLOW_DONE,
        THEORY,
        GRADIENT_LAB if CONFIG.lab.enabled else [],
    localrule: True


rule train_all:
    input:
        TRAIN_DONE,
    localrule: True


rule eval_all:
    input:
        EVAL_DONE,
    localrule: True


rule figures:
    input:
        TABLE_FILES,
        FIGURE_FILES,
    localrule: True


rule theory:
    input:
        THEORY,
    localrule: True
