"""Validate one config against its settings class and write it as YAML (snakemake script)."""

import sys

import yaml

from gmc.io import write_text
from gmc.results.outputs import AnalysisConfig
from gmc.run.config import TrainConfig
from gmc.run.evaluate import EvalConfig
from gmc.run.random_model import RandomModelConfig
from gmc.run.tiny_model import TinyModelConfig
from gmc.settings import from_dict
from gmc.theory.config import GradientLabConfig

sm = snakemake  # noqa: F821  (injected by Snakemake)
sys.stderr = open(sm.log[0], "w")
values = dict(sm.params["values"])
kinds = {
    "train": TrainConfig,
    "eval": EvalConfig,
    "tiny": TinyModelConfig,
    "random-qwen3": RandomModelConfig,
    "analysis": AnalysisConfig,
    "gradient_lab": GradientLabConfig,
}
from_dict(kinds[sm.params["kind"]], values)  # a bad key or value stops the workflow here, naming it
write_text(sm.output[0], yaml.safe_dump(values, sort_keys=False))
