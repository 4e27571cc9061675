"""The training loop (method.md sections 3 and 4): it composes the other modules and owns no
math of its own.

Per step, :meth:`Trainer.train_step` takes a batch from the source of the run's delay mode
(:mod:`gmc.rollouts.sources`, which runs the collector of :mod:`gmc.rollouts.collect` on the
run's prompts), and for each of its ``updates_per_batch`` mini-batches back-propagates the
chosen estimator's loss (:mod:`gmc.policy.update`) and steps the optimizer; then it hands the new
weights to the rollout source and engine. Versions count optimizer updates throughout: step
``s`` asks its source for a batch with the weights of update ``s K`` (``K = updates_per_batch``)
and publishes those of update ``(s + 1) K``. :meth:`Trainer.run` hands each step's metrics and
groups to the run directory, checkpoints, and at the end writes the model and ``summary.json``
(:mod:`gmc.run.summary`); the run directory's files and guarantees are :mod:`gmc.run.rundir`'s.
A run that starts from a history or a prefill is set up by :mod:`gmc.run.warmstart`; a history
is itself a run of this loop (:func:`make_history`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from gmc.estimators import REGISTRY
from gmc.io import atomic_dir, write_json, write_text
from gmc.policy.masters import MasterWeights
from gmc.policy.model import DTYPES, compile_layers, load_policy, parameter_bytes
from gmc.policy.update import Update
from gmc.rollouts.collect import (
    PromptCursor,
    RunRollouts,
    rollout_metrics,
    rollout_side,
    training_records,
)
from gmc.rollouts.delays import delay_mode
from gmc.rollouts.groups import Group, staleness_stats
from gmc.run.config import TrainConfig, history_config, to_dict
from gmc.run.provenance import provenance
from gmc.run.rundir import (
    CONFIG,
    GROUPS,
    HISTORY,
    INFO,
    METRICS,
    CheckpointError,
    RunDir,
    group_record,
    nonfinite_tensors,
)
from gmc.run.summary import count_groups, summarize_metrics
from gmc.run.warmstart import load_prefill, missing_queues, queue_batches, start_from_history
from gmc.settings import ConfigError
from gmc.stop import STOP

log = logging.getLogger(__name__)


VERSION_UNIT = "update"
"""What a checkpoint's versions count (its queued and kept groups'): optimizer updates."""


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


PREEMPTED = 75
"""Exit status of ``gmc train`` stopped by SIGTERM or SIGUSR1 (:data:`gmc.stop.STOP`) after
checkpointing (``EX_TEMPFAIL``): resume with ``--resume``."""


class Preempted(RuntimeError):
    """The run was stopped by a signal at a step boundary, its checkpoint written."""


@dataclass
class Step:
    """What one optimizer step leaves for the run: its metrics and the groups it trained on."""

    metrics: dict[str, float]
    groups: list[Group]
    tokens: dict | None = None
    """Its tokens' log-probs, when the run records them (:meth:`gmc.policy.update.TokenLogprobs.packed`)."""


