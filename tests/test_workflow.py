"""One truth per config key: the workflow's configuration as settings classes, its schema generated
from them, one vocabulary with the runs' keys (the previous release's spellings loading with a
line naming the new key), unknown keys rejected at ``snakemake -n``, a new key needing no second
edit, loading without torch, the shared settings reaching the jobs, and the values ``snakemake
--config`` hands over read as the jobs read them."""

import copy
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
from gmc.sweep.config import SET_ELSEWHERE, RunDelay
from gmc.tasks.datasets import benchmark_specs
from gmc.tasks.synthetic import SyntheticTask

SCHEMA = workflow.schema()


def _keys(node, prefix=""):
    """Dotted keys of a schema object, recursively."""
    out = {}
    for name, sub in node.get("properties", {}).items():
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
    return node.get("enum") or node.get("items", {}).get("enum")


def _config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def _set(config, dotted, value):
    *parents, leaf = dotted.split(".")
    for part in parents:
        config = config.setdefault(part, {})
    config[leaf] = value


def test_every_key_of_every_section_is_described_and_unknown_keys_are_rejected():
    def walk(node, where):
        if node.get("type") == "object" or "properties" in node:
            assert node.get("additionalProperties") is False or "properties" not in node, where
            for name, sub in node.get("properties", {}).items():
                assert sub.get("description"), f"{where}.{name} has no description"
                walk(sub, f"{where}.{name}")

    walk(SCHEMA, "config")
    assert SCHEMA["additionalProperties"] is False and SCHEMA["required"] == ["sweep"]


def test_the_sections_of_a_settings_class_are_its_keys_but_those_set_elsewhere():
    train = set(_keys(SCHEMA["properties"]["train"]))

    def minus(fields, dropped):  # a dropped section takes its keys with it
        return {f for f in fields if not any(f == d or f.startswith(d + ".") for d in dropped)}

    assert train == minus(_fields(TrainConfig), [*SET_ELSEWHERE, "delay"]) | {"delay"} | _fields(RunDelay, "delay.")
    assert set(_keys(SCHEMA["properties"]["evaluate"])) == minus(_fields(EvalConfig), workflow.EVAL_SET_PER_JOB)
    # the synthetic task is one section for the warm start, training and evaluation
    assert set(_keys(SCHEMA["properties"]["synthetic"])) == _fields(SyntheticTask)
    assert "synthetic" not in _keys(SCHEMA["properties"]["tiny_model"])
    # descriptions are the fields' docstrings
    assert _keys(SCHEMA["properties"]["train"])["lr"]["description"].startswith("Peak learning rate")
    assert SCHEMA["properties"]["sweep"]["properties"]["delay"]["description"].startswith("Fixed delays")
    for mode in named_delays():  # every named delay mode has its section, with the DelayConfig keys it reads
        keys = set(_keys(SCHEMA["properties"][mode]["properties"]["delay"]))
        assert keys == set(DELAY_MODES[mode].keys) and keys <= {f.name for f in dataclasses.fields(DelayConfig)}
    assert "max_staleness" not in _keys(SCHEMA["properties"]["latency"]["properties"]["delay"])


def test_a_run_key_is_spelt_as_the_run_spells_it():
    """The keys every job shares sit at the top level under the run's names, and the sweep's axes
    are the run's keys: one vocabulary for config.yaml, a preset, --set and TrainConfig."""
    run_keys = {f.name for f in dataclasses.fields(TrainConfig)}
    top = set(SCHEMA["properties"])
    assert {k for k, home in SET_ELSEWHERE.items() if "." not in home} <= top & run_keys
    assert {home.split(".")[1] for home in SET_ELSEWHERE.values() if home.startswith("sweep.")} <= run_keys
    assert set(SCHEMA["properties"]["sweep"]["properties"]) >= {"algorithm", "delay", "group_size", "seed"}
    assert set(_keys(SCHEMA["properties"]["train"]["properties"]["delay"])) <= {
        f.name for f in dataclasses.fields(DelayConfig)
    }


