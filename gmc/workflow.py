"""The workflow's configuration (``config.yaml``, a preset, ``snakemake --config``) as settings
classes, and its loading: :func:`load` reads it once into a :class:`WorkflowConfig` and resolves
the sweep (:class:`gmc.sweep.resolve.Sweep`), which the Snakefile's rules, ``gmc plan-memory
--preset`` and the tests read. An entry point beside the CLI: its sections configure every room.
No torch is imported.

One vocabulary: a run's key is written as the run writes it (:class:`~gmc.run.config.TrainConfig`,
``gmc train --set``). What every job shares sits at the top level under the run's names
(``model``, ``data_source``, ``data_root``, ``synthetic``, ``tracking_uri``, ``experiment``); the
``train`` section holds the other run keys but the point's; the sweep's axes list values of the
run's keys (``sweep.algorithm``, ``sweep.delay``, ``sweep.group_size``, ``sweep.seed``). The
spellings of the previous release load with one line each on standard error naming the new key
(:data:`RENAMED`).

The schema (:func:`schema`) is generated from the classes: every key with its type, default and
the docstring under its field. A section that holds another settings class's keys (``train``,
``evaluate``, ``tiny_model``, ...) keeps them as given (:func:`gmc.settings.keys_of`), so a job's
config file holds what the section gave; each is validated here, by the class, when the sweep is
resolved. Snakemake hands ``--config`` values over as strings (``train={steps: 10}`` gives
``'10'``): :func:`coerce` reads every string where the schema wants no string as YAML, as a job's
own ``--set`` does, before anything is checked.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field

from gmc.estimators import REGISTRY
from gmc.results.outputs import AnalysisConfig
from gmc.rollouts.delays import DELAY_MODES, DelayConfig, named_delays
from gmc.run.config import TrainConfig
from gmc.run.evaluate import EvalConfig
from gmc.run.random_model import RandomModelConfig
from gmc.run.tiny_model import TinyModelConfig
from gmc.settings import (
    ConfigError,
    NonNegativeInt,
    from_dict,
    from_section,
    json_schema,
    keys_of,
    load_yaml,
    read_config_file,
    settings,
    to_dict,
)
from gmc.sweep.config import SET_ELSEWHERE, NamedDelay, RunDelay, SweepAxes, Trace, Variant
from gmc.sweep.resolve import Sweep
from gmc.tasks.synthetic import SyntheticTask
from gmc.theory.config import GradientLabConfig

EVAL_SET_PER_JOB = ("data_source", "data_root", "synthetic")
"""EvalConfig keys that the top level of the config sets."""

Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
TraceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")]


@settings
class Resources:
    """GPUs each job asks for (mapped to SLURM by the slurm profile)."""

    train_gpus: NonNegativeInt = 0
    """GPUs per training job (0 is CPU)."""
    eval_gpus: NonNegativeInt = 0
    """GPUs per evaluation job (0 is CPU)."""
    eval_with_training: bool = False
    """Evaluate each trained run in its training job, right after training (``gmc train
    --evaluate``: the same function, scores and files as an evaluation job, on the training job's
    threads and devices, without a second start-up of torch, transformers and the data), instead of
    in an evaluation job of its own. The base models are evaluated by jobs of their own either way.
    On the tiny model a start-up costs more than the evaluation itself; at paper scale a job of its
    own (false) gives the evaluation its own GPUs (``eval_gpus``) and a fresh process for its vLLM
    engine."""


@settings
class Theory:
    """The theory lab (``gmc theory``)."""

    quick: bool = True
    """Small sizes for the theory lab (seconds instead of minutes)."""


@settings
class LabPlacement:
    """Where the gradient lab sits in the workflow: the ``gradient_lab`` section's keys beside
    GradientLabConfig's."""

    enabled: bool = False
    """Run the lab (``<results>/gradient_lab/``) as part of the workflow's default target."""
    history_seed: int | None = None
    """The sweep seed whose history the lab measures; None, the first of ``sweep.seed``."""
    history_group_size: int | None = None
    """The group size of that history (its runs' ``G``); None, the first of ``sweep.group_size``."""


def _lab_schema(node: dict) -> None:
    node.clear()
    node.update(json_schema(GradientLabConfig))
    node["properties"].update(json_schema(LabPlacement)["properties"])