class Trainer:
    """One training run in ``out``; :meth:`run` trains (or resumes) to ``cfg.steps``."""

    clock = staticmethod(time.monotonic)
    """Seconds of the wall clock that ``checkpoint_minutes`` counts. The trainer's own, so that a
    test replaces it on the class or an instance, never ``time.monotonic`` for the whole process
    (the pools' helper threads read that too)."""

    def __init__(
        self,
        cfg: TrainConfig,
        out: str | os.PathLike,
        resume: bool = False,
        progress: bool = True,
        prefill: str | os.PathLike | None = None,
        history: str | os.PathLike | None = None,
        queues: Sequence[int] = (),
    ):
        """``prefill``: a shared prefill to start from (:func:`~gmc.run.warmstart.write_prefill`);
        ``history``: the run directory of a shared history to start from (``warmup: history``;
        without one such a run makes its own first, in ``out/history``); ``queues``: the fixed
        delays whose queues this run, a history, generates for the runs that start from it
        (:func:`~gmc.run.warmstart.queue_batches`), written to its run directory as it generates them."""
        self.cfg = cfg
        self.out = Path(out)
        self.progress = progress
        self.queues = sorted({d for d in queues if d > 0})
        self.rundir = RunDir(self.out)
        self.ckpt_path = self.rundir.checkpoint
        resuming = self.rundir.open(to_dict(cfg), resume)  # the lock, the config check, leftovers
        if resume and not resuming:
            log.warning("%s: no checkpoint to resume from; the run starts from step 0", self.out)
        try:
            if not resuming and history is None and history_config(cfg) is not None:
                history = make_history(cfg, self.out / HISTORY, [cfg.delay.queued], progress)
            self._setup(cfg, resuming, None if resuming else history)
            if prefill is not None and not resuming:  # a resumed run's checkpoint holds its queue
                load_prefill(self, Path(prefill))
        except BaseException:
            self.rundir.abandon()  # a start that failed leaves no folder that looks like a run
            raise

    def _setup(self, cfg: TrainConfig, resuming: bool, history: str | os.PathLike | None) -> None:
        # bad data and a plan that does not fit the device fail here, before the model loads
        records = training_records(cfg.train_data, cfg.synthetic, cfg.seed, cfg.data_source, cfg.data_root)
        mode = delay_mode(cfg.delay)
        mode.check_run(cfg)
        self.memory_plan = check_memory(cfg)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        # below float32, the parameters (and the optimizer's view of them) stay float32 masters
        # and every forward runs under autocast to model_dtype; or (master_weights: optimizer) the
        # parameters are in model_dtype and the optimizer steps float32 masters (method.md section 7)
        params_dtype = "float32" if cfg.master_weights is True else cfg.model_dtype
        self.compute_dtype = DTYPES[cfg.model_dtype]
        checkpointing = self.memory_plan.checkpointed_layers if self.memory_plan else cfg.gradient_checkpointing is True
        self.model, self.tokenizer = load_policy(cfg.model, params_dtype, cfg.device, checkpointing)
        if cfg.compile_layers:
            compile_layers(self.model)
        self.masters = (
            MasterWeights(p for p in self.model.parameters() if p.requires_grad)
            if cfg.master_weights == "optimizer" and cfg.model_dtype != "float32"
            else None
        )
        self.device = next(self.model.parameters()).device
        reference = None
        if cfg.estimator.kl_coef > 0:  # the frozen starting policy, loaded like the policy
            ref_device = self.device if cfg.reference_device == "auto" else cfg.reference_device
            reference, _ = load_policy(cfg.model, params_dtype, ref_device)
            reference.requires_grad_(False)
        self.update = Update.from_config(cfg, self.model, self.tokenizer.pad_token_id, reference)
        # on-policy runs train each batch with the weights that made it: the training forward gives
        # the behaviour log-probs exactly, no extra pass needed
        self.on_policy = mode.on_policy(cfg.delay)
        # a decoupled loss takes the policy of the batch's first update, which later updates recompute
        self.proximal = cfg.updates_per_batch > 1 and REGISTRY[cfg.algorithm].proximal
        # the run's own engine, grader and collector, unless its groups are generated by remote workers
        self.collector = (
            rollout_side(cfg, self.update, self.tokenizer, "none" if self.on_policy else cfg.behaviour_logprobs)
            if mode.in_process
            else None
        )
        self.engine = self.collector.engine if self.collector else None
        self.cursor = PromptCursor(records, cfg.seed)
        refill = cfg.refill_calls if cfg.zero_variance_filter else None
        self.source = mode.make_source(cfg, RunRollouts(self.cursor, self.collector, refill), records)
        self.optimizer = self._make_optimizer()
        self.scheduler = self.make_scheduler()
        self.step = 0
        self.consecutive_nonfinite = 0
        self.skipped = 0
        self.history: dict = {}  # what the run started from: the history's summary
        if resuming:
            self._load_checkpoint()
        else:
            self._start_fresh()
            if history is not None:
                start_from_history(self, Path(history))
        self.source.publish(self.model, self.step * cfg.updates_per_batch)

    # -- setup ------------------------------------------------------------------------------

    def _make_optimizer(self):
        params = self.masters.masters if self.masters else [p for p in self.model.parameters() if p.requires_grad]
        kind = self.cfg.optimizer
        if kind == "auto":
            kind = "adamw8bit" if self.device.type == "cuda" else "adamw"
        if kind == "adamw8bit":
            import bitsandbytes as bnb

            return bnb.optim.AdamW8bit(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        return torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def make_scheduler(self) -> torch.optim.lr_scheduler.LambdaLR:
        """The learning-rate schedule from step 0 (``lr_schedule`` after ``warmup_steps``), over the optimizer."""
        return torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)

    def _lr_factor(self, step: int) -> float:
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        if cfg.lr_schedule == "linear":
            return max(0.0, 1.0 - frac)
        if cfg.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))
        return 1.0

    def _start_fresh(self) -> None:
        self.rundir.reset()
        write_text(self.out / CONFIG, yaml.safe_dump(to_dict(self.cfg), sort_keys=False))
        self.run_info = provenance(
            seed=self.cfg.seed,
            device=str(self.device),
            threads=torch.get_num_threads(),
            parameter_bytes=parameter_bytes(self.model),
        )
        write_json(self.out / INFO, self.run_info)

    # -- one step -----------------------------------------------------------------------------

    def train_step(self) -> Step:
        """One training step: the source's next batch, trained with ``updates_per_batch``
        optimizer updates (:meth:`_mini_batches`); the rollout engine releases the device for
        them (:meth:`gmc.rollouts.streams.RolloutEngine.release_memory`) and takes the new weights
        after the last. A device that runs out of memory stops the run with the plan beside the
        measured peak (:func:`out_of_memory`). The step's metrics average its updates'."""
        K = self.cfg.updates_per_batch
        with out_of_memory(self.memory_plan, "generation", self.device):
            queued = queue_batches(self) if self.queues else {}  # timed apart: time/queue_seconds
            t0 = time.perf_counter()
            batch = self.source.next_batch(self.step * K)
        t1 = time.perf_counter()
        if self.engine is not None:
            self.engine.release_memory()
        updates, finite_any = [], False
        for k, (groups, proximal) in enumerate(self._mini_batches(batch.groups)):
            with out_of_memory(self.memory_plan, "training", self.device):
                loss, stats, rewards = self.update.backward(groups, self.on_policy and k == 0, proximal)
            if self.masters:
                self.masters.grads_in()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.masters.masters if self.masters else self.model.parameters(), self.cfg.max_grad_norm
            )
            finite = self._optimizer_step(bool(torch.isfinite(loss)) and bool(torch.isfinite(grad_norm)))
            finite_any |= finite
            updates.append(
                (
                    {
                        "train/loss": float(loss) if finite else float("nan"),
                        "train/grad_norm": float(grad_norm),
                        **stats,
                    },
                    groups,
                    rewards,
                    self._recorded(),
                )
            )
        if finite_any:
            self.scheduler.step()
        if self.engine is not None:
            self.engine.sync_weights(self.model)
        self.source.publish(self.model, (self.step + 1) * K)
        for g in batch.groups:  # the step's records are _mini_batches' copies, marked as each was consumed
            g.trained = True
        t2 = time.perf_counter()
        groups = [g for _, part, _, _ in updates for g in part]
        rewards = torch.cat([r for _, _, r, _ in updates])
        lengths = torch.cat([g.lengths for g in groups]).float()
        measured = mean_metrics([m for m, _, _, _ in updates])
        metrics = {
            "train/loss": measured.pop("train/loss"),
            "train/grad_norm": measured.pop("train/grad_norm"),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/reward_mean": float(rewards.mean()),
            "train/frac_groups_all_same": float((rewards.std(-1) == 0).float().mean()),
            "train/response_length_mean": float(lengths.mean()),
            "train/skipped_steps": float(self.skipped),
            **measured,
            **rollout_metrics(batch.collected),
            **staleness_stats(groups),
            **self.source.stats(),
            **queued,
            "time/step_seconds": t2 - t0,
            "time/update_seconds": t2 - t1,
        }
        tokens = [t for _, _, _, t in updates]
        return Step(metrics, groups, None if tokens[0] is None else concat_tokens(tokens))

    def _mini_batches(self, groups: list[Group]) -> list[tuple[list[Group], list | None]]:
        """The batch's groups in ``updates_per_batch`` mini-batches, in order, each with the
        proximal log-probs its loss takes (None: the current policy's); mini-batch ``k`` of step
        ``s`` is consumed by update ``s K + k`` (the source labels every version in updates).
        Before the first update one no-grad pass gives the later mini-batches the policy of the
        batch's first update: the behaviour of an on-policy batch (the sampler's in bypass mode)
        and a decoupled loss's proximal policy."""
        K = self.cfg.updates_per_batch
        per = len(groups) // K
        parts = [
            [dataclasses.replace(g, consumed_version=self.step * K + k) for g in groups[k * per : (k + 1) * per]]
            for k in range(K)
        ]
        later = [g for part in parts[1:] for g in part]
        first_policy = self.proximal or (self.on_policy and not self.update.sampler_behaviour)
        logprobs = iter(self.update.group_logprobs(later) if first_policy else [])
        out = [(parts[0], None)]
        for part in parts[1:]:
            lp = [next(logprobs) for _ in part] if first_policy else None
            if self.on_policy:
                for g, own in zip(part, [g.sampler_logp for g in part] if self.update.sampler_behaviour else lp):
                    g.behaviour_logp = own
            out.append((part, lp if self.proximal else None))
        return out

    def _recorded(self) -> dict | None:
        """The last update's token log-probs (:meth:`TokenLogprobs.packed`) when the run records them."""
        record = self.cfg.rollout_correction is not None and self.cfg.rollout_correction.record_logprobs
        return self.update.tokens.packed() if record else None

    def _optimizer_step(self, finite: bool) -> bool:
        """Step the optimizer on a finite loss and gradient, else skip and count; too many
        non-finite updates in a row stop the run."""
        if finite:
            self.optimizer.step()
            if self.masters:
                self.masters.weights_out()
            self.consecutive_nonfinite = 0
        else:
            self.skipped += 1
            self.consecutive_nonfinite += 1
        self.optimizer.zero_grad(set_to_none=True)
        if self.consecutive_nonfinite >= self.cfg.max_nonfinite_steps:
            raise NonFiniteError(
                f"{self.consecutive_nonfinite} consecutive updates with a non-finite loss or gradient at step "
                f"{self.step}; the last good checkpoint is {self.ckpt_path if self.ckpt_path.exists() else 'none'}"
            )
        return finite

    # -- checkpoints ----------------------------------------------------------------------

    def rng_state(self) -> dict:
        """Every random state of the run: the process's (Python, NumPy, torch, CUDA) and the engine's streams."""
        state = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "engine": self.engine.generator_state() if hasattr(self.engine, "generator_state") else None,
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def set_rng_state(self, rng: dict) -> None:
        """Every random state :meth:`rng_state` took: the process's (:func:`restore_rng_state`)
        and the engine's streams."""
        restore_rng_state(rng)
        if rng.get("engine") is not None and hasattr(self.engine, "set_generator_state"):
            self.engine.set_generator_state(rng["engine"])

    def save_checkpoint(self) -> None:
        """Write the checkpoint (see :mod:`gmc.run.rundir`); weights that are not finite are never written."""
        weights = self.model.state_dict()
        bad = nonfinite_tensors(weights)
        if bad:
            raise NonFiniteError(
                f"{len(bad)} of {len(weights)} weight tensors are not finite after step {self.step} (first: {bad[0]}); "
                f"no checkpoint written; the last good checkpoint is "
                f"{self.ckpt_path if self.ckpt_path.exists() else 'none'}"
            )
        state = {
            "step": self.step,
            "model": weights,
            "optimizer": self.optimizer.state_dict(),
            "optimizer_class": type(self.optimizer).__name__,
            "scheduler": self.scheduler.state_dict(),
            "rng": self.rng_state(),
            "cursor": self.cursor.state_dict(),
            "source": self.source.state_dict(),
            "skipped": self.skipped,
            "consecutive_nonfinite": self.consecutive_nonfinite,
            "run_info": self.run_info,
            "history": self.history,
            "masters": self.masters.state() if self.masters else None,
            "version_unit": VERSION_UNIT,
        }
        self.rundir.write_checkpoint(state)

    def _load_checkpoint(self) -> None:
        """Resume from the run directory's checkpoint, whichever device wrote it: the checkpoint
        is read onto the CPU (:meth:`RunDir.load_checkpoint`); the weights are copied into the
        model's own parameters and torch moves the optimizer's state to theirs, so no second copy
        of either lands on the device; the random states go where they belong
        (:func:`restore_rng_state`); the source's queued groups stay on the CPU until a step
        consumes them (the update moves each batch to the device)."""
        state = self.rundir.load_checkpoint()
        self.load_weights(state, self.out)
        self.scheduler.load_state_dict(state["scheduler"])
        self.set_rng_state(state["rng"])
        self.cursor.load_state_dict(state["cursor"])
        self.source.load_state_dict(state["source"])
        self.step = state["step"]
        self.skipped = state["skipped"]
        self.consecutive_nonfinite = state["consecutive_nonfinite"]
        self.run_info = state["run_info"]
        self.history = state.get("history", {})
        if self.step < self.cfg.steps:
            self.rundir.unfinish()
        if self.engine is not None:
            self.engine.sync_weights(self.model)
        self.rundir.truncate_logs(self.step)
        log.info("resumed %s at step %d", self.out, self.step)

    def load_weights(self, state: dict, where: Path) -> None:
        """The weights and optimizer state of a checkpoint (of this run, or of the history it starts
        from) into the model's own parameters and the optimizer. A checkpoint that labels its
        queued groups' versions in steps (:data:`VERSION_UNIT`) is refused where steps and updates
        differ (``updates_per_batch`` above 1)."""
        if self.cfg.updates_per_batch > 1 and state.get("version_unit") != VERSION_UNIT:
            raise CheckpointError(
                f"{where}: its checkpoint labels the queued groups' versions in steps, and this run counts "
                f"{self.cfg.updates_per_batch} updates a step: the versions would be misread; train it again"
            )
        kind = state.get("optimizer_class", type(self.optimizer).__name__)
        if kind != type(self.optimizer).__name__:
            raise CheckpointError(
                f"{where}: the checkpoint's optimizer state is {kind}'s, this run's optimizer is "
                f"{type(self.optimizer).__name__} (optimizer: auto is adamw8bit on CUDA, adamw elsewhere); resume on "
                "the kind of device that wrote it, or start a run that moves between devices with optimizer: adamw"
            )
        self.model.load_state_dict(state["model"])
        if self.masters:
            self.masters.load(state.get("masters"))
        self.optimizer.load_state_dict(state["optimizer"])

    # -- the loop -------------------------------------------------------------------------

    def close(self) -> None:
        """Shut the source (its workers), the collector (its grading pool) and the run directory (its lock)."""
        self.source.close()
        if self.collector:
            self.collector.close()
        self.rundir.close()

    def run(self) -> dict:
        """Train to ``cfg.steps``, checkpointing every ``checkpoint_every`` steps, every
        ``checkpoint_minutes`` of wall clock and at the end. SIGTERM or SIGUSR1 (:data:`STOP`)
        stops the run at the next step boundary with a checkpoint (:class:`Preempted`)."""
        cfg = self.cfg
        from gmc.run.tracking import live_tracker

        tracker = live_tracker(cfg.tracking_uri, cfg.experiment, self.out, self.run_info["run_id"], to_dict(cfg))
        bar = tqdm(
            total=cfg.steps, initial=self.step, desc=f"train {cfg.algorithm}", disable=not self.progress, unit="step"
        )
        STOP.install()  # again, if gmc train installed it: whatever replaced it since (Ray) is overruled
        last_checkpoint = self.clock()
        try:
            with self.rundir.logs(cfg.updates_per_batch) as logs:
                while self.step < cfg.steps:
                    step = self.train_step()
                    record = {"step": self.step, "time": time.time(), **step.metrics}
                    logs.write(record, [group_record(self.step, g) for g in step.groups])
                    if step.tokens is not None:
                        self.rundir.write_logprobs(self.step, step.tokens)
                    if tracker:
                        tracker.log(record)
                    bar.update(1)
                    bar.set_postfix(
                        reward=f"{record['train/reward_mean']:.3f}", stale=f"{record['async/staleness_mean']:.1f}"
                    )
                    self.step += 1
                    due = cfg.checkpoint_minutes and self.clock() - last_checkpoint >= 60 * cfg.checkpoint_minutes
                    if (
                        (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)
                        or self.step == cfg.steps
                        or due
                        or STOP.received
                    ):
                        self.save_checkpoint()
                        last_checkpoint = self.clock()
                    if STOP.received and self.step < cfg.steps:
                        raise Preempted(  # the command prints it: one line, not a log line beside it
                            f"stopped by {STOP.name} after step {self.step} of {cfg.steps}; the checkpoint "
                            f"is written: continue with gmc train --resume --out {self.out}"
                        )
            with atomic_dir(self.out / "model") as tmp:
                # the final model in its compute dtype (the masters stay in the checkpoint)
                state = {
                    k: v.to(self.compute_dtype) if v.is_floating_point() else v
                    for k, v in self.model.state_dict().items()
                }
                self.model.save_pretrained(tmp, state_dict=state)
                self.tokenizer.save_pretrained(tmp)
            summary = summarize_metrics(self.out / METRICS) | count_groups(self.out / GROUPS)
            summary.update({f"history/{k}": v for k, v in self.history.items() if v is not None})
            summary["run_id"] = self.run_info["run_id"]
            if self.queues:  # a history: the fixed delays whose queues it holds whole
                summary["queues"] = self.rundir.queues(self.queues)
            self.rundir.finish(summary, cfg.keep_checkpoints)
        finally:
            try:  # the stop signals stay recorded while the workers and Ray shut down
                bar.close()
                self.close()
            finally:
                STOP.restore()
        if tracker:
            tracker.finish(summary)
        return summary


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each metric over a step's updates; one update's own values when there is one."""
    if len(rows) == 1:
        return dict(rows[0])
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def concat_tokens(parts: list[dict]) -> dict:
    """A step's recorded token log-probs (:meth:`gmc.policy.update.TokenLogprobs.packed`) from its
    updates', mini-batch after mini-batch."""
    if len(parts) == 1:
        return parts[0]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def restore_rng_state(rng: dict) -> None:
    """Python's, NumPy's and torch's random states as a checkpoint's ``rng`` holds them, on any
    device: torch's generators take their states as CPU byte tensors, so each is brought to the
    CPU first, wherever the checkpoint's tensors were mapped; the CUDA states are restored only
    where CUDA is available, one per device both runs have (a run written on the CPU leaves
    them as the seed set them)."""
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(_cpu_bytes(rng["torch"]))
    if rng.get("cuda") and torch.cuda.is_available():
        states = [_cpu_bytes(s) for s in rng["cuda"]][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)