def test_allowed_values_are_the_registries_and_the_literal_types():
    props = SCHEMA["properties"]
    for where in (
        props["sweep"]["properties"]["algorithm"],
        props["sweep"]["properties"]["references"]["properties"]["algorithm"],
        *(props[m]["properties"]["algorithm"] for m in named_delays()),
    ):
        assert where["items"]["pattern"]  # an estimator or a variant: checked when loading
    (variant,) = props["variants"]["patternProperties"].values()
    assert _enum(variant["properties"]["algorithm"]) == list(REGISTRY)
    assert _enum(props["train"]["properties"]["delay"]["properties"]["history_algorithm"]) == list(REGISTRY)
    evaluate = _keys(props["evaluate"])
    assert _enum(evaluate["benchmarks"]) == list(benchmark_specs())
    assert evaluate["samples"]["propertyNames"]["enum"] == list(benchmark_specs())
    train = _keys(props["train"])
    assert _enum(train["engine"]) == ["hf", "vllm"]
    assert _enum(train["model_dtype"]) == ["float32", "bfloat16", "float16"]
    assert _enum(props["data_source"]) == ["local", "hub"]


# ---------------------------------------------------------------------------------------------
# the previous release's spellings


def _renamed_cases():
    """Each renamed key with a config that gives it in its new spelling (a trace for the traces')."""
    for old, new in workflow.RENAMED.items():
        yield pytest.param(old.replace("*", "run7"), new.replace("*", "run7"), id=old)


def _with_trace(config, tmp_path):
    trace = tmp_path / "staleness_trace.jsonl"
    trace.write_text(
        "".join(json.dumps({"prompt_index": i, "version": 0, "consumed_version": 0}) + "\n" for i in range(8))
    )
    config["traces"] = {"run7": {"trace": str(trace), "algorithm": ["gmc"], "group_size": [8]}}
    config["train"]["steps"] = 1
    config["sweep"]["delay"] = [0]
    config["latency"]["enabled"] = False


@pytest.mark.parametrize("old, new", list(_renamed_cases()))
def test_every_renamed_key_loads_in_its_old_spelling_with_a_line_naming_the_new_key(tmp_path, capsys, old, new):
    """A config of the previous release loads into the same sweep as today's spelling, each old key
    announced on standard error in one line that names its new key."""
    config = _config()
    if old.startswith("traces."):
        _with_trace(config, tmp_path)
    present, value = workflow._get(config, new)
    if not present:  # a key the default config leaves at its default: give it
        value = {
            "train.delay.history_steps": 64,
            "train.delay.history_algorithm": "tic",
            "sweep.references.algorithm": ["is"],
            "sweep.references.delay": [64],
            "random_model": {"hidden_size": 32},
            "ray.algorithm": ["gmc"],
            "ray.group_size": [8],
        }[new]
        _set(config, new, value)
    today = workflow.load(copy.deepcopy(config))
    assert capsys.readouterr().err == ""
    old_config = copy.deepcopy(config)
    workflow._pop(old_config, new)
    if old.startswith("model."):  # the old model section held the name beside the build settings
        name = value if old == "model.name" else old_config.pop("model")
        old_config["model"] = {"name": name, **({} if old == "model.name" else {old.split(".")[1]: value})}
    else:
        _set(old_config, old, value)
    loaded = workflow.load(old_config, "old.yaml")
    lines = capsys.readouterr().err.splitlines()
    assert f"old.yaml: {old} is deprecated, write {new}" in lines and len(lines) == len(set(lines))
    assert all("is deprecated, write" in line for line in lines)
    assert loaded.points == today.points and loaded.config == today.config
    assert [to_dict(loaded.run(p)) for p in loaded.points] == [to_dict(today.run(p)) for p in today.points]