@settings
class WorkflowConfig:
    """The science of a sweep (method.md section 7): the base model, the data, the runs' settings,
    the grid of runs and the other points, the evaluation and the analysis. Machine settings
    (threads, partitions) live in Snakemake's profiles."""

    sweep: SweepAxes
    """The grid of training runs (algorithm x delay x group size x seed)."""
    results: str = "results"
    """Folder of every generated file (self-describing paths below it)."""
    model: str = "tiny"
    """The base policy every run starts from (the runs' ``model``): ``tiny`` builds the CPU policy
    locally (``tiny_model``), once per seed; ``random-qwen3`` a random-init Qwen3-architecture
    model with Qwen3's vocabulary (``random_model``); a local folder of Hugging Face weights is used
    as it is; otherwise a hub name (``Qwen/Qwen3-4B``), fetched once."""
    tiny_model: keys_of(lambda: TinyModelConfig, drop=("synthetic", "seed")) = field(default_factory=dict)
    """Shape and warm start of the tiny policy (TinyModelConfig, gmc/run/tiny_model.py; its seed is
    the sweep's, its task the ``synthetic`` section)."""
    random_model: keys_of(lambda: RandomModelConfig) = field(default_factory=dict)
    """Shape of the random-init model of ``model: random-qwen3`` (RandomModelConfig, gmc/run/random_model.py)."""
    data_source: Literal["local", "hub"] = "local"
    """Where benchmark and training files come from (the jobs' ``data_source``): ``local``, files
    under ``data_root``; ``hub``, the Hugging Face hub (needs a network)."""
    data_root: str | None = None
    """Local data root (``gmc prepare-data`` fills or checks it); None means ``$GMC_DATA_ROOT``, else
    ``data/`` in the repository."""
    synthetic: keys_of(lambda: SyntheticTask) = field(default_factory=dict)
    """The synthetic task (SyntheticTask, gmc/tasks/synthetic.py): one setting for the tiny model's
    warm start, training and the synthetic benchmark."""
    tracking_uri: str | None = None
    """MLflow tracking URI (the runs' ``tracking_uri``). Set (here or by ``$MLFLOW_TRACKING_URI``):
    training jobs log to it live and the runs are imported into it at the end. None and no
    ``$MLFLOW_TRACKING_URI``: the runs are imported at the end into ``sqlite:///<results>/mlflow.db``."""
    experiment: str | None = None
    """MLflow experiment (the runs' ``experiment``); None means ``$MLFLOW_EXPERIMENT_NAME``, else ``gmc``."""
    train: keys_of(lambda: TrainConfig, drop=SET_ELSEWHERE, nested={"delay": lambda: RunDelay}) = field(
        default_factory=dict
    )
    """TrainConfig keys shared by every run (gmc/run/config.py, defaults there), but those set at
    the top level and by the point (``algorithm``, ``group_size``, ``seed`` and the delay: the
    sweep's axes, a named delay mode's section, ``traces``); of ``delay`` it holds how every run
    starts (``warmup``, ``history_steps``, ``history_algorithm``). Each run's whole config is written
    to ``<results>/configs/train/<point>.yaml``."""
    tuned: str | None = None
    """A tuning sweep's choice (its ``tables/tuned.yaml``, :data:`gmc.results.outputs.TUNED`; a path
    from the working directory, ``published/tune/tables/tuned.yaml``): every run of an estimator it
    names trains with the estimator settings chosen there, over the ``train`` section's (a variant
    of it takes its own settings over those). None: no tuned settings."""
    variants: dict[Name, Variant] = field(default_factory=dict)
    """Named variants of an estimator, each run as sweep points of its own (``algo~<name>``) wherever
    an estimator may be named: the estimator (``algorithm``) with train settings of its own."""
    traces: dict[TraceName, Trace] = field(default_factory=dict)
    """Recorded staleness traces (a run's ``staleness_trace.jsonl``) replayed as the points
    ``delay~trace-<name>``."""
    latency: NamedDelay = field(default_factory=NamedDelay)
    """Runs under the latency model (``delay~latency``): its ``delay`` holds the DelayConfig keys
    that mode reads (``slots``, ``alpha``, ``beta``, ...)."""
    ray: NamedDelay = field(default_factory=NamedDelay)
    """Runs under real asynchrony, rollout workers on Ray (``delay~ray``): its ``delay`` holds the
    DelayConfig keys that mode reads (``workers``, ``max_staleness``, ...)."""
    evaluate: keys_of(lambda: EvalConfig, drop=EVAL_SET_PER_JOB) = field(default_factory=dict)
    """EvalConfig keys (gmc/run/evaluate.py, defaults there); ``data_source``, ``data_root`` and
    ``synthetic`` come from the top level."""
    analysis: keys_of(lambda: AnalysisConfig) = field(default_factory=dict)
    """How the tables judge differences (AnalysisConfig, gmc/results/outputs.py): Holm's adjustment
    per family, resolved, equivalent within the margin, or inconclusive."""
    theory: Theory = field(default_factory=Theory)
    """The theory lab (``gmc theory``)."""
    gradient_lab: Annotated[dict[str, Any], Field(json_schema_extra=_lab_schema)] = field(default_factory=dict)
    """The gradient lab (``gmc gradient-lab``, docs/results/theory.md): every estimator's bias against
    its on-policy target, excess over uncapped IS, second moment and statistics, measured on the
    policy's gradients at pairs of weights ``d`` versions apart from one history of the sweep: where
    it sits (LabPlacement) and what it measures (GradientLabConfig, gmc/theory/config.py)."""
    resources: Resources = field(default_factory=Resources)
    """GPUs each job asks for."""

    @property
    def lab(self) -> LabPlacement:
        """Where the gradient lab sits (the ``gradient_lab`` section's LabPlacement keys)."""
        return from_section(
            LabPlacement, {k: v for k, v in self.gradient_lab.items() if k in _LAB_KEYS}, "gradient_lab"
        )

    def lab_values(self) -> dict[str, Any]:
        """The GradientLabConfig keys of the ``gradient_lab`` section."""
        return {k: v for k, v in self.gradient_lab.items() if k not in _LAB_KEYS}