def _cpu_bytes(state) -> torch.Tensor:
    return torch.as_tensor(state).detach().to(device="cpu", dtype=torch.uint8)


def check_memory(cfg: TrainConfig):
    """The run's memory plan (:class:`gmc.policy.memory.Plan`) against its device (``memory_limit_gib``,
    else the CUDA device's free memory); a run whose plan does not fit is refused. None on a
    CPU without a limit, or for a model whose shape cannot be read."""
    from gmc.policy.memory import GIB, ModelShape, check_fits, device_limit, plan

    limit = device_limit(cfg)
    if limit is None:
        return None
    try:
        shape = ModelShape.of(cfg.model)
    except (ValueError, OSError, KeyError) as e:
        log.warning("no memory plan: %s", e)
        return None
    p = plan(cfg, limit, shape)
    log.info("memory plan (peak %.1f of %.1f GiB):\n%s", p.peak / GIB, limit / GIB, p.table())
    check_fits(p)
    return p


@contextlib.contextmanager
def out_of_memory(memory_plan, phase: str, device):
    """Turn the device's out-of-memory error in ``phase`` into a :class:`gmc.policy.memory.MemoryPlanError`
    that shows the plan beside the peak the device measured, so a wrong plan says which item it
    missed instead of a bare CUDA error."""
    from gmc.policy.memory import GIB, MemoryPlanError

    try:
        yield
    except torch.OutOfMemoryError as e:
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            measured = (
                f"measured: peak allocated {torch.cuda.max_memory_allocated(device) / GIB:.2f} GiB, peak "
                f"reserved {torch.cuda.max_memory_reserved(device) / GIB:.2f} GiB, free now {free / GIB:.2f} "
                f"of {total / GIB:.2f} GiB"
            )
        else:
            measured = f"measured: no peak counter on {device.type}"
        planned = (
            (
                f"planned: {getattr(memory_plan, phase) / GIB:.2f} GiB for {phase} of "
                f"{memory_plan.limit / GIB:.2f} GiB\n{memory_plan.table()}"
            )
            if memory_plan
            else "no memory plan"
        )
        raise MemoryPlanError(f"out of memory in {phase}; {measured}; {planned}\n({e})") from e