def test_a_key_given_in_both_spellings_with_two_values_is_refused_naming_the_new_one():
    config = _config()
    config["sweep"]["delays"] = [0, 8]
    with pytest.raises(
        ConfigError,
        match=r"sweep.delays: sweep.delays is the previous spelling of sweep.delay, and "
        r"both are given: keep sweep.delay",
    ):
        workflow.load(config)
    config["sweep"]["delays"] = config["sweep"]["delay"]  # the same value twice is one setting
    assert workflow.load(config).config.sweep.delay == [0, 64]
    old = _config()
    old["data"] = {"source": "local", "where": "here"}
    with pytest.raises(ConfigError, match="data.where: unknown key of the previous release's data section"):
        workflow.load(old)


@pytest.mark.parametrize(
    "old, today",
    [
        ("config.yaml", REPO / "config.yaml"),
        ("real_async.yaml", REPO / "workflow" / "presets" / "real_async.yaml"),
        ("workflow_config.yaml", REPO / "tests" / "data" / "workflow_config.yaml"),
    ],
)
def test_a_whole_config_of_the_previous_release_loads_into_todays_sweep(capsys, old, today):
    """config.yaml, a preset and a test config as the previous release wrote them (every renamed
    key at once: model, data, mlflow, the sweep's axes and warm-up, the named delay modes' lists)
    load into the same sweep as today's files, with a line per old key."""
    before = workflow.load_file(REPO / "tests" / "data" / "previous_release" / old)
    lines = capsys.readouterr().err.splitlines()
    now = workflow.load_file(today)
    assert capsys.readouterr().err == ""
    assert len(lines) >= 8 and all(" is deprecated, write " in line for line in lines)
    assert before.config == now.config and before.points == now.points
    assert [to_dict(before.run(p)) for p in before.points] == [to_dict(now.run(p)) for p in now.points]
    assert before.histories == now.histories and before.shared == now.shared


def test_every_preset_and_config_yaml_speak_todays_keys(capsys):
    for path in [REPO / "config.yaml", *sorted((REPO / "workflow" / "presets").glob("*.yaml"))]:
        workflow.load_file(path)
        assert capsys.readouterr().err == "", path


# ---------------------------------------------------------------------------------------------
# the sweep's runs


@pytest.mark.parametrize(
    "change, message",
    [
        ({"evaluate": {"data_source": "hub"}}, "evaluate.data_source: every job takes this from data_source"),
        ({"evaluate": {"synthetic": {}}}, "evaluate.synthetic: every job takes this from synthetic"),
        ({"tiny_model": {"seed": 7}}, "tiny_model.seed: every job takes this from sweep.seed"),
        ({"model": "Qwen/Qwen3-4B", "tiny_model": {"tiney": 1}}, "tiny_model.tiney: unknown key"),
        ({"random_model": {"hiden": 1}}, "random_model.hiden: unknown key"),
        ({"ray": {"delay": {"workers": 0}}}, "ray.delay.workers: must be greater than or equal to 1"),
        ({"latency": {"delay": {"max_staleness": 2}}}, "latency.delay.max_staleness: the latency mode reads"),
    ],
)
def test_a_key_set_elsewhere_or_a_bad_value_of_an_unused_section_is_refused_naming_it(change, message):
    """A section's class may have keys that another part of the config sets (evaluate's data, the
    tiny model's seed): given there they are refused, naming their home; the base models' sections
    and the named delay modes' settings are checked whether the sweep uses them or not."""
    config = _config()
    config.update(change)
    with pytest.raises(ConfigError, match=message):
        workflow.load(config)


def test_a_bad_value_is_named_where_the_config_holds_it():
    """The key of a run's error is the key of the config that gave the value: a variant's own, the
    train section's under a variant, a reference row's or a named delay mode's section."""
    config = _config()
    config["variants"] = {"gmc_bf": {"algorithm": "gmc", "train": {"sampling": {"dtype": "float32"}}}}
    config["sweep"]["algorithm"] = ["gmc", "gmc_bf"]
    bad = copy.deepcopy(config)
    bad["train"]["sampling"]["top_p"] = 0.9
    with pytest.raises(ConfigError, match=r"^train.sampling.top_p: training needs 1"):
        workflow.load(bad)
    bad = copy.deepcopy(config)
    bad["variants"]["gmc_bf"]["train"]["sampling"]["top_p"] = 0.9
    with pytest.raises(ConfigError, match=r"^variants.gmc_bf.train.sampling.top_p: training needs 1"):
        workflow.load(bad)
    bad = copy.deepcopy(config)
    bad["sweep"]["references"] = {"algorithm": ["is"], "delay": [80]}
    bad["train"]["delay"]["history_steps"] = 64
    with pytest.raises(ConfigError, match=r"^train.delay.history_steps: a history of 64 steps cannot fill"):
        workflow.load(bad)
    bad = copy.deepcopy(config)
    bad["train"]["samples_per_step"] = 1
    with pytest.raises(ConfigError, match=r"^train.samples_per_step: unknown key"):
        workflow.load(bad)


