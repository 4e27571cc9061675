"""The configuration of each run of a sweep, resolved once.

:func:`resolve_run` takes the workflow's configuration (as :func:`gmc.workflow.validate`
leaves it: defaults filled, values coerced) and a point, and returns the run's whole
:class:`~gmc.run.config.TrainConfig`. The workflow writes it to
``<results>/configs/train/<point>.yaml`` and the job reads that file and nothing else; the
workflow's validation and ``gmc plan-memory --preset`` call the same function. Every
TrainConfig key has one home: the ``train`` section, or one of :data:`RUN_KEYS`, which the
``train`` section therefore does not accept. Runs that are provably identical are trained once
(:func:`shared_runs`), and fixed-delay runs that start from the same prefill share it
(:func:`shared_prefills`). No torch is imported.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from gmc.estimators import REGISTRY
from gmc.rollouts.delays import on_policy
from gmc.rollouts.sources import prefill_id
from gmc.run.config import TrainConfig, history_config
from gmc.run.evaluate import EvalConfig
from gmc.run.tracking import resolve_experiment, resolve_uri
from gmc.settings import ConfigError, from_dict, to_dict
from gmc.sweep.points import TRACE_PREFIX, Point, model_dir


def history_steps(config: dict[str, Any]) -> int:
    """The on-policy updates every run of a sweep with ``sweep.warmup: history`` starts after:
    ``sweep.history.steps``, else the sweep's largest fixed delay."""
    given = config["sweep"]["history"]["steps"]
    delays = [*config["sweep"]["delays"], *config["sweep"]["references"]["delays"]]
    return max(delays, default=0) if given is None else given


def warmup_values(config: dict[str, Any]) -> dict[str, Any]:
    """The warm-up settings of the sweep's runs (``sweep.warmup``, ``sweep.history``)."""
    if config["sweep"]["warmup"] != "history":
        return {"warmup": config["sweep"]["warmup"]}
    return {
        "warmup": "history",
        "history_steps": history_steps(config),
        "history_algorithm": config["sweep"]["history"]["algorithm"],
    }


def delay_values(config: dict[str, Any], delay: str) -> dict[str, Any]:
    """The ``delay`` settings of a run at a point's ``delay``: ``fixed`` with ``d`` for a number,
    ``trace`` with its file, else the named mode with its section's settings; every one but a
    replayed trace with the sweep's warm-up (under ``history`` every run of a seed starts from the
    end of one on-policy history; the other warm-ups concern a fixed delay's queue alone)."""
    if str(delay).isdigit():
        return {"mode": "fixed", "d": int(delay), **warmup_values(config)}
    if delay.startswith(TRACE_PREFIX):
        return {"mode": "trace", "trace": config["traces"][delay.removeprefix(TRACE_PREFIX)]["file"]}
    named = {"mode": delay, **config[delay]["delay"]}
    return {**named, **warmup_values(config)} if config["sweep"]["warmup"] == "history" else named


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
``sweep.warmup`` and ``sweep.history``, the named delay modes' sections, ``traces``)."""


def run_values(config: dict[str, Any], point: Point) -> dict[str, Any]:
    """The values a run's TrainConfig is built from: the ``train`` section and :data:`RUN_KEYS`; a
    variant's point (``variants``) takes its estimator and its train settings over the section's;
    ``sweep.samples_per_step`` sets ``prompts_per_step`` to that many rollouts over the point's
    group size."""
    variant = config.get("variants", {}).get(point.algorithm)
    train = _merged(config["train"], variant.get("train", {})) if variant else config["train"]
    values = {**train, **{key: value(config, point) for key, value in RUN_KEYS.items()}}
    samples = config["sweep"].get("samples_per_step")
    if samples is not None:
        if samples % point.group:
            raise ConfigError(
                f"{samples} rollouts per step do not split into groups of {point.group} (run {point.path})",
                "sweep.samples_per_step",
            )
        values["prompts_per_step"] = samples // point.group
    if variant:
        values["algorithm"] = variant["algorithm"]
    return values


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s values, nested sections merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve_run(config: dict[str, Any], point: Point) -> TrainConfig:
    """The whole TrainConfig of the run at ``point`` of the sweep ``config``; a bad value is a
    :class:`ConfigError` naming the key where the workflow's configuration holds it
    (``train.lr``, ``latency.delay.slots``, ``model.name``)."""
    values = run_values(config, point)
    try:
        return from_dict(TrainConfig, values)
    except ConfigError as e:
        variant = config.get("variants", {}).get(point.algorithm, {})
        key = e.key and e.key.split(".", 1)[0].split("[", 1)[0]
        where = (
            f"variants.{point.algorithm}.train.{e.key}"
            if key in variant.get("train", {})
            else _section_key(e.key, point)
        )
        raise ConfigError(f"{e.reason} (run {point.path})", where) from None


