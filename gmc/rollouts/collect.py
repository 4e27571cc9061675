"""The collector: prompts -> generate -> grade -> behaviour log-probs -> groups (method.md
section 4).

:class:`Collector` turns prompt records and a policy version into :class:`gmc.rollouts.groups.Group` s
and returns what it measured (:class:`RolloutStats`) with them; it keeps no state between
calls, so the trainer runs it in process and a remote rollout worker can run the same object
on the prompts it is given. The run's prompt order is a :class:`PromptCursor` (a seeded
permutation per epoch, resumable), which stays with the trainer. Behaviour log-probs
[choice, ``behaviour_logprobs``]: ``trainer`` recomputes them with the trainer's forward
(:mod:`gmc.policy.logprobs`'s canonical micro-batches, so they equal the training forward's bit for bit
while the weights are unchanged), ``sampler`` takes the engine's own, ``none`` leaves them to
the training forward (on-policy runs).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from gmc.policy.logprobs import Rows, per_group, precision
from gmc.policy.update import Update
from gmc.rollouts.engines import ENGINES, SamplingConfig
from gmc.rollouts.groups import Collected, Group
from gmc.tasks.datasets import Record, format_prompt, load_dataset, load_file
from gmc.tasks.synthetic import SyntheticTask

Behaviour = Literal["none", "sampler", "trainer"]


class PromptCursor:
    """Walks a seeded permutation of the training records, epoch after epoch; resumable."""

    def __init__(self, records: Sequence[Record], seed: int):
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

    def fork(self) -> PromptCursor:
        """A cursor at this one's place that walks on without moving it (the prompts further ahead)."""
        ahead = PromptCursor(self.records, self.seed)
        ahead.load_state_dict(self.state_dict())
        return ahead

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation()


def training_records(
    train_data: str, synthetic: SyntheticTask, seed: int, source: str = "local", root: str | None = None
) -> list[Record]:
    """The records a run trains on: 5,000 synthetic problems, a registered training set or a file."""
    if train_data == "synthetic":
        return synthetic.generate("train", 5000, seed=seed)
    if Path(train_data).suffix in (".jsonl", ".json", ".parquet"):
        return load_file(train_data)
    return load_dataset(train_data, source=source, root=root)


@dataclass(frozen=True)
class RolloutStats:
    """What one collector call measured."""

    samples: int
    tokens: int
    seconds: float
    """Generation, grading and behaviour pass."""
    behaviour_seconds: float
    reward_sum: float
    length_max: int
    truncated: int
    mismatch: float | None
    """Largest |sampler log-prob - trainer log-prob| of a token (None without a trainer pass)."""
    zero_variance: int | None = None
    """Groups whose rewards were all equal, under ``zero_variance_filter`` (None: no filter)."""
    refills: int = 0
    """Generation calls the filter made to refill the batch."""


def merged(stats: Sequence[RolloutStats]) -> RolloutStats:
    """The measurements of several collector calls as one: their sums, the longest response and
    the largest mismatch, and the filter's counts (None where no call filtered)."""
    mismatches = [s.mismatch for s in stats if s.mismatch is not None]
    zero_variance = [s.zero_variance for s in stats if s.zero_variance is not None]
    return RolloutStats(
        samples=sum(s.samples for s in stats),
        tokens=sum(s.tokens for s in stats),
        seconds=sum(s.seconds for s in stats),
        behaviour_seconds=sum(s.behaviour_seconds for s in stats),
        reward_sum=sum(s.reward_sum for s in stats),
        length_max=max(s.length_max for s in stats),
        truncated=sum(s.truncated for s in stats),
        mismatch=max(mismatches) if mismatches else None,
        zero_variance=sum(zero_variance) if zero_variance else None,
        refills=sum(s.refills for s in stats),
    )