def test_a_variant_is_an_estimator_with_train_settings_of_its_own():
    """A variant's points run its estimator with its train settings merged over the section's;
    its name stands where an estimator's may, and a wrong name or value is refused naming the key."""
    config = _config()
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
    config["sweep"]["algorithm"] = [*config["sweep"]["algorithm"], "gmc_tis"]
    sweep = workflow.load(config)
    point = next(p for p in sweep.points if p.algorithm == "gmc_tis")
    cfg, plain = sweep.run(point), sweep.run(point._replace(algorithm="gmc"))
    assert cfg.algorithm == "gmc" and cfg.rollout_correction.resolved()["rollout_is"] == "token"
    assert cfg.sampling.dtype == "bfloat16" and cfg.sampling.max_new_tokens == plain.sampling.max_new_tokens
    assert plain.rollout_correction is None and plain.sampling.dtype is None
    for change, key in [
        ({"sweep": {**config["sweep"], "algorithm": ["gmc_nope"]}}, "sweep.algorithm[0]"),
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
        (
            {"variants": {"gmc_tis": {"algorithm": "gmc", "train": {"delay": {"warmup": "ramp"}}}}},
            "variants.gmc_tis.train.delay",
        ),
    ]:
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            workflow.load({**config, **change})


def test_a_fixed_sampling_budget_sets_the_prompts_per_step_of_every_group_size():
    """``sweep.samples_per_step``: every run draws that many rollouts a step, ``samples / G`` prompts
    of ``G`` answers; a budget that does not split into a group size is refused naming the key."""
    config = _config()
    config["sweep"] = {**config["sweep"], "group_size": [4, 8, 32], "samples_per_step": 64}
    sweep = workflow.load(config)
    assert {p.group: sweep.run(p).prompts_per_step for p in sweep.points} == {4: 16, 8: 8, 32: 2}
    config["sweep"]["group_size"] = [4, 24]
    with pytest.raises(
        ConfigError, match=r"sweep.samples_per_step: 64 rollouts per step do not split into groups of 24"
    ):
        workflow.load(config)
    config["sweep"]["group_size"], config["train"]["updates_per_batch"] = [32], 4  # 2 prompts in 4 updates
    with pytest.raises(ConfigError, match=r"train.updates_per_batch: prompts_per_step \(2\) must split"):
        workflow.load(config)


def test_the_gradient_lab_section_is_its_settings_and_needs_a_history_of_the_sweep():
    """``gradient_lab`` takes GradientLabConfig's keys beside where it sits in the workflow; a bad
    value or a sweep without the history it names is refused naming the key."""
    config = _config()
    config["gradient_lab"] = {"enabled": True, "batches": 8, "delays": [2, 4]}
    sweep = workflow.load(config)
    values = sweep.config.lab_values()
    assert values == {"batches": 8, "delays": [2, 4]} and sweep.config.lab.enabled
    name = sweep.lab_history()
    assert name in {n for n, _ in sweep.histories.values()}
    for change, key in [
        ({"batches": 2}, "gradient_lab.batches"),
        ({"algorithms": ["gmcc"]}, "gradient_lab.algorithms"),
        ({"history_seed": 99}, "gradient_lab.history_seed"),
    ]:
        with pytest.raises(ConfigError, match=key):
            workflow.load({**config, "gradient_lab": {**config["gradient_lab"], **change}})
    ramp = copy.deepcopy(config)
    ramp["train"]["delay"] = {"warmup": "ramp"}
    with pytest.raises(ConfigError, match="gradient_lab.history_seed: the gradient lab measures a history"):
        workflow.load(ramp)


