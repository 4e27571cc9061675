"""A sweep's points, the paths that name them, and the configuration of each run.

A point is ``algo~A/delay~D/group~G/seed~S`` under ``<results>/train`` (a run directory) and
``<results>/eval`` (its evaluation): one pattern, read by the workflow's rules (with Snakemake
wildcards) and by the analysis (to parse a path back). Its delay is a number ``d`` (the fixed
delay), the name of a named delay mode (``latency``, ``ray``: the settings of the config section
of that name) or ``trace-<name>`` (a recorded staleness trace, replayed: the ``traces`` section
names its file).

Each run is resolved here, once: :func:`resolve_run` takes the workflow's configuration (as
:func:`gmc.workflow.validate` leaves it: defaults filled, values coerced) and a point, and
returns the run's whole :class:`~gmc.config.TrainConfig`. The workflow writes it to
``<results>/configs/train/<point>.yaml`` and the job reads that file and nothing else; the
workflow's validation and ``gmc plan-memory --preset`` call the same function. Every
TrainConfig key has one home: the ``train`` section, or one of :data:`RUN_KEYS`, which the
``train`` section therefore does not accept. No torch is imported.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from gmc.asynchrony import prefill_id
from gmc.config import TrainConfig
from gmc.delays import DELAY_MODES, named_delays, on_policy
from gmc.estimator_info import REGISTRY
from gmc.evaluate import EvalConfig
from gmc.preflight import looks_local
from gmc.settings import ConfigError, from_dict, to_dict
from gmc.tracking import resolve_experiment, resolve_uri

POINT = "algo~{algo}/delay~{delay}/group~{group}/seed~{seed}"
"""A sweep point's path; the names in braces are the workflow's wildcards."""

_POINT_RE = re.compile(r"algo~(?P<algo>[^/]+)/delay~(?P<delay>[^/]+)/group~(?P<group>\d+)/seed~(?P<seed>\d+)")


def point_path(algo: str, delay: str | int, group: int, seed: int) -> str:
    """The path of one sweep point, relative to ``train/`` or ``eval/``."""
    return POINT.format(algo=algo, delay=delay, group=group, seed=seed)


def parse_point(path: str | Path) -> dict | None:
    """``{"algorithm", "delay", "group", "seed"}`` of the sweep point a path lies in (the delay as
    written: a number or a named delay mode); None outside a sweep."""
    m = _POINT_RE.search(Path(path).as_posix())
    if not m:
        return None
    return {"algorithm": m["algo"], "delay": m["delay"], "group": int(m["group"]), "seed": int(m["seed"])}


TRACE_PREFIX = "trace-"
"""``delay~trace-<name>``: the trace ``<name>`` of the config's ``traces`` section, replayed."""

ALGO_WILDCARD = r"[a-z][a-z0-9_]*"
"""Estimator names as they may appear in paths (``seq_mask``)."""


def delay_wildcard() -> str:
    """The values a point's delay may take: a number, a named delay mode or a trace."""
    return "|".join([r"\d+", *named_delays(), rf"{TRACE_PREFIX}[A-Za-z0-9_]+"])


def delay_order(delay: str) -> tuple[int, int, str]:
    """Sort key of a point's delay: numeric delays ascending, then the named delay modes in registry
    order (:data:`gmc.delays.DELAY_MODES`), then the traces by name."""
    if str(delay).isdigit():
        return (0, int(delay), "")
    named = named_delays()
    if delay in named:
        return (1, named.index(delay), "")
    if str(delay).startswith(TRACE_PREFIX):
        return (2, 0, delay)
    raise ValueError(f"delay~{delay}: neither a number, a named delay mode {named} nor {TRACE_PREFIX}<name>")


def delay_title(delay: str) -> str:
    """``delay d = 8``, a delay mode's label, or ``replayed trace <name>``."""
    if str(delay).isdigit():
        return f"delay d = {delay}"
    if str(delay).startswith(TRACE_PREFIX):
        return f"{DELAY_MODES['trace'].label} {delay.removeprefix(TRACE_PREFIX)}"
    return DELAY_MODES[delay].label


