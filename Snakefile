# gmc: asynchronous RL post-training with group-mass capping.
# data -> base model -> one training run per sweep point -> evaluation -> MLflow -> tables -> figures -> report
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/mlflow.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/theory.smk"


report: "workflow/report/workflow.rst"


rule all:
    default_target: True
    input:
        TABLES,
        FIGURES,
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
        TABLES,
        FIGURES,


rule theory:
    input:
        THEORY,