def rollout_metrics(stats: Sequence[RolloutStats]) -> dict[str, float]:
    """The ``rollout/`` and generation ``time/`` metrics of one step's collector calls (none: {})."""
    if not stats:
        return {}
    m = merged(stats)
    out = {
        "rollout/reward_mean": m.reward_sum / m.samples,
        "rollout/response_length_mean": m.tokens / m.samples,
        "rollout/response_length_max": float(m.length_max),
        "rollout/frac_truncated": m.truncated / m.samples,
        "rollout/samples": float(m.samples),
        "time/rollout_seconds": m.seconds,
        "time/rollout_tokens_per_second": m.tokens / max(m.seconds, 1e-9),
        "time/behaviour_seconds": m.behaviour_seconds,
        "rollout/generate_calls": float(len(stats) + m.refills),
    }
    if m.mismatch is not None:
        out["rollout/logp_mismatch_max"] = m.mismatch
    if m.zero_variance is not None:
        out["rollout/groups_zero_variance"] = float(m.zero_variance)
        out["rollout/refill_calls"] = float(m.refills)
    return out


class Collector:
    """Generates, grades and scores groups of ``group_size`` responses per prompt.

    ``logprobs(rows)`` is the trainer's no-grad log-prob pass (:meth:`gmc.policy.update.Update.logprobs`
    on the policy), used when ``behaviour`` is ``trainer``; ``generation`` is the context the
    engine generates in (the trainer's autocast, for an engine that samples with the trainer's
    own module)."""

    def __init__(
        self,
        engine,
        tokenizer,
        grader,
        *,
        group_size: int,
        sampling: SamplingConfig,
        behaviour: Behaviour,
        logprobs: Callable[[Rows], torch.Tensor] | None = None,
        thinking: bool = False,
        generation: Callable[[], contextlib.AbstractContextManager] | None = None,
    ):
        if behaviour == "trainer" and logprobs is None:
            raise ValueError("behaviour log-probs from the trainer need its logprobs pass")
        self.engine, self.tokenizer, self.grader = engine, tokenizer, grader
        self.group_size, self.sampling, self.behaviour = group_size, sampling, behaviour
        self.logprobs, self.thinking = logprobs, thinking
        self.generation = generation or contextlib.nullcontext
        self.pad_id = tokenizer.pad_token_id

    def close(self) -> None:
        """End the grading pool."""
        self.grader.close()

    def collect(self, records: Sequence[tuple[int, Record]], version: int) -> Collected:
        """One group per ``(prompt index, record)``, generated with the engine's current weights
        and labelled ``version``."""
        t0 = time.perf_counter()
        G = self.group_size
        prompts = [format_prompt(self.tokenizer, r.problem, self.thinking) for _, r in records]
        with self.generation():
            sample_groups = self.engine.generate(prompts, G, self.sampling)
        flat = [s for g in sample_groups for s in g]
        grades = self.grader.grade_batch([s.text for s in flat], [r.answer for _, r in records for _ in range(G)])
        groups = [
            self._group(index, sample_groups[k], grades[k * G : (k + 1) * G], version)
            for k, (index, _) in enumerate(records)
        ]
        t1, mismatch = time.perf_counter(), None
        if self.behaviour == "trainer":
            behaviour = self.logprobs(Rows.from_groups(groups)).cpu()
            for g, lp in zip(groups, per_group(behaviour, groups)):
                g.behaviour_logp = lp
            mismatch = max(
                float((torch.tensor(s.logprobs) - behaviour[i, : s.length]).abs().max()) if s.length else 0.0
                for i, s in enumerate(flat)
            )
        t2 = time.perf_counter()
        lengths = [s.length for s in flat]
        stats = RolloutStats(
            samples=len(flat),
            tokens=sum(lengths),
            seconds=t2 - t0,
            behaviour_seconds=t2 - t1,
            reward_sum=sum(g.reward for g in grades),
            length_max=max(lengths),
            truncated=sum(s.finish_reason == "length" for s in flat),
            mismatch=mismatch,
        )
        return Collected(groups, stats)

    def _group(self, index: int, samples, grades, version: int) -> Group:
        G = len(samples)
        lengths = [s.length for s in samples]
        T = max(1, max(lengths))
        resp = torch.full((G, T), self.pad_id, dtype=torch.long)
        sampler = torch.zeros(G, T)
        versions = torch.full((G, T), version, dtype=torch.long) if samples[0].versions is not None else None
        for j, s in enumerate(samples):
            resp[j, : s.length] = torch.tensor(s.token_ids, dtype=torch.long)
            sampler[j, : s.length] = torch.tensor(s.logprobs)
            if versions is not None and s.length:
                versions[j, : s.length] = torch.tensor(s.versions)
        return Group(
            prompt_index=index,
            prompt_ids=torch.tensor(samples[0].prompt_ids, dtype=torch.long),
            response_ids=resp,
            response_mask=torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1),
            rewards=torch.tensor([g.reward for g in grades], dtype=torch.float32),
            # the sampler's own unless the trainer recomputes them; none when trained on-policy
            behaviour_logp=sampler if self.behaviour == "sampler" else None,
            sampler_logp=sampler,
            version=version,
            token_versions=versions,
        )