# ---------------------------------------------------------------------------------------------
# the points of a sweep and the configuration of each run


class Point(NamedTuple):
    """One sweep point: estimator, delay (as written in paths), group size, seed."""

    algorithm: str
    delay: str
    group: int
    seed: int

    @property
    def path(self) -> str:
        return point_path(*self)

    @classmethod
    def parse(cls, path: str | Path) -> Point:
        found = parse_point(path)
        if found is None:
            raise ValueError(f"{path}: not a sweep point ({POINT})")
        return cls(found["algorithm"], found["delay"], found["group"], found["seed"])


def sweep_points(config: dict[str, Any]) -> list[Point]:
    """Every run of the sweep, once each, in order: the grid (``sweep``), its reference rows
    (``sweep.references``), then the named delay modes' and the traces' points, every seed."""
    sweep = config["sweep"]
    points = list(itertools.product(sweep["algorithms"], sweep["delays"], sweep["group_sizes"], sweep["seeds"]))
    refs = sweep["references"]
    points += itertools.product(refs["algorithms"], refs["delays"], sweep["group_sizes"], sweep["seeds"])
    for delay, section in _delay_sections(config).items():
        points += itertools.product([s for s in section["algorithms"]], [delay], section["group_sizes"],
                                    sweep["seeds"])
    return list(dict.fromkeys(Point(a, str(d), int(g), int(s)) for a, d, g, s in points))


def _delay_sections(config: dict[str, Any]) -> dict[str, dict]:
    """The sweep's named delay points (the enabled named delay modes' sections) and traces, by delay."""
    named = {m: config[m] for m in named_delays() if config.get(m, {}).get("enabled")}
    traces = {f"{TRACE_PREFIX}{n}": t for n, t in config.get("traces", {}).items()}
    return {**named, **traces}


BUILT_MODELS = ("tiny", "random-qwen3")
"""``model.name`` values built locally by a rule of the workflow (``workflow/rules/model.smk``)."""

PER_SEED_MODELS = ("tiny",)
"""Built models warm-started once per seed of the sweep (the build's seed is the run's): the base
model is part of what a seed varies, so intervals and paired differences cover it."""


def per_seed_path(config: dict[str, Any], path: str, seed: int | str = "{seed}", ext: str = "") -> str:
    """``path`` with a ``seed~<seed>`` level where each seed has its own base model
    (:data:`PER_SEED_MODELS`), then ``ext``; ``seed`` defaults to the workflow's ``{seed}``
    wildcard. The one home of the per-seed layout: base models, their configs, logs and
    evaluations."""
    if config["model"]["name"] in PER_SEED_MODELS:
        return f"{path}/seed~{seed}{ext}"
    return f"{path}{ext}"


def model_dir(config: dict[str, Any], seed: int | None = None) -> str:
    """The base model's folder for the runs of ``seed``: a local folder of weights where it is; a
    built or fetched model under ``<results>/models/`` (``<name>/seed~<seed>`` for a model built
    per seed)."""
    name, results = config["model"]["name"], config["results"]
    if name in PER_SEED_MODELS:
        if seed is None:
            raise ValueError(f"model.name {name} is built once per seed: give the seed")
        return per_seed_path(config, f"{results}/models/{name}", seed)
    if name in BUILT_MODELS:
        return f"{results}/models/{name}"
    if looks_local(name):
        return name
    return f"{results}/models/{'--'.join(Path(name).parts)}"


def model_settings(config: dict[str, Any], seed: int | None = None) -> dict[str, Any]:
    """The settings of a locally built base model (``TinyModelConfig``: ``model.tiny`` with the
    seed and the synthetic task; ``RandomModelConfig``: ``model.random``)."""
    name = config["model"]["name"]
    if name == "tiny":
        return dict(config["model"]["tiny"], seed=seed, synthetic=config["synthetic"])
    if name == "random-qwen3":
        return dict(config["model"]["random"])
    raise ValueError(f"model.name {name} is not built locally")


