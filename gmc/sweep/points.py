"""A sweep's points and the paths that name them.

A point is ``algo~A/delay~D/group~G/seed~S`` under ``<results>/train`` (a run directory) and
``<results>/eval`` (its evaluation): one pattern, read by the workflow's rules (with Snakemake
wildcards) and by the analysis (to parse a path back). Its delay is a number ``d`` (the fixed
delay), the name of a named delay mode (``latency``, ``ray``: the settings of the config section
of that name) or ``trace-<name>`` (a recorded staleness trace, replayed: the ``traces`` section
names its file). The base models' folders (one per seed for a model built per seed) are named
here too. No torch is imported.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, NamedTuple

from gmc.policy.preflight import looks_local
from gmc.rollouts.delays import DELAY_MODES, named_delays

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
    order (:data:`gmc.rollouts.delays.DELAY_MODES`), then the traces by name."""
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
        points += itertools.product([s for s in section["algorithms"]], [delay], section["group_sizes"], sweep["seeds"])
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


def largest_point(points: list[Point]) -> Point:
    """The point of the largest memory need: the largest group, then the longest queue (largest
    fixed delay; a named mode counts as the largest)."""
    return max(points, key=lambda p: (p.group, int(p.delay) if p.delay.isdigit() else float("inf")))