def _section_key(key: str | None, point: Point) -> str | None:
    """Where a TrainConfig key lives in the workflow's configuration."""
    if key is None:
        return None
    top = key.split(".", 1)[0].split("[", 1)[0]
    if top == "delay":
        leaf = key.split(".", 1)[1] if "." in key else ""
        if leaf in ("history_steps", "history_algorithm"):
            return f"sweep.history.{leaf.removeprefix('history_')}"
        if str(point.delay).isdigit():
            return "sweep.delays" if leaf in ("", "d", "mode") else f"sweep.{leaf}"
        if point.delay.startswith(TRACE_PREFIX):
            return f"traces.{point.delay.removeprefix(TRACE_PREFIX)}.file"
        return f"{point.delay}.{key}"
    homes = {
        "model": "model.name",
        "algorithm": "sweep.algorithms",
        "group_size": "sweep.group_sizes",
        "seed": "sweep.seeds",
        "data_source": "data.source",
        "data_root": "data.root",
        "tracking_uri": "mlflow.tracking_uri",
        "experiment": "mlflow.experiment",
    }
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
    return dict(
        config["evaluate"],
        data_source=config["data"]["source"],
        data_root=config["data"]["root"],
        synthetic=config["synthetic"],
    )


# ---------------------------------------------------------------------------------------------
# runs that are provably identical


def on_policy_class(cfg: TrainConfig) -> tuple | None:
    """What the run's loss reduces to when it trains every batch with the weights that made it
    (every ratio exactly 1): its estimator's declared class (``("pg", aggregation)``, the
    aggregation set in ``estimator.aggregation`` or else the estimator's own); None when the
    run is not on-policy or its estimator does not reduce to a plain policy gradient."""
    if not on_policy(cfg.delay):
        return None
    entry = REGISTRY[cfg.algorithm]
    return entry.on_policy_class(entry.resolved(cfg.estimator))


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
        raise ValueError(
            f"{member.algorithm} and {run.algorithm} do not train the same run: "
            f"{on_policy_class(member)} vs {on_policy_class(run)}, or other settings differ"
        )
    return a[0]


def shared_prefills(config: dict[str, Any], points: list[Point]) -> dict[Point, tuple[str, Point]]:
    """Each point whose fixed-delay prefill another point's run would generate too (same
    :func:`~gmc.rollouts.sources.prefill_settings`: every setting but the estimator), mapped to the
    prefill's name (:func:`~gmc.rollouts.sources.prefill_id`) and the first point of its class, whose
    config writes it; the sweep generates each once (``gmc prefill``) and starts every member
    from it (``gmc train --prefill``). A prefill of one run alone is left to that run."""
    members: dict[str, list[Point]] = {}
    for point in points:
        name = prefill_id(resolve_run(config, point))
        if name is not None:
            members.setdefault(name, []).append(point)
    return {p: (name, ps[0]) for name, ps in members.items() if len(ps) > 1 for p in ps}


def history_id(cfg: TrainConfig) -> str | None:
    """A short name of the history a run starts from (:func:`~gmc.run.config.history_config`, its
    whole configuration): runs with the same name start from the same history. None without one."""
    history = history_config(cfg)
    if history is None:
        return None
    return hashlib.sha256(json.dumps(to_dict(history), sort_keys=True).encode()).hexdigest()[:16]


def shared_histories(config: dict[str, Any], points: list[Point]) -> dict[Point, tuple[str, int]]:
    """Each point whose run starts from a history (``warmup: history``), mapped to the history's
    name (:func:`history_id`) and the batches it keeps: the largest fixed delay among the runs
    that start from it. The sweep trains each history once (``gmc history``), as a run directory
    ``<results>/history/<name>``, and starts every member from it (``gmc train --history``)."""
    members: dict[str, list[tuple[Point, int]]] = {}
    for point in points:
        cfg = resolve_run(config, point)
        name = history_id(cfg)
        if name is not None:
            members.setdefault(name, []).append((point, cfg.delay.d if cfg.delay.mode == "fixed" else 0))
    return {p: (name, max(d for _, d in ms)) for name, ms in members.items() for p, _ in ms}


def lab_history(config: dict[str, Any], points: list[Point]) -> str:
    """The name of the history the gradient lab measures (``gradient_lab.history_seed`` and
    ``history_group_size``, else the sweep's first seed and group size): the history of the runs
    at that seed and group size (:func:`shared_histories`); a sweep without one is refused."""
    lab = config["gradient_lab"]
    seed = config["sweep"]["seeds"][0] if lab["history_seed"] is None else lab["history_seed"]
    group = config["sweep"]["group_sizes"][0] if lab["history_group_size"] is None else lab["history_group_size"]
    histories = shared_histories(config, [p for p in points if p.seed == seed and p.group == group])
    if not histories:
        raise ConfigError(
            f"the gradient lab measures a history of the sweep, and no run at seed {seed} and group "
            f"size {group} starts from one (sweep.warmup: history, a seed and group size of the sweep)",
            "gradient_lab.history_seed",
        )
    return next(iter(histories.values()))[0]