def base_eval_dirs(config: dict[str, Any]) -> list[str]:
    """Where the base model's evaluations go: ``eval/base/seed~<s>`` for each seed of a model built
    per seed, else ``eval/base``."""
    root = f"{config['results']}/eval/base"
    return list(dict.fromkeys(per_seed_path(config, root, s) for s in config["sweep"]["seeds"]))


def delay_values(config: dict[str, Any], delay: str) -> dict[str, Any]:
    """The ``delay`` settings of a run at a point's ``delay``: ``fixed`` with ``d`` (and the sweep's
    warm-up) for a number, ``trace`` with its file, else the named mode with its section's settings."""
    if str(delay).isdigit():
        return {"mode": "fixed", "d": int(delay), "warmup": config["sweep"]["warmup"]}
    if delay.startswith(TRACE_PREFIX):
        return {"mode": "trace", "trace": config["traces"][delay.removeprefix(TRACE_PREFIX)]["file"]}
    return {"mode": delay, **config[delay]["delay"]}


def _mlflow(config: dict[str, Any]) -> dict[str, Any]:
    """Live logging (a tracking URI in the config or ``$MLFLOW_TRACKING_URI``): where, under which
    experiment; otherwise only the configured experiment (the runs are imported at the end)."""
    uri, experiment = resolve_uri(config["mlflow"]["tracking_uri"], default=None), config["mlflow"]["experiment"]
    if uri:
        return {"tracking_uri": uri, "experiment": resolve_experiment(experiment)}
    return {"tracking_uri": None, "experiment": experiment}


RUN_KEYS: dict[str, Callable[[dict, Point], Any]] = {
    "model": lambda config, point: model_dir(config, point.seed),
    "algorithm": lambda config, point: point.algorithm,
    "group_size": lambda config, point: point.group,
    "seed": lambda config, point: point.seed,
    "delay": lambda config, point: delay_values(config, point.delay),
    "data_source": lambda config, point: config["data"]["source"],
    "data_root": lambda config, point: config["data"]["root"],
    "synthetic": lambda config, point: config["synthetic"],
    "tracking_uri": lambda config, point: _mlflow(config)["tracking_uri"],
    "experiment": lambda config, point: _mlflow(config)["experiment"],
}
"""The TrainConfig keys a run takes from outside the ``train`` section, each from its one home:
``model.name``, the point, ``data``, ``synthetic``, ``mlflow`` (``delay``: ``sweep.delays`` and
``sweep.warmup``, the named delay modes' sections, ``traces``). ``estimator.max_new_tokens`` is
the run's ``sampling.max_new_tokens`` (:class:`~gmc.config.TrainConfig` sets it)."""

DERIVED_KEYS = ("estimator.max_new_tokens",)
"""TrainConfig keys no section holds: each follows from another key of the run."""


def run_values(config: dict[str, Any], point: Point) -> dict[str, Any]:
    """The values a run's TrainConfig is built from: the ``train`` section and :data:`RUN_KEYS`."""
    return {**config["train"], **{key: value(config, point) for key, value in RUN_KEYS.items()}}


def resolve_run(config: dict[str, Any], point: Point) -> TrainConfig:
    """The whole TrainConfig of the run at ``point`` of the sweep ``config``; a bad value is a
    :class:`ConfigError` naming the key where the workflow's configuration holds it
    (``train.lr``, ``latency.delay.slots``, ``model.name``)."""
    try:
        return from_dict(TrainConfig, run_values(config, point))
    except ConfigError as e:
        raise ConfigError(f"{e.reason} (run {point.path})", _section_key(e.key, point)) from None


def _section_key(key: str | None, point: Point) -> str | None:
    """Where a TrainConfig key lives in the workflow's configuration."""
    if key is None:
        return None
    top = key.split(".", 1)[0].split("[", 1)[0]
    if top == "delay":
        leaf = key.split(".", 1)[1] if "." in key else ""
        if str(point.delay).isdigit():
            return "sweep.delays" if leaf in ("", "d", "mode") else f"sweep.{leaf}"
        if point.delay.startswith(TRACE_PREFIX):
            return f"traces.{point.delay.removeprefix(TRACE_PREFIX)}.file"
        return f"{point.delay}.{key}"
    homes = {"model": "model.name", "algorithm": "sweep.algorithms", "group_size": "sweep.group_sizes",
             "seed": "sweep.seeds", "data_source": "data.source", "data_root": "data.root",
             "tracking_uri": "mlflow.tracking_uri", "experiment": "mlflow.experiment"}
    if top == "synthetic":
        return key
    return homes.get(top, f"train.{key}")


