"""One truth for the config: the workflow schema against the dataclasses and registries, unknown
keys rejected at ``snakemake -n``, the data/mlflow settings reaching the jobs, derived keys."""

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from gmc.asynchrony import DELAY_MODES, DelayConfig, named_delays
from gmc.config import ConfigError, TrainConfig, from_dict, literal_choices, to_dict
from gmc.data import benchmark_specs
from gmc.estimators import ESTIMATORS
from gmc.evaluate import EvalConfig

REPO = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())

SET_BY_THE_WORKFLOW = {
    "model": "model.name (the fetched or built model folder)",
    "algorithm": "the sweep point", "group_size": "the sweep point", "seed": "the sweep point",
    "delay.mode": "the sweep point", "delay.d": "the sweep point",
    "data_source": "data.source", "data_root": "data.root",
    "experiment": "mlflow.experiment", "tracking_uri": "mlflow.tracking_uri (live logging)",
    "estimator.max_new_tokens": "sampling.max_new_tokens",
}
"""TrainConfig keys that the `train` section must not hold, and where they come from."""


def _resolve(node):
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return SCHEMA["$defs"][name]
    return node


def _keys(node, prefix=""):
    """Dotted keys of a schema object, recursively."""
    out = {}
    for name, sub in _resolve(node).get("properties", {}).items():
        sub = _resolve(sub)
        out[prefix + name] = sub
        if sub.get("type") == "object" and "properties" in sub:
            out.update(_keys(sub, f"{prefix}{name}."))
    return out


def _fields(cls, prefix=""):
    """Dotted field names of a dataclass with their types, nested dataclasses expanded."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        out[prefix + f.name] = tp
        if dataclasses.is_dataclass(tp):
            out.update(_fields(tp, f"{prefix}{f.name}."))
    return out


def _literals(cls, prefix=""):
    out = {prefix + k: v for k, v in literal_choices(cls).items()}
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(_literals(tp, f"{prefix}{f.name}."))
    return out


def _enum(node):
    node = _resolve(node)
    return node.get("enum") or node.get("items", {}).get("enum")


def test_every_key_of_every_section_is_described_and_unknown_keys_are_rejected():
    def walk(node, where):
        node = _resolve(node)
        if node.get("type") == "object" or "properties" in node:
            assert node.get("additionalProperties") is False or "properties" not in node, where
            for name, sub in node.get("properties", {}).items():
                assert _resolve(sub).get("description"), f"{where}.{name} has no description"
                walk(sub, f"{where}.{name}")

    walk(SCHEMA, "config")
    assert SCHEMA["additionalProperties"] is False


def test_train_section_lists_every_trainconfig_key_but_those_the_workflow_sets():
    schema = _keys(SCHEMA["properties"]["train"])
    fields = _fields(TrainConfig)
    assert set(schema) <= set(fields), f"schema keys that are no TrainConfig field: {set(schema) - set(fields)}"
    latency = set(_keys(SCHEMA["properties"]["latency"]["properties"]["delay"]))
    missing = {k for k in set(fields) - set(schema) - set(SET_BY_THE_WORKFLOW)
               if not (k.startswith("delay.") and k.split(".", 1)[1] in latency)}
    assert not missing, f"TrainConfig keys neither in the schema nor set by the workflow: {missing}"
    assert not set(schema) & set(SET_BY_THE_WORKFLOW)


def test_evaluate_section_lists_every_evalconfig_key_but_the_data_settings():
    schema = _keys(SCHEMA["properties"]["evaluate"])
    assert set(schema) == set(_fields(EvalConfig)) - {"data_source", "data_root"}


def test_allowed_values_are_the_python_ones():
    """Literal fields, estimators, benchmarks and delay modes: the schema's enums equal Python's."""
    props = SCHEMA["properties"]
    for section, cls in (("train", TrainConfig), ("evaluate", EvalConfig)):
        schema = _keys(props[section])
        for key, allowed in _literals(cls).items():
            if key in schema:
                assert _enum(schema[key]) == [*allowed, *([None] if None in _enum(schema[key]) else [])], key
    assert _enum(props["sweep"]["properties"]["algorithms"]) == list(ESTIMATORS)
    assert _enum(props["latency"]["properties"]["algorithms"]) == list(ESTIMATORS)
    assert _enum(props["sweep"]["properties"]["references"]["properties"]["algorithms"]) == list(ESTIMATORS)
    assert _enum(props["evaluate"]["properties"]["benchmarks"]) == list(benchmark_specs())
    assert props["evaluate"]["properties"]["samples"]["propertyNames"]["enum"] == list(benchmark_specs())
    # every named delay mode has its section, whose delay keys are DelayConfig fields
    for mode in named_delays():
        keys = set(_keys(props[mode]["properties"]["delay"]))
        assert keys <= {f.name for f in dataclasses.fields(DelayConfig)}, mode
    assert set(named_delays()) <= set(DELAY_MODES)


def test_literal_values_are_checked_on_direct_construction_too():
    with pytest.raises(ConfigError, match="model_dtype: must be one of"):
        TrainConfig(model_dtype="float8")
    with pytest.raises(ConfigError, match="engine: must be one of"):
        from_dict(EvalConfig, {"engine": "sglang"})


def test_estimator_max_new_tokens_follows_sampling_and_is_not_a_setting():
    cfg = from_dict(TrainConfig, {"sampling": {"max_new_tokens": 100}})
    assert cfg.estimator.max_new_tokens == 100
    with pytest.raises(ConfigError, match=r"estimator.max_new_tokens: set from sampling.max_new_tokens \(100\)"):
        from_dict(TrainConfig, {"sampling": {"max_new_tokens": 100}, "estimator": {"max_new_tokens": 512}})
    # a resolved config (as written into a run directory) loads again
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg


# ---------------------------------------------------------------------------------------------
# the workflow


def _snakemake(args, cwd, timeout=600):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("override, key", [
    ("train={stpes: 3}", "stpes"),
    ("train={estimator: {epss: 0.1}}", "epss"),
    ("train={estimator: {max_new_tokens: 64}}", "max_new_tokens"),
    ("evaluate={benchmarks: [synthetic], temprature: 1.0}", "temprature"),
    ("model={name: tiny, tiney: {seed: 1}}", "tiney"),
])
def test_a_misspelt_key_fails_the_dry_run_naming_it(tmp_path, override, key):
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    out = _snakemake(["-n", "--cores", "1", "--config", override], cwd=tmp_path)
    assert out.returncode != 0
    assert f"'{key}' was unexpected" in out.stdout + out.stderr


def test_data_and_mlflow_settings_reach_the_training_and_evaluation_configs(tmp_path):
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    out = _snakemake(["--cores", "1", "results/configs/train.yaml", "results/configs/eval.yaml", "--config",
                      f"data={{source: hub, root: {tmp_path / 'mydata'}}}",
                      "mlflow={tracking_uri: 'sqlite:///results/mlflow.db', experiment: sweep7}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    train = yaml.safe_load((tmp_path / "results" / "configs" / "train.yaml").read_text())
    evaluation = yaml.safe_load((tmp_path / "results" / "configs" / "eval.yaml").read_text())
    assert (train["data_source"], train["data_root"], train["experiment"]) == ("hub", str(tmp_path / "mydata"),
                                                                               "sweep7")
    assert (evaluation["data_source"], evaluation["data_root"]) == ("hub", str(tmp_path / "mydata"))
    # what the training job reads is a valid TrainConfig with those settings
    cfg = from_dict(TrainConfig, train)
    assert (cfg.data_source, cfg.data_root) == ("hub", str(tmp_path / "mydata"))
