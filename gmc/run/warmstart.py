"""How a run starts other than from its base model: from the end of an on-policy history
(``delay.warmup: history``, :func:`start_from_history`) or from a fixed-delay prefill that
another run of the same settings generated (:func:`write_prefill`, :func:`load_prefill`).

Each function takes the :class:`~gmc.run.trainer.Trainer` it starts, before its first step,
and sets what the warm start decides: weights and optimizer state, prompt order, random
streams and the rollout source's queue. A history or a prefill made for other settings is
refused, naming what differs.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
import yaml

from gmc.io import atomic_path, flatten, write_json
from gmc.rollouts.groups import Group
from gmc.rollouts.sources import prefill_settings
from gmc.run.config import history_config, to_dict
from gmc.run.rundir import CONFIG, INFO, SUMMARY, RunDir, config_fingerprint
from gmc.settings import ConfigError

log = logging.getLogger(__name__)


def start_from_history(trainer, path: Path) -> None:
    """Start ``trainer`` where the history in run directory ``path`` ended: its weights and
    optimizer state, prompt order and random streams; a fixed delay's queue takes its last ``d``
    batches, labelled with the updates that generated them (``-d K .. -K`` for ``K``
    ``updates_per_batch``: the run's own updates are ``0, 1, ...``), so that every batch is
    exactly ``d`` batches stale from the first step. The learning-rate schedule is the run's
    own, from its step 0. A history made for other settings (its ``updates_per_batch`` among
    them), unfinished, or keeping too few batches is refused, naming why."""
    cfg = trainer.cfg
    expected = history_config(cfg)
    hist = RunDir(path)
    if not hist.finished:
        raise ConfigError(f"--history {path}: not a finished history (no {SUMMARY}); make it with gmc history")
    try:
        saved = yaml.safe_load((path / CONFIG).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"--history {path}: its {CONFIG} cannot be read ({e})") from None
    mine, theirs = flatten(to_dict(expected)), flatten(saved if isinstance(saved, dict) else {})
    differing = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
    if differing:
        raise ConfigError(
            f"--history {path}: made for other settings (differing: {', '.join(differing[:8])}); "
            "a run starts from the history of its own settings but the estimator and the delay"
        )
    hist.fingerprint = config_fingerprint(to_dict(expected))
    state = hist.read_checkpoint(hist.checkpoint)
    trainer.load_weights(state, path)
    trainer.scheduler = trainer.make_scheduler()  # the run's own schedule from its step 0
    trainer.set_rng_state(state["rng"])
    trainer.cursor.load_state_dict(state["cursor"])
    d = cfg.delay.d if cfg.delay.mode == "fixed" else 0
    kept, H = state.get("kept_batches", []), state["step"]
    if len(kept) < d:
        raise ConfigError(
            f"--history {path}: keeps its last {len(kept)} batches; a queue of d = {d} needs {d} (gmc history --keep)"
        )
    updates = H * expected.updates_per_batch  # the history's, which its config shares with the run
    trainer.source.load_history(
        [
            [Group.from_state({**g, "version": g["version"] - updates, "consumed_version": None}) for g in batch]
            for batch in kept[len(kept) - d :]
        ]
        if d
        else []
    )
    if trainer.engine is not None:
        trainer.engine.sync_weights(trainer.model)
    summary = json.loads((path / SUMMARY).read_text())
    trainer.history = {"steps": H, "reward_mean_last20": summary.get("rollout/reward_mean_last20")}
    trainer.run_info["history"] = {
        "path": str(path),
        "run_id": summary.get("run_id"),
        "algorithm": expected.algorithm,
        **trainer.history,
    }
    write_json(trainer.out / INFO, trainer.run_info)
    log.info(
        "%s: starts from the history %s (%d on-policy updates of %s, %d queued batches)",
        trainer.out,
        path,
        updates,
        expected.algorithm,
        d,
    )


def no_prefill(where, cfg) -> ConfigError:
    """The error of a prefill asked of a run ``cfg`` that starts without one."""
    return ConfigError(
        f"{where}: no prefill to write (delay mode {cfg.delay.mode!r}, warmup {cfg.delay.warmup!r}, "
        f"d {cfg.delay.d}): a prefill is the queue a fixed delay with warmup: prefill and d > 0 starts with"
    )


def write_prefill(trainer, path: str | os.PathLike) -> None:
    """Generate the fixed-delay prefill of ``trainer``'s run (its ``d`` batches of the starting
    weights) and write it to ``path`` with the states it leaves (prompt cursor, random streams)
    and its measurements, for every run of the same :func:`~gmc.rollouts.sources.prefill_settings`
    to start from (``gmc train --prefill``) instead of generating it again."""
    settings = prefill_settings(trainer.cfg)
    if settings is None:
        raise no_prefill(trainer.out, trainer.cfg)
    if trainer.step:
        raise ConfigError(
            f"{trainer.out}: no prefill to write at step {trainer.step}: a prefill is the queue a run starts with"
        )
    collected = trainer.source.prefill(0)
    state = {
        "settings": settings,
        "source": trainer.source.state_dict(),
        "cursor": trainer.cursor.state_dict(),
        "rng": trainer.rng_state(),
        "collected": collected,
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_prefill(trainer, path: Path) -> None:
    """Start ``trainer`` from the prefill at ``path`` (:func:`write_prefill`): the run then goes
    on exactly as if it had generated it; a prefill made for other settings is refused, naming them."""
    cfg = trainer.cfg
    mine = prefill_settings(cfg)
    if mine is None:
        raise ConfigError(
            f"--prefill {path}: this run starts without a prefill (delay mode {cfg.delay.mode!r}, "
            f"warmup {cfg.delay.warmup!r}, d {cfg.delay.d})"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ConfigError(f"--prefill {path}: cannot be read ({type(e).__name__}: {e})") from None
    theirs = state.get("settings") if isinstance(state, dict) else None
    if theirs != mine:
        keys = sorted(k for k in {**mine, **(theirs or {})} if (theirs or {}).get(k) != mine.get(k))
        raise ConfigError(
            f"--prefill {path}: made for other settings (differing: {', '.join(keys[:8])}); a run "
            "shares the prefill of runs whose settings differ only in the estimator"
        )
    trainer.set_rng_state(state["rng"])
    trainer.cursor.load_state_dict(state["cursor"])
    trainer.source.load_prefill(state["source"], state["collected"])
    log.info("%s: starts from the prefill %s (%d queued batches)", trainer.out, path, len(state["source"]["queue"]))