def test_a_key_added_to_trainconfig_needs_no_second_edit(monkeypatch):
    """A new TrainConfig field is in the generated schema, described by its docstring, accepted in the
    workflow's train section and loaded, with nothing else edited."""

    @settings
    class Extended(TrainConfig):
        rollout_budget: int = 3
        """A knob a newcomer adds."""

    monkeypatch.setattr(workflow, "TrainConfig", Extended)  # the schema's class and the runs' class
    monkeypatch.setattr(resolve, "TrainConfig", Extended)
    config = _config()
    config["train"]["rollout_budget"] = 5
    sweep = workflow.load(config)
    assert workflow.schema()["properties"]["train"]["properties"]["rollout_budget"]["description"] == (
        "A knob a newcomer adds."
    )
    assert {sweep.run(p).rollout_budget for p in sweep.points} == {5}
    config["train"]["rollout_budget"] = "many"
    with pytest.raises(ConfigError, match="train.rollout_budget: .*integer"):
        workflow.load(config)
    monkeypatch.setattr(workflow, "TrainConfig", TrainConfig)  # the real class refuses the key
    monkeypatch.setattr(resolve, "TrainConfig", TrainConfig)
    with pytest.raises(ConfigError, match="train.rollout_budget: unknown key"):
        workflow.load(config)


def test_loading_fills_the_defaults_and_refuses_cross_key_mistakes():
    sweep = workflow.load({"sweep": {"algorithm": ["gmc"], "delay": [0], "group_size": [4], "seed": [0]}})
    config = sweep.config
    assert config.results == "results" and config.model == "tiny" and config.tiny_model == {}
    assert config.sweep.references.algorithm == [] and config.sweep.references.delay == []
    assert config.latency.enabled is False and config.train == {} and sweep.run_delay.warmup == "history"
    bad = _config()
    bad["train"] = {**bad["train"], "sampling": {"top_p": 0.9}}
    with pytest.raises(ConfigError, match="train.sampling.top_p: training needs 1"):
        workflow.load(bad)
    for key, home in SET_ELSEWHERE.items():
        misplaced = _config()
        misplaced["train"][key] = 1
        with pytest.raises(ConfigError, match=rf"train.{key}: every run takes this from {home}, not from train"):
            workflow.load(misplaced)


def test_each_run_config_is_built_once_and_kept():
    """The sweep builds each point's TrainConfig once (the histories are named from plain values,
    without building their configs), and every later read returns that object."""
    sweep = workflow.load(_config())
    first = [sweep.run(p) for p in sweep.points]
    assert all(sweep.run(p) is cfg for p, cfg in zip(sweep.points, first))
    assert len(sweep.histories) == len(sweep.points) and sweep.shared and len(sweep.base_eval_dirs()) == 5


