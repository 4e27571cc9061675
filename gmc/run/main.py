"""The run's commands as functions: ``gmc train`` (:func:`main_train`), ``gmc history``
(:func:`main_history`) and ``gmc prefill`` (:func:`main_prefill`), each from a config file and
``--set`` overrides; the command line (:mod:`gmc.cli`) parses the arguments and reports."""

from __future__ import annotations

import gc
import os
import tempfile
from pathlib import Path

import torch

from gmc.rollouts.sources import prefill_settings
from gmc.run.config import history_config, load_train_config
from gmc.run.rundir import CONFIG
from gmc.run.trainer import Trainer, make_history
from gmc.run.warmstart import no_prefill, write_prefill
from gmc.settings import ConfigError


def main_train(
    config: str | None,
    overrides: list[str],
    out: str,
    resume: bool,
    evaluation: tuple[str, str] | None = None,
    prefill: str | None = None,
    history: str | None = None,
) -> dict:
    """Train the run of ``config`` (with ``overrides``; with ``resume`` and no ``config``, the run
    that ``out`` holds, from its ``config.yaml``) into ``out``; with ``evaluation``
    (``(EvalConfig file, folder)``), then evaluate its final model in this process, exactly as
    ``gmc evaluate`` would (:func:`gmc.run.evaluate.evaluate`), without paying a second start-up. A bad
    evaluation config is refused before training."""
    if config is None and resume:  # the run the folder holds, as it was started
        config = str(Path(out) / CONFIG)
        if not Path(config).exists():
            raise ConfigError(f"--out {out}: holds no run to resume (no {CONFIG}); give --config to start one")
    cfg = load_train_config(config, overrides)
    eval_cfg = None
    if evaluation is not None:
        from gmc.run.evaluate import EvalConfig
        from gmc.settings import load_config

        eval_cfg = load_config(EvalConfig, evaluation[0])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer = Trainer(cfg, out, resume=resume, prefill=prefill, history=history)
    summary = trainer.run()
    if eval_cfg is not None:
        from gmc.run.evaluate import evaluate

        del trainer  # the policy, optimizer and engine go before the evaluation's model loads
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        evaluate(str(Path(out) / "model"), evaluation[1], eval_cfg)
    return summary


def main_history(config: str | None, overrides: list[str], out: str, queues: list[int] | None) -> None:
    """Make the history that the run of ``config`` (with ``overrides``) starts from, in ``out``,
    with the queues of the fixed delays ``queues`` (None: the run's own fixed delay)."""
    cfg = load_train_config(config, overrides)
    if history_config(cfg) is None:
        raise ConfigError(
            f"no history to make: delay.warmup is {cfg.delay.warmup!r} and the history's length "
            f"{cfg.delay.history_length}; a history is what a run with warmup: history starts from",
            "delay.warmup",
        )
    too_long = [d for d in queues or [] if d > cfg.delay.history_length]
    if too_long:
        raise ConfigError(
            f"--queues {' '.join(map(str, too_long))}: a history of {cfg.delay.history_length} steps generates "
            "a queue of at most as many batches",
            "delay.history_steps",
        )
    make_history(cfg, out, [cfg.delay.queued] if queues is None else queues)


def main_prefill(config: str | None, overrides: list[str], out: str) -> None:
    """Write the prefill of the run of ``config`` (with ``overrides``) to ``out``
    (:func:`~gmc.run.warmstart.write_prefill`); the run itself is not trained."""
    cfg = load_train_config(config, overrides)
    if prefill_settings(cfg) is None:  # refused before the model is loaded
        raise no_prefill(config or "the default config", cfg)
    with tempfile.TemporaryDirectory(prefix="gmc-prefill-") as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", progress=False)
        try:
            write_prefill(trainer, out)
        finally:
            trainer.close()
