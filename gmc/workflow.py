"""What the Snakemake workflow takes from the package: the schema of ``config.yaml``, the
coercion of the values Snakemake hands over, and the validation of the whole configuration
(the design's habit 3: validate early, fail clearly). An entry point beside the CLI: its sections
configure every room. No torch is imported.

The schema is one truth: the sections that configure a settings class (``train``: TrainConfig
minus the keys a run takes from elsewhere, :data:`gmc.sweep.resolve.RUN_KEYS`; ``evaluate``:
EvalConfig minus the data settings; ``analysis``: AnalysisConfig; ``model.tiny``,
``model.random``; the ``delay`` of every named delay mode's section, with the keys that mode
reads) are generated from the dataclasses, and the names
a sweep may use (estimators, benchmarks) from their registries; only the sections without a
dataclass (``sweep``, the named delay sections' shape, ``data``, ``mlflow``, ``resources``, ...)
are written by hand, in ``workflow/schemas/config.schema.yaml``, which refers to the generated
parts as ``#/$defs/<name>``.

Snakemake hands ``--config`` values over as strings (``train={steps: 10}`` gives ``'10'``);
:func:`coerce` reads every string where the schema wants no string as YAML, as a job's own
``--set`` does, before anything is checked.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from gmc.estimators import REGISTRY
from gmc.results.outputs import AnalysisConfig
from gmc.rollouts.delays import DELAY_MODES, DelayConfig, named_delays
from gmc.run.config import TrainConfig
from gmc.run.evaluate import EvalConfig
from gmc.run.random_model import RandomModelConfig
from gmc.run.tiny_model import TinyModelConfig
from gmc.settings import ConfigError, from_dict, json_schema, load_yaml
from gmc.sweep.points import sweep_points
from gmc.sweep.resolve import RUN_KEYS, lab_history, resolve_eval, resolve_run
from gmc.tasks.datasets import benchmark_specs
from gmc.tasks.synthetic import SyntheticTask
from gmc.theory.config import GradientLabConfig

EVAL_SET_PER_JOB = ("data_source", "data_root", "synthetic")
"""EvalConfig keys that come from the ``data`` and ``synthetic`` sections."""

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"
"""The hand-written part of the schema."""


def generated_defs() -> dict[str, Any]:
    """The schema parts generated from the settings classes and registries, by ``$defs`` name."""
    return {
        "train": json_schema(TrainConfig, drop=RUN_KEYS),
        "evaluate": json_schema(EvalConfig, drop=EVAL_SET_PER_JOB),
        "analysis": json_schema(AnalysisConfig),
        "synthetic": json_schema(SyntheticTask),
        "tiny_model": json_schema(
            TinyModelConfig, drop={"synthetic": "the synthetic section", "seed": "the sweep's seed"}
        ),
        "random_model": json_schema(RandomModelConfig),
        "estimator": {"type": "string", "enum": list(REGISTRY), "description": "A registered estimator."},
        "sweep_algorithm": {
            "type": "string",
            "pattern": "^[a-z][a-z0-9_]*$",
            "description": "A registered estimator, or the name of one of its variants (variants).",
        },
        "benchmark": {"type": "string", "enum": list(benchmark_specs()), "description": "A registered benchmark."},
    }


def schema(handwritten: dict[str, Any]) -> dict[str, Any]:
    """The whole schema of ``config.yaml``: the hand-written ``handwritten`` with the generated
    ``$defs`` and one section per named delay mode (``latency``: its runs, with that mode's
    settings), shaped like ``$defs/named_delay``."""
    out = copy.deepcopy(handwritten)
    out.setdefault("$defs", {}).update(generated_defs())
    delay_keys = json_schema(DelayConfig)["properties"]
    for mode in named_delays():
        section = copy.deepcopy(out["$defs"]["named_delay"])
        section["description"] = f"Runs under the delay mode {mode!r} (delay~{mode}): {section['description']}"
        section["properties"]["delay"] = {
            "description": f"The settings the delay mode {mode!r} reads (DelayConfig, gmc/rollouts/delays.py).",
            "type": "object",
            "additionalProperties": False,
            "default": {},
            "properties": {k: delay_keys[k] for k in DELAY_MODES[mode].keys},
        }
        out["properties"].setdefault(mode, section)
    lab = out["properties"]["gradient_lab"]
    lab["properties"] = {**json_schema(GradientLabConfig)["properties"], **lab["properties"]}
    return out


LAB_WORKFLOW_KEYS = ("enabled", "history_seed", "history_group_size")
"""The ``gradient_lab`` section's keys that place the lab in the workflow; the others are GradientLabConfig's."""


def lab_values(config: dict[str, Any]) -> dict[str, Any]:
    """The GradientLabConfig keys of the ``gradient_lab`` section."""
    return {k: v for k, v in config["gradient_lab"].items() if k not in LAB_WORKFLOW_KEYS}


def fill_defaults(config: dict[str, Any], node: dict[str, Any]) -> None:
    """Set every absent key that the hand-written ``node`` gives a default, recursively
    (generated parts, reached through ``$ref``, keep their defaults to the dataclasses)."""
    for name, sub in node.get("properties", {}).items():
        if name not in config and "default" in sub:
            config[name] = copy.deepcopy(sub["default"])
        if isinstance(config.get(name), dict) and "properties" in sub:
            fill_defaults(config[name], sub)


def coerce(value: Any, node: dict[str, Any], defs: dict[str, Any]) -> Any:
    """``value`` with every string that the schema ``node`` does not take as a string read as YAML
    (numbers, booleans, null, lists, mappings), recursively, as ``gmc train --set`` reads a value;
    what stays wrong is left for the validator to name."""
    while "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    branches = [node, *node.get("anyOf", []), *node.get("oneOf", [])]
    if isinstance(value, str):
        types = set()
        for b in branches:
            named = b["enum"] if "enum" in b else [b["const"]] if "const" in b else None
            if named is not None:  # a branch of named values takes this string only as one of them
                if any(isinstance(v, str) and v == value for v in named):
                    return value
                continue
            t = b.get("type", [])
            types |= {t} if isinstance(t, str) else set(t)
        if "string" in types or not types:
            return value
        try:
            parsed = load_yaml(value)
        except yaml.YAMLError:
            return value
        return coerce(parsed, node, defs) if not isinstance(parsed, str) else parsed
    if isinstance(value, dict):
        props = next((b["properties"] for b in branches if "properties" in b), {})
        extra = next(
            (b["additionalProperties"] for b in branches if isinstance(b.get("additionalProperties"), dict)), None
        )
        return {
            k: coerce(v, props[k], defs) if k in props else coerce(v, extra, defs) if extra else v
            for k, v in value.items()
        }
    if isinstance(value, list):
        items = next((b["items"] for b in branches if isinstance(b.get("items"), dict)), None)
        return [coerce(v, items, defs) for v in value] if items else value
    return value


def _refuse_train_delay(config: dict[str, Any]) -> None:
    """Delay settings live in the sweep's sections, not in ``train``: name where each key lives."""
    train = config.get("train")
    if not isinstance(train, dict) or "delay" not in train:
        return
    given = train["delay"] if isinstance(train["delay"], dict) else {}
    homes = {
        "mode": "the sweep point (sweep.delays, a named delay mode's section, traces)",
        "d": "sweep.delays",
        "warmup": "sweep.warmup",
        "history_steps": "sweep.history.steps",
        "history_algorithm": "sweep.history.algorithm",
        "trace": "traces.<name>.file",
    }
    for mode in named_delays():
        homes.update({k: f"{mode}.delay.{k}" for k in DELAY_MODES[mode].keys})
    for key in given or [""]:
        where = homes.get(key, "the sweep's sections (sweep, " + ", ".join(named_delays()) + ", traces)")
        raise ConfigError(
            f"delay settings are set per sweep point, not in train: this one lives in {where}",
            f"train.delay.{key}" if key else "train.delay",
        )


