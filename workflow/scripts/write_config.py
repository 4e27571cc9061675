"""Validate one config section against its dataclass and write it as YAML (snakemake script)."""

import sys

import yaml

from gmc.config import TrainConfig, from_dict
from gmc.evaluate import EvalConfig
from gmc.io import write_text

sm = snakemake  # noqa: F821  (injected by Snakemake)
sys.stderr = open(sm.log[0], "w")
values = dict(sm.params["values"])
cls = {"train": TrainConfig, "eval": EvalConfig}[sm.params["kind"]]
from_dict(cls, values)  # a bad key or value stops the workflow here, naming it
write_text(sm.output[0], yaml.safe_dump(values, sort_keys=False))