def make_history(cfg: TrainConfig, out: str | os.PathLike, queues: Sequence[int], progress: bool = True) -> Path:
    """Train the history of the run ``cfg`` (:func:`~gmc.run.config.history_config`) into the run
    directory ``out``, generating the queue of each fixed delay of ``queues`` into it
    (:func:`~gmc.run.warmstart.queue_batches`); an interrupted one goes on from its
    checkpoint, a finished one is left as it is. One that lacks a queue asked of it (a delay
    added to a sweep) is trained again with every queue, in ``<out>.again`` (resumable like any
    run), which then replaces it: only the history's own training generates a queue, and neither
    the history nor a queue depends on the other queues, so the weights and the queues it had
    come out as before on the same machine and thread count. Returns ``out``."""
    out = Path(out)
    again, old = out.with_name(out.name + ".again"), out.with_name(out.name + ".old")
    if not out.exists() and RunDir(again).finished:  # a swap interrupted between its two renames
        again.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    delays = sorted({d for d in queues if d > 0})
    if delays and cfg.zero_variance_filter:
        raise ConfigError(
            f"{out}: a history's queues (d = {delays}) hold the prompts that come next in the data order, "
            "which the filter's refills would move: a fixed delay after a history runs without it",
            "zero_variance_filter",
        )
    if not RunDir(out).finished:
        Trainer(history_config(cfg), out, resume=True, progress=progress, queues=delays).run()
    missing = missing_queues(out, delays)
    if missing:
        log.warning(
            "%s: a finished history without the queues of d = %s, which only its own training generates: "
            "training it again with every queue",
            out,
            missing,
        )
        Trainer(history_config(cfg), again, resume=True, progress=progress, queues=delays).run()
        out.rename(old)
        again.rename(out)
        shutil.rmtree(old)
    return out