def resolve_eval(config: dict[str, Any]) -> EvalConfig:
    """The EvalConfig of every evaluation job: the ``evaluate`` section with the data and
    synthetic task settings."""
    values = eval_values(config)
    try:
        return from_dict(EvalConfig, values)
    except ConfigError as e:
        raise ConfigError(e.reason, f"evaluate.{e.key}" if e.key else "evaluate") from None


def eval_values(config: dict[str, Any]) -> dict[str, Any]:
    return dict(config["evaluate"], data_source=config["data"]["source"], data_root=config["data"]["root"],
                synthetic=config["synthetic"])


def largest_point(points: list[Point]) -> Point:
    """The point of the largest memory need: the largest group, then the longest queue (largest
    fixed delay; a named mode counts as the largest)."""
    return max(points, key=lambda p: (p.group, int(p.delay) if p.delay.isdigit() else float("inf")))


# ---------------------------------------------------------------------------------------------
# runs that are provably identical


SHARED_FILE = "shared.json"
"""In the run directory of a point that shares another point's run: which run, and why."""


def on_policy_class(cfg: TrainConfig) -> tuple | None:
    """What the run's loss reduces to when it trains every batch with the weights that made it
    (every ratio exactly 1): its estimator's declared class (``("pg", aggregation)``, the
    aggregation set in ``estimator.aggregation`` or else the estimator's own); None when the
    run is not on-policy or its estimator does not reduce to a plain policy gradient."""
    entry = REGISTRY[cfg.algorithm]
    if entry.on_policy is None or not on_policy(cfg.delay):
        return None
    kind, aggregation = entry.on_policy
    return (kind, cfg.estimator.aggregation or aggregation)


def _share_key(cfg: TrainConfig) -> tuple | None:
    cls = on_policy_class(cfg)
    if cls is None:
        return None
    values = to_dict(cfg)
    del values["algorithm"]
    return (cls, json.dumps(values, sort_keys=True))


def shared_runs(config: dict[str, Any], points: list[Point]) -> dict[Point, Point]:
    """Each point whose run is provably identical to an earlier point's, mapped to that point:
    same resolved settings but the estimator, on-policy, and estimators of one on-policy class
    (:func:`on_policy_class`); the sweep trains the first point of each class only."""
    first: dict[tuple, Point] = {}
    shared = {}
    for point in points:
        key = _share_key(resolve_run(config, point))
        if key is None:
            continue
        if key in first:
            shared[point] = first[key]
        else:
            first[key] = point
    return shared


def check_shared(member: TrainConfig, run: TrainConfig) -> tuple:
    """The on-policy class two runs share; a ValueError when they are not provably identical."""
    a, b = _share_key(member), _share_key(run)
    if a is None or a != b:
        raise ValueError(f"{member.algorithm} and {run.algorithm} do not train the same run: "
                         f"{on_policy_class(member)} vs {on_policy_class(run)}, or other settings differ")
    return a[0]


def shared_prefills(config: dict[str, Any], points: list[Point]) -> dict[Point, tuple[str, Point]]:
    """Each point whose fixed-delay prefill another point's run would generate too (same
    :func:`~gmc.asynchrony.prefill_settings`: every setting but the estimator), mapped to the
    prefill's name (:func:`~gmc.asynchrony.prefill_id`) and the first point of its class, whose
    config writes it; the sweep generates each once (``gmc prefill``) and starts every member
    from it (``gmc train --prefill``). A prefill of one run alone is left to that run."""
    members: dict[str, list[Point]] = {}
    for point in points:
        name = prefill_id(resolve_run(config, point))
        if name is not None:
            members.setdefault(name, []).append(point)
    return {p: (name, ps[0]) for name, ps in members.items() if len(ps) > 1 for p in ps}