def rollout_side(cfg, update: Update, tokenizer, behaviour: Behaviour, grader_workers: int | None = None) -> Collector:
    """The rollout side of a run of :class:`gmc.run.config.TrainConfig` ``cfg`` on ``update.model``, in
    one place for the trainer and a Ray rollout worker: the engine (``cfg.engine`` with its
    settings, seeded by the run), a grading pool of ``grader_workers`` processes and ``update``'s
    numerics for the behaviour pass (the trainer's own, or a worker's copy), held by the collector
    (its ``engine`` and ``grader``; :meth:`Collector.close` ends the pool). An engine that samples
    with the trainer's module generates under autocast to ``sampling.dtype`` (unset: the trainer's
    compute dtype)."""
    from gmc.rollouts.engines import make_engine
    from gmc.tasks.grading import Grader

    engine = make_engine(
        cfg.engine,
        update.model,
        tokenizer,
        model_path=cfg.model,
        seed=cfg.seed,
        settings=getattr(cfg, cfg.engine, None),
        dtype=cfg.model_dtype,
        fp32_head=cfg.fp32_lm_head,
    )
    from gmc.policy.model import DTYPES

    entry = ENGINES[cfg.engine]
    sampler_dtype = DTYPES[cfg.sampling.dtype] if cfg.sampling.dtype else update.compute_dtype
    return Collector(
        engine,
        tokenizer,
        Grader(workers=grader_workers, start_method=entry.grading_start),
        group_size=cfg.group_size,
        sampling=cfg.sampling,
        behaviour=behaviour,
        logprobs=lambda rows: update.logprobs(update.model, rows),
        thinking=cfg.thinking,
        generation=(lambda: precision(update.model, sampler_dtype)) if entry.shares_model else None,
    )


class RunRollouts:
    """A run's :class:`gmc.rollouts.groups.Rollouts`: its prompt cursor and its collector. With
    ``refill_calls`` (``zero_variance_filter``), a group whose rewards are all equal (no advantage:
    nothing to learn from it) is dropped and replaced by a group of the run's next prompt, in at
    most ``refill_calls`` more collector calls (DAPO's dynamic sampling, SkyRL's
    ``zero_variance_filter``); what is still missing then is made up with dropped groups, so a
    call always returns one group per prompt asked."""

    def __init__(self, cursor: PromptCursor, collector: Collector | None, refill_calls: int | None = None):
        self.cursor, self.collector, self.refill_calls = cursor, collector, refill_calls

    def take(self, n: int) -> list[int]:
        return self.cursor.take(n)

    def _collect(self, prompts: list[int], version: int) -> Collected:
        return self.collector.collect([(i, self.cursor.records[i]) for i in prompts], version)

    def collect(self, prompts: list[int], version: int) -> Collected:
        out = self._collect(prompts, version)
        if self.refill_calls is None:
            return out
        kept, dropped, stats, calls = [], [], [out.stats], 0
        for g in out.groups:
            (dropped if bool((g.rewards == g.rewards[0]).all()) else kept).append(g)
        while len(kept) < len(prompts) and calls < self.refill_calls:
            more = self._collect(self.take(len(prompts) - len(kept)), version)
            stats.append(more.stats)
            calls += 1
            for g in more.groups:
                (dropped if bool((g.rewards == g.rewards[0]).all()) else kept).append(g)
        groups = kept + dropped[: len(prompts) - len(kept)]
        return Collected(groups, replace(merged(stats), zero_variance=len(dropped), refills=calls))
