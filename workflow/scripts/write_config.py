"""Validate one config section against its settings class and write it as YAML (snakemake script)."""

import sys

import yaml

from gmc.config import TrainConfig
from gmc.evaluate import EvalConfig
from gmc.io import write_text
from gmc.settings import from_dict

sm = snakemake  # noqa: F821  (injected by Snakemake)
sys.stderr = open(sm.log[0], "w")
values = dict(sm.params["values"])
cls = {"train": TrainConfig, "eval": EvalConfig}[sm.params["kind"]]
from_dict(cls, values)  # a bad key or value stops the workflow here, naming it
write_text(sm.output[0], yaml.safe_dump(values, sort_keys=False))