_LAB_KEYS = tuple(LabPlacement.__dataclass_fields__)


def schema() -> dict[str, Any]:
    """The JSON schema of ``config.yaml``, generated from :class:`WorkflowConfig` (every field
    described by its docstring, unknown keys refused), each named delay mode's ``delay`` limited to
    the DelayConfig keys that mode reads."""
    out = json_schema(WorkflowConfig)
    delay_keys = json_schema(DelayConfig)["properties"]
    for mode in named_delays():
        node = out["properties"][mode]["properties"]["delay"]
        node.update(
            type="object",
            additionalProperties=False,
            properties={k: delay_keys[k] for k in DELAY_MODES[mode].keys},
        )
    return out


# ---------------------------------------------------------------------------------------------
# the previous release's spellings

RENAMED: dict[str, str] = {
    "model.name": "model",
    "model.tiny": "tiny_model",
    "model.random": "random_model",
    "data.source": "data_source",
    "data.root": "data_root",
    "mlflow.tracking_uri": "tracking_uri",
    "mlflow.experiment": "experiment",
    "sweep.algorithms": "sweep.algorithm",
    "sweep.delays": "sweep.delay",
    "sweep.group_sizes": "sweep.group_size",
    "sweep.seeds": "sweep.seed",
    "sweep.warmup": "train.delay.warmup",
    "sweep.history.steps": "train.delay.history_steps",
    "sweep.history.algorithm": "train.delay.history_algorithm",
    "sweep.references.algorithms": "sweep.references.algorithm",
    "sweep.references.delays": "sweep.references.delay",
    **{f"{mode}.{old}": f"{mode}.{old[:-1]}" for mode in named_delays() for old in ("algorithms", "group_sizes")},
    "traces.*.file": "traces.*.trace",
    "traces.*.algorithms": "traces.*.algorithm",
    "traces.*.group_sizes": "traces.*.group_size",
}
"""Each key of the previous release and the key that holds it now (``*``: any trace's name). They
load for one more release, each with a line on standard error naming the new key; a key given in
both spellings with two values is refused."""

_EMPTIED = ("model", "data", "mlflow", "sweep.history")
"""Sections of the previous release that the renames empty."""


def _get(node: dict, dotted: str) -> tuple[bool, Any]:
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _pop(node: dict, dotted: str) -> Any:
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node[part]
    return node.pop(leaf)