def _check_algorithms(config: dict[str, Any]) -> None:
    """Every algorithm a sweep section names is an estimator or a variant, and no variant takes an
    estimator's name."""
    variants = config.get("variants", {})
    for name in variants:
        if name in REGISTRY:
            raise ConfigError(f"a variant cannot take an estimator's name {name!r}", f"variants.{name}")
    lists = {
        "sweep.algorithms": config["sweep"]["algorithms"],
        "sweep.references.algorithms": config["sweep"]["references"]["algorithms"],
        **{f"{m}.algorithms": config[m]["algorithms"] for m in named_delays() if m in config},
        **{f"traces.{n}.algorithms": t["algorithms"] for n, t in config.get("traces", {}).items()},
    }
    for key, names in lists.items():
        for i, name in enumerate(names):
            if name not in REGISTRY and name not in variants:
                raise ConfigError(
                    f"{name!r} is neither an estimator {list(REGISTRY)} nor a variant {list(variants)}", f"{key}[{i}]"
                )


def validate(config: dict[str, Any], handwritten: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fill ``config``'s defaults, coerce its values (:func:`coerce`) and validate it against
    :func:`schema`, in place, then resolve every run of the sweep and the evaluation as the jobs
    will (cross-key checks included); a :class:`ConfigError` names the key and the allowed
    values. ``handwritten`` defaults to :data:`SCHEMA_FILE`. Returns the full schema."""
    import jsonschema

    if handwritten is None:
        handwritten = yaml.safe_load(SCHEMA_FILE.read_text())
    full = schema(handwritten)
    _refuse_train_delay(config)
    fill_defaults(config, full)
    config.update(coerce(dict(config), full, full["$defs"]))
    validator = jsonschema.Draft202012Validator(full)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "config"
        raise ConfigError(error.message, where)
    _check_algorithms(config)
    for point in sweep_points(config):
        resolve_run(config, point)
    resolve_eval(config)
    try:
        from_dict(AnalysisConfig, config["analysis"])
    except ConfigError as e:
        raise ConfigError(e.reason, f"analysis.{e.key}" if e.key else "analysis") from None
    if config["gradient_lab"]["enabled"]:
        lab_history(config, sweep_points(config))
    try:
        from_dict(GradientLabConfig, lab_values(config))
    except ConfigError as e:
        raise ConfigError(e.reason, f"gradient_lab.{e.key}" if e.key else "gradient_lab") from None
    return full
