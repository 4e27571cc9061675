# gmc: asynchronous RL post-training with group-mass capping.
# data -> base model -> one training run per sweep point -> evaluation -> MLflow -> tables -> figures -> report
from pathlib import Path

import yaml
from snakemake.utils import min_version

import gmc.workflow

min_version("9.0")


# a preset given with --configfile is the whole science: config.yaml is read only without one
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# defaults filled, --config's strings read as the jobs read values, then validated against the
# schema (hand-written parts + those generated from the settings classes and registries) and
# every run resolved (gmc.sweep.resolve_run); a bad key stops here, naming it and what it allows
with open(Path(workflow.basedir, "workflow", "schemas", "config.schema.yaml")) as fh:
    gmc.workflow.validate(config, yaml.safe_load(fh))


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/mlflow.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/theory.smk"


report: "workflow/report/workflow.rst"


# on the submitting machine, not as cluster jobs: downloads (it has the network), config
# writers (model_config in model.smk), the data check, the MLflow parent run and import, tables and figures (seconds each);
# fetch_model (model.smk) is marked there
localrules:
    all,
    train_all,
    eval_all,
    figures,
    theory,
    prepare_data,
    train_config,
    share_run,
    eval_config,
    mlflow_sweep,
    mlflow_sync,
    tables,
    figures_from_results,


rule all:
    default_target: True
    input:
        TABLE_FILES,
        FIGURE_FILES,
        MLFLOW_DONE,
        THEORY,


rule train_all:
    input:
        TRAIN_DONE,


rule eval_all:
    input:
        EVAL_DONE,


rule figures:
    input:
        TABLE_FILES,
        FIGURE_FILES,


rule theory:
    input:
        THEORY,