def _put(node: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for i, part in enumerate(parents):
        if node.get(part) is None:
            node[part] = {}
        if not isinstance(node[part], dict):
            raise ConfigError(f"must be a mapping to hold {dotted}", ".".join(parents[: i + 1]))
        node = node[part]
    node[leaf] = value


def migrate(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """A copy of ``config`` with every key of the previous release (:data:`RENAMED`) under its new
    name, each announced in one line on standard error (``source``: where the config came from);
    the sections that empties are dropped, and a key of theirs that has no new home is refused,
    naming it."""
    out = copy.deepcopy(config)
    if isinstance(out.get("model"), str):  # the new spelling: no old model section to empty
        renames = {k: v for k, v in RENAMED.items() if not k.startswith("model.")}
    else:
        renames = dict(RENAMED)
    traces = out.get("traces") if isinstance(out.get("traces"), dict) else {}
    expanded = {}
    for old, new in renames.items():
        if "*" in old:
            expanded.update({old.replace("*", name): new.replace("*", name) for name in traces})
        else:
            expanded[old] = new
    moved = []
    for old, new in expanded.items():
        given, value = _get(out, old)
        if not given:
            continue
        _pop(out, old)
        moved.append((old, new, value))
    for section in _EMPTIED:
        given, node = _get(out, section)
        if given and isinstance(node, dict):
            if node:
                key = next(iter(node))
                raise ConfigError(f"unknown key of the previous release's {section} section", f"{section}.{key}")
            _pop(out, section)
    for old, new, value in moved:
        present, current = _get(out, new)
        if present and current != value:
            raise ConfigError(f"{old} is the previous spelling of {new}, and both are given: keep {new}", old)
        _put(out, new, value)
        print(f"{source}: {old} is deprecated, write {new}", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------
# loading


def coerce(value: Any, node: dict[str, Any]) -> Any:
    """``value`` with every string that the schema ``node`` does not take as a string read as YAML
    (numbers, booleans, null, lists, mappings), recursively, as ``gmc train --set`` reads a value;
    what stays wrong is left for the validation to name."""
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
        return coerce(parsed, node) if not isinstance(parsed, str) else parsed
    if isinstance(value, dict):
        props = next((b["properties"] for b in branches if "properties" in b), {})
        extra = None  # the schema of a mapping's values, under any key or a pattern of keys (variants, traces)
        for b in branches:
            if isinstance(b.get("additionalProperties"), dict):
                extra = b["additionalProperties"]
            elif b.get("patternProperties"):
                extra = next(iter(b["patternProperties"].values()))
        return {k: coerce(v, props[k]) if k in props else coerce(v, extra) if extra else v for k, v in value.items()}
    if isinstance(value, list):
        items = next((b["items"] for b in branches if isinstance(b.get("items"), dict)), None)
        return [coerce(v, items) for v in value] if items else value
    return value


SET_ABOVE = {
    "evaluate": {key: key for key in EVAL_SET_PER_JOB},
    "tiny_model": {"seed": "sweep.seed", "synthetic": "synthetic"},
}
"""The keys of a section's class that another part of the config sets, and where it sets each."""


def _refuse_misplaced(config: dict[str, Any]) -> None:
    """The keys a job takes from elsewhere are refused in its section (``train``, a variant's
    train, ``evaluate``, ``tiny_model``), naming where each lives."""
    for section, homes in SET_ABOVE.items():
        for key in config.get(section) or {}:
            if key in homes:
                raise ConfigError(f"every job takes this from {homes[key]}, not from {section}", f"{section}.{key}")
    sections = {"train": config.get("train")}
    for name, variant in (config.get("variants") or {}).items():
        if isinstance(variant, dict):
            sections[f"variants.{name}.train"] = variant.get("train")
    for where, train in sections.items():
        if not isinstance(train, dict):
            continue
        for key in train:
            if key in SET_ELSEWHERE:
                raise ConfigError(f"every run takes this from {SET_ELSEWHERE[key]}, not from train", f"{where}.{key}")
        delay = train.get("delay")
        if delay is None:
            continue
        if where != "train":
            raise ConfigError("a variant's runs share the sweep's delay settings (train.delay)", f"{where}.delay")
        shared = set(RunDelay.__dataclass_fields__)
        homes = {
            "mode": "the sweep point (sweep.delay, a named delay mode's section, traces)",
            "d": "sweep.delay",
            "trace": "traces.<name>.trace",
        }
        for mode in named_delays():
            homes.update({k: f"{mode}.delay.{k}" for k in DELAY_MODES[mode].keys})
        for key in delay if isinstance(delay, dict) else [""]:
            if key not in shared:
                where_else = homes.get(key, f"the sweep's sections (sweep, {', '.join(named_delays())}, traces)")
                raise ConfigError(
                    f"delay settings but {sorted(shared)} are set per sweep point, not in train: this one lives "
                    f"in {where_else}",
                    f"train.delay.{key}" if key else "train.delay",
                )


def _check(config: WorkflowConfig) -> None:
    """Cross-key checks of a loaded configuration: each named delay mode's section holds the keys
    that mode reads; every algorithm a section names is an estimator or a variant, and no variant
    takes an estimator's name."""
    for mode in named_delays():
        given = getattr(config, mode).delay
        extra = sorted(set(given) - set(DELAY_MODES[mode].keys))
        if extra:
            raise ConfigError(
                f"the {mode} mode reads {list(DELAY_MODES[mode].keys)}, not {extra[0]!r}", f"{mode}.delay.{extra[0]}"
            )
        from_section(DelayConfig, {**given, "mode": mode}, f"{mode}.delay")  # checked, enabled or not
    for name in config.variants:
        if name in REGISTRY:
            raise ConfigError(f"a variant cannot take an estimator's name {name!r}", f"variants.{name}")
    lists = {
        "sweep.algorithm": config.sweep.algorithm,
        "sweep.references.algorithm": config.sweep.references.algorithm,
        **{f"{m}.algorithm": getattr(config, m).algorithm for m in named_delays()},
        **{f"traces.{n}.algorithm": t.algorithm for n, t in config.traces.items()},
    }
    for key, names in lists.items():
        for i, name in enumerate(names):
            if name not in REGISTRY and name not in config.variants:
                raise ConfigError(
                    f"{name!r} is neither an estimator {list(REGISTRY)} nor a variant {list(config.variants)}",
                    f"{key}[{i}]",
                )


def load(config: dict[str, Any], source: str = "config") -> Sweep:
    """The workflow's configuration ``config`` (a mapping as Snakemake holds it) read once: the
    previous release's keys renamed (:func:`migrate`), strings coerced (:func:`coerce`), built into
    a :class:`WorkflowConfig`, cross-checked, and its sweep resolved (every run's TrainConfig, the
    evaluation's settings, the base models' and the analysis' and gradient lab's settings
    validated); a :class:`ConfigError` names the key and what it allows. Returns the
    :class:`~gmc.sweep.resolve.Sweep`, whose ``config`` is the :class:`WorkflowConfig`."""
    values = migrate(config, source)
    _refuse_misplaced(values)
    values = coerce(values, schema())
    loaded = from_dict(WorkflowConfig, values)
    _check(loaded)
    sweep = Sweep(loaded)
    from_section(AnalysisConfig, loaded.analysis, "analysis")
    from_section(GradientLabConfig, loaded.lab_values(), "gradient_lab")
    lab = loaded.lab
    if lab.enabled:
        sweep.lab_history(lab.history_seed, lab.history_group_size)
    return sweep


def plain_config(sweep: Sweep) -> dict[str, Any]:
    """The loaded configuration of ``sweep`` as plain values, in today's spelling with every
    default filled: the ``train`` section as the sweep's first run resolves it (but the keys set
    elsewhere; its ``delay`` what every run shares), ``evaluate`` as the evaluation resolves it.
    What the Snakefile leaves in Snakemake's ``config`` for the report's text to read."""
    values = to_dict(sweep.config)
    run = to_dict(sweep.run(sweep.points[0]))
    values["train"] = {k: v for k, v in run.items() if k not in SET_ELSEWHERE and k != "delay"}
    values["train"]["delay"] = to_dict(sweep.run_delay)
    values["evaluate"] = {k: v for k, v in to_dict(sweep.evaluation).items() if k not in EVAL_SET_PER_JOB}
    return values


def load_file(path: str | Path) -> Sweep:
    """:func:`load` of a YAML file (``config.yaml`` or a preset); a missing or unreadable file is named."""
    return load(read_config_file(path), str(path))
