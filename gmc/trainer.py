"""The asynchronous training loop (method.md sections 3 and 4).

Per step: sample prompts, generate a group per prompt with the current weights, grade, compute
behaviour log-probs with the trainer model, push; pop what is due (:mod:`gmc.asynchrony`);
compute advantages and the chosen estimator's loss (:mod:`gmc.estimators`); step the
optimizer. The loop composes the other modules and owns no math of its own.

A run directory holds ``config.yaml`` (resolved), ``run.json`` (provenance: run id, git
revision, package versions, seed), ``metrics.jsonl`` (one line per step), ``groups.jsonl``
(one line per consumed group: staleness, length, reward), ``checkpoint.pt`` (the latest) and
``checkpoint.prev.pt`` (the one before), and at the end ``model/`` and ``summary.json``.
``summary.json`` is written last: its presence marks a finished run. Ownership, resume checks
and checkpoint files are :mod:`gmc.rundir`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import random
import subprocess
import time
import uuid
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from gmc.asynchrony import Group, make_source, staleness_stats
from gmc.config import TrainConfig, to_dict
from gmc.data import format_prompt, load_dataset, load_file
from gmc.estimator_info import diagnostic_names
from gmc.estimators import get_estimator
from gmc.io import (
    atomic_dir,
    read_jsonl,
    truncate_jsonl,
    write_json,
    write_text,
)
from gmc.policy import DTYPES, load_policy, parameter_bytes
from gmc.rewards import Grader
from gmc.rollout import make_engine
from gmc.rundir import RunDir, nonfinite_tensors
from gmc.update import Rows, Update, precision

log = logging.getLogger(__name__)

TIME_PREFIX = "time/"
"""Wall-clock metrics (with the line's ``time`` stamp); everything else in ``metrics.jsonl`` is
reproducible from the seed."""


def without_time(rows: list[dict]) -> list[dict]:
    """Metrics lines without their wall-clock entries: what a seed reproduces."""
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith(TIME_PREFIX)} for r in rows]


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


# ---------------------------------------------------------------------------------------------
# data cursor


class PromptCursor:
    """Walks a seeded permutation of the training records, epoch after epoch; resumable."""

    def __init__(self, records, seed: int):
        self.records = records
        self.seed = seed
        self.epoch = 0
        self.pos = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.records)).tolist()

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation()


def training_records(cfg: TrainConfig):
    if cfg.train_data == "synthetic":
        return cfg.synthetic.generate("train", 5000, seed=cfg.seed)
    if Path(cfg.train_data).suffix in (".jsonl", ".json", ".parquet"):
        return load_file(cfg.train_data)
    return load_dataset(cfg.train_data, source=cfg.data_source, root=cfg.data_root)


# ---------------------------------------------------------------------------------------------
# provenance


def git_revision() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def package_versions() -> dict[str, str]:
    out = {}
    for name in ("gmc", "torch", "transformers", "tokenizers", "numpy", "math-verify", "mlflow", "bitsandbytes", "vllm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


# ---------------------------------------------------------------------------------------------
# the trainer


class Trainer:
    """One training run in ``out``; :meth:`run` trains (or resumes) to ``cfg.steps``."""

    def __init__(self, cfg: TrainConfig, out: str | Path, resume: bool = False, progress: bool = True):
        self.cfg = cfg
        self.out = Path(out)
        self.progress = progress
        self.rundir = RunDir(self.out)
        self.ckpt_path = self.rundir.checkpoint
        resuming = self.rundir.open(to_dict(cfg), resume)  # the lock, the config check, leftovers
        try:
            self._setup(cfg, resuming)
        except BaseException:
            self.rundir.close()
            raise

    def _setup(self, cfg: TrainConfig, resuming: bool) -> None:
        self.records = training_records(cfg)  # bad data fails here, before the model loads
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        # below float32, the parameters (and the optimizer's view of them) stay float32 masters
        # and every forward runs under autocast to model_dtype (method.md section 7)
        params_dtype = "float32" if cfg.master_weights else cfg.model_dtype
        self.compute_dtype = DTYPES[cfg.model_dtype]
        self.model, self.tokenizer = load_policy(cfg.model, params_dtype, cfg.device, cfg.gradient_checkpointing)
        self.device = next(self.model.parameters()).device
        self.pad_id = self.tokenizer.pad_token_id
        reference = None
        if cfg.estimator.kl_coef > 0:  # the frozen starting policy, loaded like the policy
            ref_device = self.device if cfg.reference_device == "auto" else cfg.reference_device
            reference, _ = load_policy(cfg.model, params_dtype, ref_device)
            reference.requires_grad_(False)
        self.engine = make_engine(cfg.engine, self.model, self.tokenizer, model_path=cfg.model, seed=cfg.seed,
                                  vllm=cfg.vllm, dtype=cfg.model_dtype)
        self.cursor = PromptCursor(self.records, cfg.seed)
        self.grader = Grader()
        self.loss_fn = get_estimator(cfg.algorithm)
        # cfg.estimator.max_new_tokens is sampling.max_new_tokens already (TrainConfig sets it)
        self.update = Update(self.model, self.loss_fn, cfg.estimator, cfg.micro_batch_tokens, self.pad_id,
                             temperature=cfg.sampling.temperature, chunk_size=cfg.logprob_chunk_size,
                             reference=reference, compute_dtype=self.compute_dtype)
        self.source = make_source(cfg.delay, self._make_groups, cfg.prompts_per_step, seed=cfg.seed)
        # on-policy steps (sync, or fixed delay 0) train on the batch they generate, with the same
        # weights: the training forward gives the behaviour log-probs exactly, no extra pass needed
        self.on_policy = cfg.delay.mode == "sync" or (cfg.delay.mode == "fixed" and cfg.delay.d == 0)
        self.optimizer = self._make_optimizer()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0
        self.consecutive_nonfinite = 0
        self.skipped = 0
        self._gen_log: list[dict] = []
        if resuming:
            self._load_checkpoint()
        else:
            self._start_fresh()

    # -- setup ------------------------------------------------------------------------------

    def _make_optimizer(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        kind = self.cfg.optimizer
        if kind == "auto":
            kind = "adamw8bit" if self.device.type == "cuda" else "adamw"
        if kind == "adamw8bit":
            import bitsandbytes as bnb

            return bnb.optim.AdamW8bit(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        return torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

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
        write_text(self.out / "config.yaml", yaml.safe_dump(to_dict(self.cfg), sort_keys=False))
        self.run_info = {
            "run_id": uuid.uuid4().hex,
            "git_revision": git_revision(),
            "packages": package_versions(),
            "python": platform.python_version(),
            "seed": self.cfg.seed,
            "device": str(self.device),
            "parameter_bytes": parameter_bytes(self.model),
        }
        write_json(self.out / "run.json", self.run_info)

    # -- rollouts -----------------------------------------------------------------------------

    def _make_groups(self, n: int, version: int) -> list[Group]:
        """Generate, grade and score ``n`` groups with the current weights."""
        cfg = self.cfg
        t0 = time.perf_counter()
        idx = self.cursor.take(n)
        recs = [self.records[i] for i in idx]
        prompts = [format_prompt(self.tokenizer, r.problem, cfg.thinking) for r in recs]
        # the HF engine samples with the trainer's own module, so in its compute dtype
        with precision(self.model, self.compute_dtype) if cfg.engine == "hf" else contextlib.nullcontext():
            sample_groups = self.engine.generate(prompts, cfg.group_size, cfg.sampling)
        flat = [s for g in sample_groups for s in g]
        golds = [r.answer for r in recs for _ in range(cfg.group_size)]
        grades = self.grader.grade_batch([s.text for s in flat], golds)
        lengths = [s.length for s in flat]
        groups = []
        G = cfg.group_size
        for k, rec_index in enumerate(idx):
            rows = range(k * G, (k + 1) * G)
            Tg = max(1, max(lengths[i] for i in rows))
            resp = torch.full((G, Tg), self.pad_id, dtype=torch.long)
            sampler = torch.zeros(G, Tg)
            for j, i in enumerate(rows):
                resp[j, : lengths[i]] = torch.tensor(flat[i].token_ids, dtype=torch.long)
                sampler[j, : lengths[i]] = torch.tensor(flat[i].logprobs)
            mask = torch.arange(Tg).unsqueeze(0) < torch.tensor([lengths[i] for i in rows]).unsqueeze(1)
            groups.append(Group(
                prompt_index=rec_index,
                prompt_ids=torch.tensor(flat[k * G].prompt_ids, dtype=torch.long),
                response_ids=resp,
                response_mask=mask,
                rewards=torch.tensor([grades[i].reward for i in rows], dtype=torch.float32),
                # on-policy: the training forward gives them; behaviour_logprobs: sampler: the engine's
                behaviour_logp=None if self.on_policy else sampler,
                sampler_logp=sampler,
                version=version,
            ))
        t_behaviour, mismatch = time.perf_counter(), None  # the behaviour pass, timed alone
        if not self.on_policy and cfg.behaviour_logprobs == "trainer":
            # the same canonical micro-batches, mode and dtype as the training forward (gmc.update)
            behaviour = self.update.logprobs(self.model, Rows.from_groups(groups)).cpu()
            for k, g in enumerate(groups):
                g.behaviour_logp = behaviour[k * G : (k + 1) * G, : g.response_ids.shape[1]].clone()
            mismatch = max(float((torch.tensor(s.logprobs) - behaviour[i, : s.length]).abs().max()) if s.length else 0.0
                           for i, s in enumerate(flat))
        behaviour_seconds = time.perf_counter() - t_behaviour
        self._gen_log.append({
            "n": len(flat), "tokens": sum(lengths), "seconds": time.perf_counter() - t0,
            "behaviour_seconds": behaviour_seconds,
            "reward_sum": sum(g.reward for g in grades), "length_max": max(lengths),
            "truncated": sum(s.finish_reason == "length" for s in flat), "mismatch": mismatch,
        })
        return groups

    def _rollout_metrics(self) -> dict[str, float]:
        logs, self._gen_log = self._gen_log, []
        if not logs:
            return {}
        n = sum(g["n"] for g in logs)
        tokens = sum(g["tokens"] for g in logs)
        seconds = sum(g["seconds"] for g in logs)
        out = {
            "rollout/reward_mean": sum(g["reward_sum"] for g in logs) / n,
            "rollout/response_length_mean": tokens / n,
            "rollout/response_length_max": float(max(g["length_max"] for g in logs)),
            "rollout/frac_truncated": sum(g["truncated"] for g in logs) / n,
            "rollout/samples": float(n),
            "time/rollout_seconds": seconds,
            "time/rollout_tokens_per_second": tokens / max(seconds, 1e-9),
            "time/behaviour_seconds": sum(g["behaviour_seconds"] for g in logs),
            "rollout/generate_calls": float(len(logs)),
        }
        mismatches = [g["mismatch"] for g in logs if g["mismatch"] is not None]
        if mismatches:
            out["rollout/logp_mismatch_max"] = max(mismatches)
        return out

    # -- one step -----------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        batch = self.source.next_batch(self.step)
        t1 = time.perf_counter()
        on_policy = all(g.behaviour_logp is None for g in batch)
        loss, stats, rewards = self.update.backward(batch, on_policy)
        lengths = torch.cat([g.lengths for g in batch]).float()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
            self.scheduler.step()
            self.consecutive_nonfinite = 0
        else:
            self.skipped += 1
            self.consecutive_nonfinite += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.engine.sync_weights(self.model)
        t2 = time.perf_counter()
        metrics = {
            "train/loss": float(loss.detach()) if finite else float("nan"),
            "train/grad_norm": float(grad_norm),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/reward_mean": float(rewards.mean()),
            "train/frac_groups_all_same": float((rewards.std(-1) == 0).float().mean()),
            "train/response_length_mean": float(lengths.mean()),
            "train/skipped_steps": float(self.skipped),
            **stats,
            **self._rollout_metrics(),
            **staleness_stats(batch),
            **self.source.stats(),
            "time/step_seconds": t2 - t0,
            "time/update_seconds": t2 - t1,
        }
        self._last_batch = batch
        if not finite and self.consecutive_nonfinite >= cfg.max_nonfinite_steps:
            raise NonFiniteError(
                f"{self.consecutive_nonfinite} consecutive steps with a non-finite loss or gradient at step "
                f"{self.step}; the last good checkpoint is {self.ckpt_path if self.ckpt_path.exists() else 'none'}"
            )
        return metrics

    # -- checkpoints ----------------------------------------------------------------------

    def _rng_state(self) -> dict:
        state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                 "engine": self.engine.generator_state() if hasattr(self.engine, "generator_state") else None}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def save_checkpoint(self) -> None:
        """Write the checkpoint (see :mod:`gmc.rundir`); weights that are not finite are never written."""
        weights = self.model.state_dict()
        bad = nonfinite_tensors(weights)
        if bad:
            raise NonFiniteError(
                f"{len(bad)} of {len(weights)} weight tensors are not finite after step {self.step} (first: {bad[0]}); "
                f"no checkpoint written; the last good checkpoint is "
                f"{self.ckpt_path if self.ckpt_path.exists() else 'none'}")
        state = {
            "step": self.step, "model": weights, "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "rng": self._rng_state(), "cursor": self.cursor.state_dict(),
            "source": self.source.state_dict(), "skipped": self.skipped,
            "consecutive_nonfinite": self.consecutive_nonfinite, "run_info": self.run_info,
        }
        self.rundir.write_checkpoint(state)

    def _load_checkpoint(self) -> None:
        state = self.rundir.load_checkpoint(map_location=self.device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng.get("engine") is not None and hasattr(self.engine, "set_generator_state"):
            self.engine.set_generator_state(rng["engine"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.cursor.load_state_dict(state["cursor"])
        self.source.load_state_dict(state["source"])
        self.step = state["step"]
        self.skipped = state["skipped"]
        self.consecutive_nonfinite = state["consecutive_nonfinite"]
        self.run_info = state["run_info"]
        if self.step < self.cfg.steps:
            self.rundir.unfinish()
        self.engine.sync_weights(self.model)
        for name in ("metrics.jsonl", "groups.jsonl"):
            truncate_jsonl(self.out / name, self.step)
        log.info("resumed %s at step %d", self.out, self.step)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> dict:
        cfg = self.cfg
        from gmc.tracking import live_tracker

        tracker = live_tracker(cfg.tracking_uri, cfg.experiment, self.out, self.run_info["run_id"], to_dict(cfg))
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"train {cfg.algorithm}", disable=not self.progress,
                   unit="step")
        try:
            with (self.out / "metrics.jsonl").open("a") as mfile, (self.out / "groups.jsonl").open("a") as gfile:
                while self.step < cfg.steps:
                    metrics = self.train_step()
                    record = {"step": self.step, "time": time.time(), **metrics}
                    mfile.write(json.dumps(record) + "\n")
                    mfile.flush()
                    for g in self._last_batch:
                        gfile.write(json.dumps({
                            "step": self.step, "version": g.version, "staleness": g.staleness,
                            "length_max": g.max_length, "length_mean": float(g.lengths.float().mean()),
                            "reward_mean": float(g.rewards.mean()), "submitted_at": g.submitted_at,
                            "completed_at": g.completed_at}) + "\n")
                    gfile.flush()
                    if tracker:
                        tracker.log(record)
                    bar.update(1)
                    bar.set_postfix(reward=f"{metrics['train/reward_mean']:.3f}",
                                    stale=f"{metrics['async/staleness_mean']:.1f}")
                    self.step += 1
                    if (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or self.step == cfg.steps:
                        self.save_checkpoint()
            with atomic_dir(self.out / "model") as tmp:
                # the final model in its compute dtype (the masters stay in the checkpoint)
                state = {k: v.to(self.compute_dtype) if v.is_floating_point() else v
                         for k, v in self.model.state_dict().items()}
                self.model.save_pretrained(tmp, state_dict=state)
                self.tokenizer.save_pretrained(tmp)
            summary = summarize_metrics(self.out / "metrics.jsonl")
            summary["run_id"] = self.run_info["run_id"]
            self.rundir.finish(summary)
        finally:
            bar.close()
            self.grader.close()
            self.rundir.close()
        if tracker:
            tracker.finish(summary)
        return summary


# ---------------------------------------------------------------------------------------------
# metrics files


def summarize_metrics(path: str | Path, window: int = 20) -> dict:
    rows = read_jsonl(path)
    if not rows:
        return {"steps": 0}

    def mean(key, part):
        vals = [r[key] for r in part if key in r and r[key] is not None and math.isfinite(r[key])]
        return sum(vals) / len(vals) if vals else None

    head, tail = rows[:window], rows[-window:]
    out: dict = {"steps": len(rows)}
    for key in ("rollout/reward_mean", "train/reward_mean"):
        out[f"{key}_first{window}"] = mean(key, head)
        out[f"{key}_last{window}"] = mean(key, tail)
    for key in ("async/staleness_mean", *diagnostic_names(), "time/step_seconds"):
        out[key] = mean(key, rows)
    out["train/skipped_steps"] = rows[-1].get("train/skipped_steps", 0.0)
    return {k: v for k, v in out.items() if v is not None}


def main_train(config: str | None, overrides: list[str], out: str, resume: bool) -> dict:
    from gmc.config import load_train_config

    cfg = load_train_config(config, overrides)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return Trainer(cfg, out, resume=resume).run()
