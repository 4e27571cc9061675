"""A sweep resolved once: its points, each run's whole configuration, and what runs share.

:class:`Sweep` takes the workflow's configuration (:class:`gmc.workflow.WorkflowConfig`, as
:func:`gmc.workflow.load` reads it) and resolves, once each: the points of the grid, the named
delay modes and the traces (:class:`~gmc.sweep.points.Point`); each point's
:class:`~gmc.run.config.TrainConfig`, built and validated once and kept; the runs that are
provably identical (trained once, :attr:`Sweep.shared`), the fixed-delay prefills and on-policy
histories that runs share (:attr:`Sweep.prefills`, :attr:`Sweep.histories`); the evaluation's
settings and the base models. The workflow's rules, ``gmc plan-memory --preset`` and the tests
read this object. The workflow writes each run's config to ``<results>/configs/train/<point>.yaml``
and the job reads that file and nothing else. A bad value is a :class:`~gmc.settings.ConfigError`
naming the key where the workflow's configuration holds it. No torch is imported.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from gmc.estimators import REGISTRY
from gmc.policy.preflight import looks_local
from gmc.rollouts.delays import named_delays, on_policy
from gmc.rollouts.sources import prefill_id
from gmc.run.config import TrainConfig, history_values
from gmc.run.evaluate import EvalConfig
from gmc.run.random_model import RandomModelConfig
from gmc.run.tiny_model import TinyModelConfig
from gmc.run.tracking import resolve_experiment, resolve_uri
from gmc.settings import ConfigError, from_dict, from_section, load_yaml, to_dict
from gmc.sweep.config import SET_ELSEWHERE, RunDelay
from gmc.sweep.points import TRACE_PREFIX, Delay, Point

BUILT_MODELS = ("tiny", "random-qwen3")
"""``model`` values built locally by a rule of the workflow (``workflow/rules/model.smk``)."""

PER_SEED_MODELS = ("tiny",)
"""Built models warm-started once per seed of the sweep (the build's seed is the run's): the base
model is part of what a seed varies, so intervals and paired differences cover it."""


class Sweep:
    """Every run of the workflow's configuration ``config`` and what they share, resolved once."""

    def __init__(self, config):
        self.config = config
        self.points = self._points()
        """Every run of the sweep, once each, in order: the grid (``sweep``), its reference rows
        (``sweep.references``), then the named delay modes' and the traces' points, every seed."""
        self._runs: dict[Point, TrainConfig] = {}
        for point in self.points:
            self.run(point)
        self.evaluation = from_section(EvalConfig, self.eval_values(), "evaluate")
        """The EvalConfig of every evaluation job (:meth:`eval_values`)."""
        # both builds' settings are checked whichever model the sweep uses: a mistake in either is named now
        for seed in config.sweep.seed:
            from_section(TinyModelConfig, self._tiny_settings(seed), "tiny_model")
        from_section(RandomModelConfig, dict(config.random_model), "random_model")

    # -- points ---------------------------------------------------------------------------------

    def _points(self) -> list[Point]:
        sweep, config = self.config.sweep, self.config
        grid = itertools.product(sweep.algorithm, sweep.delay, sweep.group_size, sweep.seed)
        refs = itertools.product(sweep.references.algorithm, sweep.references.delay, sweep.group_size, sweep.seed)
        points = [*grid, *refs]
        for mode in named_delays():
            section = getattr(config, mode)
            if section.enabled:
                points += itertools.product(section.algorithm, [mode], section.group_size, sweep.seed)
        for name, trace in config.traces.items():
            points += itertools.product(trace.algorithm, [f"{TRACE_PREFIX}{name}"], trace.group_size, sweep.seed)
        return list(dict.fromkeys(Point.of(*p) for p in points))

    def largest_point(self) -> Point:
        """The point of the largest memory need: the largest group, then the longest queue (largest
        fixed delay; a named mode or a trace counts as the largest)."""
        return max(self.points, key=lambda p: (p.group, p.delay.fixed if p.delay.is_fixed else float("inf")))

    # -- each run's configuration -----------------------------------------------------------------

    def run(self, point: Point) -> TrainConfig:
        """The whole TrainConfig of the run at ``point``, built and validated on first use and kept;
        a bad value is a :class:`ConfigError` naming the key where the workflow's configuration holds
        it (``train.lr``, ``latency.delay.slots``, ``model``)."""
        if point not in self._runs:
            values = self.run_values(point)
            try:
                self._runs[point] = from_dict(TrainConfig, values)
            except ConfigError as e:
                raise ConfigError(f"{e.reason} (run {point.path})", self._home(e.key, point)) from None
        return self._runs[point]

    def run_values(self, point: Point) -> dict[str, Any]:
        """The values a run's TrainConfig is built from: the ``train`` section (an estimator a tuning
        sweep chose settings for, ``tuned``, takes those over the section's; a variant's point,
        ``variants``, takes its estimator and its train settings over both), the keys set
        elsewhere (:data:`~gmc.sweep.config.SET_ELSEWHERE`) and the point's delay
        (:meth:`delay_values`); ``sweep.samples_per_step`` sets ``prompts_per_step`` to that many
        rollouts over the point's group size."""
        config = self.config
        variant = config.variants.get(point.algorithm)
        estimator = variant.algorithm if variant else point.algorithm
        train = dict(config.train)
        if estimator in self.tuned:
            train = _merged(train, {"estimator": self.tuned[estimator]})
        if variant:
            train = _merged(train, variant.train)
        train.pop("delay", None)
        uri = resolve_uri(config.tracking_uri, default=None)
        values = {
            **train,
            "model": self.model_dir(point.seed),
            "algorithm": estimator,
            "group_size": point.group,
            "seed": point.seed,
            "delay": self.delay_values(point.delay),
            "data_source": config.data_source,
            "data_root": config.data_root,
            "synthetic": config.synthetic,
            # live logging (a tracking URI in the config or $MLFLOW_TRACKING_URI): where, under which
            # experiment; otherwise only the configured experiment (the runs are imported at the end)
            "tracking_uri": uri,
            "experiment": resolve_experiment(config.experiment) if uri else config.experiment,
        }
        samples = config.sweep.samples_per_step
        if samples is not None:
            if samples % point.group:
                raise ConfigError(
                    f"{samples} rollouts per step do not split into groups of {point.group} (run {point.path})",
                    "sweep.samples_per_step",
                )
            values["prompts_per_step"] = samples // point.group
        return values

    @cached_property
    def tuned(self) -> dict[str, dict[str, Any]]:
        """The estimator settings a tuning sweep chose (``tuned``, the file of
        :data:`gmc.results.outputs.TUNED`), by estimator; empty without one. A missing or unreadable
        file, or one that is not a tuning sweep's, is a :class:`ConfigError` naming the key."""
        path = self.config.tuned
        if path is None:
            return {}
        try:
            chosen = load_yaml(Path(path).read_text())
        except OSError as e:
            raise ConfigError(f"cannot read the tuning sweep's choice {path}: {e.strerror}", "tuned") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}", "tuned") from None
        estimators = chosen.get("estimators") if isinstance(chosen, dict) else None
        if not isinstance(estimators, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("estimator"), dict) for v in estimators.values()
        ):
            raise ConfigError(
                f"{path} is not a tuning sweep's choice (estimators: {{<name>: {{estimator: {{...}}}}}}, "
                "as tables/tuned.yaml holds it)",
                "tuned",
            )
        for name in estimators:
            if name not in REGISTRY:
                raise ConfigError(f"{path} tunes {name!r}, which is no estimator {list(REGISTRY)}", "tuned")
        return {name: dict(v["estimator"]) for name, v in estimators.items()}

    @cached_property
    def run_delay(self) -> RunDelay:
        """What every run shares of its delay (``train.delay``)."""
        return from_section(RunDelay, self.config.train.get("delay", {}), "train.delay")

    @cached_property
    def history_steps(self) -> int:
        """The on-policy steps every run of a sweep with ``train.delay.warmup: history`` starts
        after: ``train.delay.history_steps``, else the sweep's largest fixed delay."""
        given = self.run_delay.history_steps
        delays = [*self.config.sweep.delay, *self.config.sweep.references.delay]
        return max(delays, default=0) if given is None else given

    def warmup_values(self) -> dict[str, Any]:
        """The warm-up settings of the sweep's runs (``train.delay``)."""
        shared = self.run_delay
        if shared.warmup != "history":
            return {"warmup": shared.warmup}
        return {"warmup": "history", "history_steps": self.history_steps, "history_algorithm": shared.history_algorithm}

    def delay_values(self, delay: Delay) -> dict[str, Any]:
        """The ``delay`` settings of a run at a point's ``delay``: ``fixed`` with ``d``, ``trace``
        with its file, else the named mode with its section's settings; every one but a replayed
        trace with the sweep's warm-up (under ``history`` every run of a seed starts from the end of
        one on-policy history; the other warm-ups concern a fixed delay's queue alone)."""
        if delay.is_fixed:
            return {"mode": "fixed", "d": delay.fixed, **self.warmup_values()}
        if delay.mode == "trace":
            return {"mode": "trace", "trace": self.config.traces[delay.trace].trace}
        named = {"mode": delay.mode, **getattr(self.config, delay.mode).delay}
        return {**named, **self.warmup_values()} if self.run_delay.warmup == "history" else named

    def _home(self, key: str | None, point: Point) -> str | None:
        """Where a TrainConfig key of the run at ``point`` lives in the workflow's configuration."""
        if key is None:
            return None
        top = key.split(".", 1)[0].split("[", 1)[0]
        variant = self.config.variants.get(point.algorithm)
        if variant is not None and _holds(variant.train, key):
            return f"variants.{point.algorithm}.train.{key}"
        # where the point's own section is: the grid, the references, a named delay mode or a trace
        axes = self.config.sweep
        if not point.delay.is_fixed:
            section = f"traces.{point.delay.trace}" if point.delay.mode == "trace" else point.delay.mode
        elif point.algorithm in axes.algorithm and point.delay.fixed in axes.delay:
            section = "sweep"
        else:
            section = "sweep.references"
        if top == "delay":
            leaf = key.split(".", 1)[1] if "." in key else ""
            if leaf in ("warmup", "history_steps", "history_algorithm"):
                return f"train.{key}"
            if point.delay.is_fixed:
                return f"{section}.delay"
            if point.delay.mode == "trace":
                return f"{section}.trace"
            return f"{section}.{key}"
        if top in ("algorithm", "group_size") and section != "sweep.references":
            return f"{section}.{top}"
        if top == "algorithm":
            return "sweep.references.algorithm"
        if top == "synthetic":
            return key
        return SET_ELSEWHERE.get(top, f"train.{key}")

    # -- the evaluation and the base models ---------------------------------------------------------

    def eval_values(self) -> dict[str, Any]:
        """The values of every evaluation job's EvalConfig: the ``evaluate`` section with the data
        and synthetic task settings."""
        config = self.config
        return dict(
            config.evaluate, data_source=config.data_source, data_root=config.data_root, synthetic=config.synthetic
        )

    @property
    def per_seed_model(self) -> bool:
        """Whether each seed has a base model of its own (:data:`PER_SEED_MODELS`)."""
        return self.config.model in PER_SEED_MODELS

    def per_seed_path(self, path: str, seed: int | str = "{seed}", ext: str = "") -> str:
        """``path`` with a ``seed~<seed>`` level where each seed has its own base model, then
        ``ext``; ``seed`` defaults to the workflow's ``{seed}`` wildcard. The one home of the
        per-seed layout: base models, their configs, logs and evaluations."""
        return f"{path}/seed~{seed}{ext}" if self.per_seed_model else f"{path}{ext}"

    def model_dir(self, seed: int | None = None) -> str:
        """The base model's folder for the runs of ``seed``: a local folder of weights where it is;
        a built or fetched model under ``<results>/models/`` (``<name>/seed~<seed>`` for a model
        built per seed)."""
        name, results = self.config.model, self.config.results
        if self.per_seed_model:
            if seed is None:
                raise ValueError(f"model {name} is built once per seed: give the seed")
            return self.per_seed_path(f"{results}/models/{name}", seed)
        if name in BUILT_MODELS:
            return f"{results}/models/{name}"
        if looks_local(name):
            return name
        return f"{results}/models/{'--'.join(Path(name).parts)}"

    def model_settings(self, seed: int | None = None) -> dict[str, Any]:
        """The settings of a locally built base model (``TinyModelConfig``: ``tiny_model`` with the
        seed and the synthetic task; ``RandomModelConfig``: ``random_model``)."""
        name = self.config.model
        if name == "tiny":
            return self._tiny_settings(seed)
        if name == "random-qwen3":
            return dict(self.config.random_model)
        raise ValueError(f"model {name} is not built locally")

    def _tiny_settings(self, seed: int | None) -> dict[str, Any]:
        return dict(self.config.tiny_model, seed=seed, synthetic=self.config.synthetic)

    def base_eval_dirs(self) -> list[str]:
        """Where the base model's evaluations go: ``eval/base/seed~<s>`` for each seed of a model
        built per seed, else ``eval/base``."""
        root = f"{self.config.results}/eval/base"
        return list(dict.fromkeys(self.per_seed_path(root, s) for s in self.config.sweep.seed))

    # -- what runs share ------------------------------------------------------------------------------

    @cached_property
    def shared(self) -> dict[Point, Point]:
        """Each point whose run is provably identical to an earlier point's, mapped to that point:
        same resolved settings but the estimator, on-policy, and estimators of one on-policy class
        (:func:`on_policy_class`); the sweep trains the first point of each class only."""
        first: dict[tuple, Point] = {}
        shared = {}
        for point in self.points:
            key = _share_key(self.run(point))
            if key is None:
                continue
            if key in first:
                shared[point] = first[key]
            else:
                first[key] = point
        return shared

    @cached_property
    def prefills(self) -> dict[Point, tuple[str, Point]]:
        """Each point whose fixed-delay prefill another point's run would generate too (same
        :func:`~gmc.rollouts.sources.prefill_settings`: every setting but the estimator), mapped to
        the prefill's name (:func:`~gmc.rollouts.sources.prefill_id`) and the first point of its
        class, whose config writes it; the sweep generates each once (``gmc prefill``) and starts
        every member from it (``gmc train --prefill``). A prefill of one run alone is left to that run."""
        members: dict[str, list[Point]] = {}
        for point in self.points:
            name = prefill_id(self.run(point))
            if name is not None:
                members.setdefault(name, []).append(point)
        return {p: (name, ps[0]) for name, ps in members.items() if len(ps) > 1 for p in ps}

    @cached_property
    def histories(self) -> dict[Point, tuple[str, tuple[int, ...]]]:
        """Each point whose run starts from a history (``warmup: history``), mapped to the history's
        name (:func:`history_id`) and the queues it generates: the fixed delays above 0 of the runs
        that start from it, ascending (:func:`~gmc.run.warmstart.queue_batches`: one queue each, so
        that every delay trains the same prompts in the same order). The sweep trains each history
        once (``gmc history``), as a run directory ``<results>/history/<name>``, and starts every
        member from it (``gmc train --history``)."""
        members: dict[str, list[tuple[Point, int]]] = {}
        for point in self.points:
            cfg = self.run(point)
            name = history_id(cfg)
            if name is not None:
                members.setdefault(name, []).append((point, cfg.delay.queued))
        return {p: (name, tuple(sorted({d for _, d in ms if d > 0}))) for name, ms in members.items() for p, _ in ms}

    def history_makers(self) -> dict[str, tuple[Point, tuple[int, ...]]]:
        """Each history's first member, whose config trains it, and the queues it generates."""
        makers: dict[str, tuple[Point, tuple[int, ...]]] = {}
        for point, (name, queues) in self.histories.items():
            makers.setdefault(name, (point, queues))
        return makers

    def lab_history(self, seed: int | None = None, group: int | None = None) -> str:
        """The name of the history the gradient lab measures: the history of the runs at ``seed`` and
        ``group`` (else the sweep's first seed and group size); a sweep without one is refused."""
        seed = self.config.sweep.seed[0] if seed is None else seed
        group = self.config.sweep.group_size[0] if group is None else group
        names = [
            self.histories[p][0] for p in self.points if p in self.histories and (p.seed, p.group) == (seed, group)
        ]
        if not names:
            raise ConfigError(
                f"the gradient lab measures a history of the sweep, and no run at seed {seed} and group size {group} "
                "starts from one (train.delay.warmup: history, a seed and group size of the sweep)",
                "gradient_lab.history_seed",
            )
        return names[0]


def _holds(section: dict[str, Any], key: str) -> bool:
    """Whether a section's given values hold the dotted ``key`` (list items as ``key[i]``)."""
    node: Any = section
    for part in key.split("."):
        name = part.split("[", 1)[0]
        if not isinstance(node, dict) or name not in node:
            return False
        node = node[name]
    return True


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s values, nested sections merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


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


def check_shared(member: TrainConfig, run: TrainConfig) -> tuple:
    """The on-policy class two runs share; a ValueError when they are not provably identical."""
    a, b = _share_key(member), _share_key(run)
    if a is None or a != b:
        raise ValueError(
            f"{member.algorithm} and {run.algorithm} do not train the same run: "
            f"{on_policy_class(member)} vs {on_policy_class(run)}, or other settings differ"
        )
    return a[0]


def history_id(cfg: TrainConfig) -> str | None:
    """A short name of the history a run starts from (:func:`~gmc.run.config.history_values`, its
    whole configuration): runs with the same name start from the same history. None without one."""
    history = history_values(cfg)
    if history is None:
        return None
    return hashlib.sha256(json.dumps(history, sort_keys=True).encode()).hexdigest()[:16]
