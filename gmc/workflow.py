"""What the Snakemake workflow takes from the package: the schema of ``config.yaml`` and its
validation (the design's habit 3: validate early, fail clearly). No torch is imported.

The schema is one truth: the sections that configure a settings class (``train``: TrainConfig
minus the keys the workflow sets per job, :data:`SET_PER_JOB`; ``evaluate``: EvalConfig minus
the data settings; ``model.tiny``, ``model.random``; the ``delay`` of every named delay mode's
section) are generated from the dataclasses, and the names a sweep may use (estimators,
benchmarks) from their registries; only the sections without a dataclass (``sweep``, the named
delay sections' shape, ``data``, ``mlflow``, ``resources``, ...) are written by hand, in
``workflow/schemas/config.schema.yaml``, which refers to the generated parts as
``#/$defs/<name>``.
"""

from __future__ import annotations

import copy
from typing import Any

from gmc.asynchrony import DelayConfig, named_delays
from gmc.config import TrainConfig
from gmc.data import benchmark_specs
from gmc.estimator_info import REGISTRY
from gmc.evaluate import EvalConfig
from gmc.random_model import RandomModelConfig
from gmc.settings import ConfigError, from_dict, json_schema
from gmc.synthetic import SyntheticTask
from gmc.tiny import TinyModelConfig

SET_PER_JOB: dict[str, str] = {
    "model": "model.name (the fetched, built or given model folder)",
    "algorithm": "the sweep point", "group_size": "the sweep point", "seed": "the sweep point",
    "delay.mode": "the sweep point", "delay.d": "the sweep point",
    "data_source": "data.source", "data_root": "data.root",
    "experiment": "mlflow.experiment", "tracking_uri": "mlflow.tracking_uri (live logging)",
    "estimator.max_new_tokens": "sampling.max_new_tokens",
    "synthetic": "the synthetic section",
}
"""TrainConfig keys that the ``train`` section does not hold, and where each comes from."""

EVAL_SET_PER_JOB = ("data_source", "data_root", "synthetic")
"""EvalConfig keys that come from the ``data`` and ``synthetic`` sections."""


def generated_defs() -> dict[str, Any]:
    """The schema parts generated from the settings classes and registries, by ``$defs`` name."""
    return {
        "train": json_schema(TrainConfig, drop=SET_PER_JOB),
        "evaluate": json_schema(EvalConfig, drop=EVAL_SET_PER_JOB),
        "synthetic": json_schema(SyntheticTask),
        "tiny_model": json_schema(TinyModelConfig, drop={"synthetic": "the synthetic section"}),
        "random_model": json_schema(RandomModelConfig),
        "named_delay_settings": json_schema(DelayConfig, drop=("mode", "d")),
        "estimator": {"type": "string", "enum": list(REGISTRY), "description": "A registered estimator."},
        "benchmark": {"type": "string", "enum": list(benchmark_specs()), "description": "A registered benchmark."},
    }


def schema(handwritten: dict[str, Any]) -> dict[str, Any]:
    """The whole schema of ``config.yaml``: the hand-written ``handwritten`` with the generated
    ``$defs`` and one section per named delay mode (``latency``: its runs, with that mode's
    settings), shaped like ``$defs/named_delay``."""
    out = copy.deepcopy(handwritten)
    out.setdefault("$defs", {}).update(generated_defs())
    for mode in named_delays():
        section = copy.deepcopy(out["$defs"]["named_delay"])
        section["description"] = f"Runs under the delay mode {mode!r} (delay~{mode}): {section['description']}"
        out["properties"].setdefault(mode, section)
    return out


def fill_defaults(config: dict[str, Any], node: dict[str, Any]) -> None:
    """Set every absent key that the hand-written ``node`` gives a default, recursively
    (generated parts, reached through ``$ref``, keep their defaults to the dataclasses)."""
    for name, sub in node.get("properties", {}).items():
        if name not in config and "default" in sub:
            config[name] = copy.deepcopy(sub["default"])
        if isinstance(config.get(name), dict) and "properties" in sub:
            fill_defaults(config[name], sub)


def validate(config: dict[str, Any], handwritten: dict[str, Any]) -> dict[str, Any]:
    """Fill ``config``'s defaults and validate it against :func:`schema`, then build its train and
    evaluate sections as the jobs will (cross-key checks included); a :class:`ConfigError` names
    the key and the allowed values. Returns the full schema."""
    import jsonschema

    full = schema(handwritten)
    fill_defaults(config, full)
    validator = jsonschema.Draft202012Validator(full)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "config"
        raise ConfigError(error.message, where)
    for section, cls in (("train", TrainConfig), ("evaluate", EvalConfig)):
        try:
            from_dict(cls, config[section])
        except ConfigError as e:
            raise ConfigError(e.reason, f"{section}.{e.key}" if e.key else section) from None
    return full