def test_reading_and_validating_configs_imports_no_torch(tmp_path):
    """The workflow's parse (schema, validation) and loading a train or evaluate config need no torch."""
    (tmp_path / "train.yaml").write_text("steps: 3\nestimator: {eps: 0.1}\n")
    code = f"""
import json, sys
from gmc import workflow
from gmc.run.config import load_train_config
from gmc.run.evaluate import EvalConfig
from gmc.settings import load_config
workflow.schema()
workflow.load_file({str(REPO / "config.yaml")!r})
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
        ("train={stpes: 3}", "train.stpes"),
        ("train={estimator: {epss: 0.1}}", "train.estimator.epss"),
        ("train={estimator: {max_new_tokens: 64}}", "train.estimator.max_new_tokens"),
        ("evaluate={benchmarks: [synthetic], temprature: 1.0}", "evaluate.temprature"),
        ("tiny_model={tiney: 1}", "tiny_model.tiney"),
    ],
)
def test_a_misspelt_key_fails_the_dry_run_naming_it(tmp_path, override, key):
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    out = _snakemake(["-n", "--cores", "1", "--config", override], cwd=tmp_path)
    assert out.returncode != 0
    assert f"{key}: unknown key" in out.stdout + out.stderr


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
            "data_source=hub",
            f"data_root={tmp_path / 'mydata'}",
            "tracking_uri=sqlite:///results/mlflow.db",
            "experiment=sweep7",
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
        ("train={steps: 10}", lambda c: c.train["steps"] == 10),
        ("train={lr: 1e-4}", lambda c: c.train["lr"] == 1e-4),
        (
            "train={checkpoint_every: 0, master_weights: false, memory_limit_gib: null}",
            lambda c: (
                c.train["checkpoint_every"] == 0
                and c.train["master_weights"] is False
                and c.train["memory_limit_gib"] is None
            ),
        ),
        (
            "sweep={algorithm: [gmc, grpo], delay: [0, 8], group_size: [8], seed: [0, 1, 2]}",
            lambda c: c.sweep.seed == [0, 1, 2] and c.sweep.delay == [0, 8],
        ),
        (
            "latency={enabled: true, algorithm: [gmc], group_size: [8], delay: {slots: 32, beta: 0.25}}",
            lambda c: (c.latency.delay["slots"], c.latency.delay["beta"]) == (32, 0.25),
        ),
        (
            "evaluate={benchmarks: [synthetic], samples: {synthetic: 2}, temperature: 0.6}",
            lambda c: c.evaluate["samples"] == {"synthetic": 2} and c.evaluate["temperature"] == 0.6,
        ),
        ("data_source=hub", lambda c: c.data_source == "hub"),
    ],
)
def test_values_given_with_snakemake_config_are_read_as_the_jobs_read_them(override, check):
    """``snakemake --config`` hands nested values over as strings (its own parser, applied here as the
    command line applies it); the workflow reads them as a job's ``--set`` does, then validates."""
    from snakemake.cli import parse_config
    from snakemake.utils import update_config

    config = _config()
    update_config(config, parse_config([override]))
    assert check(workflow.load(config).config)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train={steps: ten}", "train.steps: must be a valid integer, got 'ten'"),
        ("train={stpes: 10}", "train.stpes: unknown key"),
        ("sweep={algorithm: [gmc], delay: [0], group_size: [8], seed: [zero]}", r"sweep.seed\[0\]: must be a valid"),
        (
            "train={delay: {max_staleness: 8}}",
            "train.delay.max_staleness: .* are set per sweep point, not in train: this one lives in "
            "ray.delay.max_staleness",
        ),
        ("train={delay: {d: 8}}", "train.delay.d: .* lives in sweep.delay"),
        ("train={delay: {history_steps: 4}}", "train.delay.history_steps: a history of 4 .* cannot fill a queue"),
        ("train={delay: {history_algorithm: ppo}}", "train.delay.history_algorithm: unknown estimator 'ppo'"),
        (
            "latency={enabled: true, algorithm: [gmc], group_size: [8], delay: {max_staleness: 2}}",
            "latency.delay.max_staleness: the latency mode reads",
        ),
        ("train={sampling: {max_new_tokens: 64}, estimator: {max_new_tokens: 32}}", "max_new_tokens: unknown key"),
        ("data_source=web", "data_source: must be 'local' or 'hub'"),
    ],
)
def test_a_wrong_value_from_snakemake_config_is_still_refused_naming_its_key(override, message):
    from snakemake.cli import parse_config
    from snakemake.utils import update_config

    config = _config()
    update_config(config, parse_config([override]))
    with pytest.raises(ConfigError, match=message):
        workflow.load(config)


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
    assert any(i.startswith("sweep=") for i in items) and any(i.startswith("tracking_uri=") for i in items), items
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    for item in items:
        out = _snakemake(["-n", "--cores", "1", "--config", item], cwd=tmp_path)
        assert out.returncode == 0, (item, (out.stdout + out.stderr)[-2000:])
