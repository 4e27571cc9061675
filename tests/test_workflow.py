"""One truth per config key: the workflow schema generated from the settings classes and
registries, unknown keys rejected at ``snakemake -n``, a new key needing no second edit,
validation without torch, the data/mlflow settings reaching the jobs, derived keys, and the
values ``snakemake --config`` hands over read as the jobs read them."""

import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from helpers import DOCS, REPO

from gmc import workflow
from gmc.estimators import REGISTRY
from gmc.rollouts.delays import DELAY_MODES, DelayConfig, named_delays
from gmc.run.config import TrainConfig
from gmc.run.evaluate import EvalConfig
from gmc.settings import ConfigError, from_dict, settings, to_dict
from gmc.sweep import resolve
from gmc.sweep.points import sweep_points
from gmc.tasks.datasets import benchmark_specs
from gmc.tasks.synthetic import SyntheticTask

HANDWRITTEN = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


SCHEMA = workflow.schema(HANDWRITTEN)


def _resolve(node):
    while "$ref" in node:
        node = {**SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
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
    """Dotted field names of a dataclass, nested dataclasses expanded."""
    out = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        out.add(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out |= _fields(hints[f.name], f"{prefix}{f.name}.")
    return out


def _enum(node):
    node = _resolve(node)
    return node.get("enum") or _resolve(node.get("items", {})).get("enum")


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


def test_the_train_and_evaluate_sections_are_their_settings_classes_but_the_keys_the_workflow_sets():
    train = set(_keys(SCHEMA["properties"]["train"]))

    def minus(fields, dropped):  # a dropped section takes its keys with it
        return {f for f in fields if not any(f == d or f.startswith(d + ".") for d in dropped)}

    assert train == minus(_fields(TrainConfig), resolve.RUN_KEYS)
    assert set(_keys(SCHEMA["properties"]["evaluate"])) == minus(_fields(EvalConfig), workflow.EVAL_SET_PER_JOB)
    # the synthetic task is one section for the warm start, training and evaluation
    assert set(_keys(SCHEMA["properties"]["synthetic"])) == _fields(SyntheticTask)
    assert "synthetic" not in _keys(SCHEMA["properties"]["model"]["properties"]["tiny"])
    # descriptions are the fields' docstrings
    assert _keys(SCHEMA["properties"]["train"])["lr"]["description"].startswith("Peak learning rate")
    for mode in named_delays():  # every named delay mode has its section, with the DelayConfig keys it reads
        keys = set(_keys(SCHEMA["properties"][mode]["properties"]["delay"]))
        assert keys == set(DELAY_MODES[mode].keys) and keys <= {f.name for f in dataclasses.fields(DelayConfig)}
    assert "max_staleness" not in _keys(SCHEMA["properties"]["latency"]["properties"]["delay"])


def test_allowed_values_are_the_registries_and_the_literal_types():
    props = SCHEMA["properties"]
    for where in (
        props["sweep"]["properties"]["algorithms"],
        props["sweep"]["properties"]["references"]["properties"]["algorithms"],
        *(props[m]["properties"]["algorithms"] for m in named_delays()),
    ):
        assert _resolve(_resolve(where)["items"])["pattern"]  # an estimator or a variant: checked by validate
    assert _enum(props["variants"]["additionalProperties"]["properties"]["algorithm"]) == list(REGISTRY)
    assert _enum(props["sweep"]["properties"]["history"]["properties"]["algorithm"]) == list(REGISTRY)
    evaluate = _keys(props["evaluate"])
    assert _enum(evaluate["benchmarks"]) == list(benchmark_specs())
    assert evaluate["samples"]["propertyNames"]["enum"] == list(benchmark_specs())
    train = _keys(props["train"])
    assert _enum(train["algorithm"]) == list(REGISTRY) if "algorithm" in train else True
    assert _enum(train["engine"]) == ["hf", "vllm"] and _enum(train["model_dtype"]) == [
        "float32",
        "bfloat16",
        "float16",
    ]
    assert set(named_delays()) <= set(DELAY_MODES)


def _valid_config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_a_variant_is_an_estimator_with_train_settings_of_its_own():
    """A variant's points run its estimator with its train settings merged over the section's;
    its name stands where an estimator's may, and a wrong name or value is refused naming the key."""
    config = _valid_config()
    config["variants"] = {
        "gmc_tis": {
            "algorithm": "gmc",
            "train": {
                "behaviour_logprobs": "trainer",
                "rollout_correction": {"preset": "decoupled_token_is"},
                "sampling": {"dtype": "bfloat16"},
            },
        }
    }
    config["sweep"]["algorithms"] = [*config["sweep"]["algorithms"], "gmc_tis"]
    workflow.validate(config, HANDWRITTEN)
    point = next(p for p in sweep_points(config) if p.algorithm == "gmc_tis")
    cfg, plain = resolve.resolve_run(config, point), resolve.resolve_run(config, point._replace(algorithm="gmc"))
    assert cfg.algorithm == "gmc" and cfg.rollout_correction.resolved()["rollout_is"] == "token"
    assert cfg.sampling.dtype == "bfloat16" and cfg.sampling.max_new_tokens == plain.sampling.max_new_tokens
    assert plain.rollout_correction is None and plain.sampling.dtype is None
    for change, key in [
        ({"sweep": {**config["sweep"], "algorithms": ["gmc_nope"]}}, "sweep.algorithms[0]"),
        ({"variants": {"grpo": {"algorithm": "gmc"}}}, "variants.grpo"),
        (
            {
                "variants": {
                    "gmc_tis": {
                        "algorithm": "gmc",
                        "train": {"behaviour_logprobs": "trainer", "rollout_correction": {"rollout_rs": "x"}},
                    }
                }
            },
            "variants.gmc_tis.train.rollout_correction.rollout_rs",
        ),
    ]:
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            workflow.validate({**config, **change}, HANDWRITTEN)


def test_a_fixed_sampling_budget_sets_the_prompts_per_step_of_every_group_size():
    """``sweep.samples_per_step``: every run draws that many rollouts a step, ``samples / G`` prompts
    of ``G`` answers; a budget that does not split into a group size is refused naming the key."""
    config = _valid_config()
    config["sweep"] = {**config["sweep"], "group_sizes": [4, 8, 32], "samples_per_step": 64}
    workflow.validate(config, HANDWRITTEN)
    per_g = {p.group: resolve.resolve_run(config, p).prompts_per_step for p in sweep_points(config)}
    assert per_g == {4: 16, 8: 8, 32: 2}
    config["sweep"]["group_sizes"] = [4, 24]
    with pytest.raises(
        ConfigError, match=r"sweep.samples_per_step: 64 rollouts per step do not split into groups of 24"
    ):
        workflow.validate(config, HANDWRITTEN)
    config["sweep"]["group_sizes"], config["train"]["updates_per_batch"] = [32], 4  # 2 prompts in 4 updates
    with pytest.raises(ConfigError, match=r"train.updates_per_batch: prompts_per_step \(2\) must split"):
        workflow.validate(config, HANDWRITTEN)


def test_the_gradient_lab_section_is_its_settings_and_needs_a_history_of_the_sweep():
    """``gradient_lab`` takes GradientLabConfig's keys beside where it sits in the workflow; a bad
    value or a sweep without the history it names is refused naming the key."""
    config = _valid_config()
    config["gradient_lab"] = {"enabled": True, "batches": 8, "delays": [2, 4]}
    config["sweep"] = {**config["sweep"], "warmup": "history"}
    workflow.validate(config, HANDWRITTEN)
    values = workflow.lab_values(config)
    assert values["batches"] == 8 and values["delays"] == [2, 4] and "enabled" not in values
    name = resolve.lab_history(config, sweep_points(config))
    assert name in {n for n, _ in resolve.shared_histories(config, sweep_points(config)).values()}
    for change, key in [
        ({"batches": 2}, "gradient_lab.batches"),
        ({"algorithms": ["gmcc"]}, "gradient_lab.algorithms"),
        ({"history_seed": 99}, "gradient_lab.history_seed"),
    ]:
        with pytest.raises(ConfigError, match=key):
            workflow.validate({**config, "gradient_lab": {**config["gradient_lab"], **change}}, HANDWRITTEN)
    with pytest.raises(ConfigError, match="gradient_lab.history_seed: the gradient lab measures a history"):
        workflow.validate({**config, "sweep": {**config["sweep"], "warmup": "ramp"}}, HANDWRITTEN)


def test_a_key_added_to_trainconfig_needs_no_second_edit(monkeypatch):
    """A new TrainConfig field is in the generated schema, described by its docstring, accepted in the
    workflow's train section and loaded, with nothing else edited."""

    @settings
    class Extended(TrainConfig):
        rollout_budget: int = 3
        """A knob a newcomer adds."""

    monkeypatch.setattr(workflow, "TrainConfig", Extended)  # the schema's class and the runs' class
    monkeypatch.setattr(resolve, "TrainConfig", Extended)
    config = _valid_config()
    config["train"]["rollout_budget"] = 5
    full = workflow.validate(config, HANDWRITTEN)
    assert full["$defs"]["train"]["properties"]["rollout_budget"]["description"] == "A knob a newcomer adds."
    assert from_dict(Extended, config["train"]).rollout_budget == 5
    config["train"]["rollout_budget"] = "many"
    with pytest.raises(ConfigError, match="train.rollout_budget: .*integer"):
        workflow.validate(config, HANDWRITTEN)
    monkeypatch.setattr(workflow, "TrainConfig", TrainConfig)  # the real class refuses the key
    monkeypatch.setattr(resolve, "TrainConfig", TrainConfig)
    with pytest.raises(ConfigError, match="'rollout_budget' was unexpected"):
        workflow.validate(config, HANDWRITTEN)


def test_validation_fills_the_handwritten_defaults_and_refuses_cross_key_mistakes():
    config = {"sweep": {"algorithms": ["gmc"], "delays": [0], "group_sizes": [4], "seeds": [0]}}
    workflow.validate(config, HANDWRITTEN)
    assert config["results"] == "results" and config["model"] == {"name": "tiny", "tiny": {}, "random": {}}
    assert config["sweep"]["references"] == {"algorithms": [], "delays": []}
    assert config["latency"]["enabled"] is False and config["train"] == {}
    bad = {**_valid_config()}
    bad["train"] = {**bad["train"], "sampling": {"top_p": 0.9}}
    with pytest.raises(ConfigError, match="train.sampling.top_p: training needs 1"):
        workflow.validate(bad, HANDWRITTEN)


def test_reading_and_validating_configs_imports_no_torch(tmp_path):
    """The workflow's parse (schema, validation) and loading a train or evaluate config need no torch."""
    (tmp_path / "train.yaml").write_text("steps: 3\nestimator: {eps: 0.1}\n")
    code = f"""
import json, sys, yaml
from gmc.sweep import resolve
from gmc.sweep.points import sweep_points
from gmc import workflow
from gmc.run.config import load_train_config
from gmc.run.evaluate import EvalConfig
from gmc.settings import load_config
workflow.validate(yaml.safe_load(open({str(REPO / "config.yaml")!r})),
                  yaml.safe_load(open({str(REPO / "workflow" / "schemas" / "config.schema.yaml")!r})))
cfg = load_train_config({str(tmp_path / "train.yaml")!r}, ["lr=1e-4"])
load_config(EvalConfig, None, ["benchmarks=[synthetic]"])
print(json.dumps({{"torch": "torch" in sys.modules, "eps": cfg.estimator.eps}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torch": False, "eps": 0.1}


def _snakemake(args, cwd, timeout=600):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "override, key",
    [
        ("train={stpes: 3}", "stpes"),
        ("train={estimator: {epss: 0.1}}", "epss"),
        ("train={estimator: {max_new_tokens: 64}}", "max_new_tokens"),
        ("evaluate={benchmarks: [synthetic], temprature: 1.0}", "temprature"),
        ("model={name: tiny, tiney: {seed: 1}}", "tiney"),
    ],
)
def test_a_misspelt_key_fails_the_dry_run_naming_it(tmp_path, override, key):
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    out = _snakemake(["-n", "--cores", "1", "--config", override], cwd=tmp_path)
    assert out.returncode != 0
    assert f"'{key}' was unexpected" in out.stdout + out.stderr


def test_data_and_mlflow_settings_reach_the_training_and_evaluation_configs(tmp_path):
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    run = "results/configs/train/algo~gmc/delay~64/group~8/seed~0.yaml"
    out = _snakemake(
        [
            "--cores",
            "1",
            run,
            "results/configs/eval.yaml",
            "--config",
            f"data={{source: hub, root: {tmp_path / 'mydata'}}}",
            "mlflow={tracking_uri: 'sqlite:///results/mlflow.db', experiment: sweep7}",
        ],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    train = yaml.safe_load((tmp_path / run).read_text())
    evaluation = yaml.safe_load((tmp_path / "results" / "configs" / "eval.yaml").read_text())
    assert (train["data_source"], train["data_root"], train["experiment"], train["tracking_uri"]) == (
        "hub",
        str(tmp_path / "mydata"),
        "sweep7",
        "sqlite:///results/mlflow.db",
    )
    assert (evaluation["data_source"], evaluation["data_root"]) == ("hub", str(tmp_path / "mydata"))
    # what the training job reads is the run's whole TrainConfig, with those settings and its point
    cfg = from_dict(TrainConfig, train)
    assert (cfg.data_source, cfg.data_root) == ("hub", str(tmp_path / "mydata"))
    assert (cfg.algorithm, cfg.delay.mode, cfg.delay.d, cfg.group_size, cfg.seed) == ("gmc", "fixed", 64, 8, 0)
    assert cfg.model == "results/models/tiny/seed~0" and to_dict(cfg) == train


@pytest.mark.parametrize(
    "override, check",
    [
        ("train={steps: 10}", lambda c: c["train"]["steps"] == 10),
        ("train={lr: 1e-4}", lambda c: c["train"]["lr"] == 1e-4),
        (
            "train={checkpoint_every: 0, master_weights: false, memory_limit_gib: null}",
            lambda c: (
                c["train"]["checkpoint_every"] == 0
                and c["train"]["master_weights"] is False
                and c["train"]["memory_limit_gib"] is None
            ),
        ),
        (
            "sweep={algorithms: [gmc, grpo], delays: [0, 8], group_sizes: [8], seeds: [0, 1, 2]}",
            lambda c: c["sweep"]["seeds"] == [0, 1, 2] and c["sweep"]["delays"] == [0, 8],
        ),
        (
            "latency={enabled: true, algorithms: [gmc], group_sizes: [8], delay: {slots: 32, beta: 0.25}}",
            lambda c: (c["latency"]["delay"]["slots"], c["latency"]["delay"]["beta"]) == (32, 0.25),
        ),
        (
            "evaluate={benchmarks: [synthetic], samples: {synthetic: 2}, temperature: 0.6}",
            lambda c: c["evaluate"]["samples"] == {"synthetic": 2} and c["evaluate"]["temperature"] == 0.6,
        ),
    ],
)
def test_values_given_with_snakemake_config_are_read_as_the_jobs_read_them(override, check):
    """``snakemake --config`` hands nested values over as strings (its own parser, applied here as the
    command line applies it); the workflow reads them as a job's ``--set`` does, then validates."""
    from snakemake.cli import parse_config
    from snakemake.utils import update_config

    config = _valid_config()
    given = parse_config([override])
    assert "'" in repr(given) or "True" in repr(given)  # strings (or booleans) as Snakemake hands them over
    update_config(config, given)
    workflow.validate(config, HANDWRITTEN)
    assert check(config)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train={steps: ten}", "train.steps: 'ten' is not of type 'integer'"),
        ("train={stpes: 10}", "'stpes' was unexpected"),
        ("sweep={algorithms: [gmc], delays: [0], group_sizes: [8], seeds: [zero]}", "sweep.seeds.0: 'zero'"),
        (
            "train={delay: {max_staleness: 8}}",
            "train.delay.max_staleness: delay settings are set per sweep point, "
            "not in train: this one lives in ray.delay.max_staleness",
        ),
        ("train={delay: {d: 8}}", "train.delay.d: .* lives in sweep.delays"),
        (
            "sweep={algorithms: [gmc], delays: [0, 8], group_sizes: [8], seeds: [0], history: {steps: 4}}",
            "sweep.history.steps: a history of 4 updates cannot fill a queue of d = 8",
        ),
        (
            "sweep={algorithms: [gmc], delays: [0], group_sizes: [8], seeds: [0], history: {algorithm: ppo}}",
            "sweep.history.algorithm: 'ppo' is not one of",
        ),
        (
            "latency={enabled: true, algorithms: [gmc], group_sizes: [8], delay: {max_staleness: 2}}",
            "latency.delay: Additional properties are not allowed \\('max_staleness'",
        ),
        ("train={sampling: {max_new_tokens: 64}, estimator: {max_new_tokens: 32}}", "'max_new_tokens' was unexpected"),
    ],
)
def test_a_wrong_value_from_snakemake_config_is_still_refused_naming_its_key(override, message):
    from snakemake.cli import parse_config
    from snakemake.utils import update_config

    config = _valid_config()
    update_config(config, parse_config([override]))
    with pytest.raises(ConfigError, match=message):
        workflow.validate(config, HANDWRITTEN)


def test_every_documented_snakemake_config_example_plans(tmp_path):
    """Each ``--config`` of the README and the docs, through the real command line (a user's own
    model folder left out; a user's own estimator ``mine`` played by ``tic``)."""
    import re
    import shlex

    items = []
    for doc in DOCS:
        items += [
            shlex.split(m)[0] for m in re.findall(r"--config[= ]('[a-z_]+=[^']*'|[a-z_]+='[^']*')", doc.read_text())
        ]
    items = [i.replace("mine", "tic") for i in items if "/shared/models" not in i]
    assert any(i.startswith("sweep=") for i in items) and any(i.startswith("mlflow=") for i in items), items
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    for item in items:
        out = _snakemake(["-n", "--cores", "1", "--config", item], cwd=tmp_path)
        assert out.returncode == 0, (item, (out.stdout + out.stderr)[-2000:])
