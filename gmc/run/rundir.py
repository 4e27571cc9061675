"""The run directory: one owner at a time, the config it belongs to, its step logs, checkpoints
that prove themselves, cleanup of interrupted writes and the finished marker.

A run directory is owned by one process at a time: :meth:`RunDir.open` takes an exclusive
``flock`` on ``<out>/.lock``, which the kernel releases on any exit (``SIGKILL`` included), so
the lock of a dead owner is never stale; the file names its owner (pid, host, start time) for
the error a second process gets, and a non-empty file found by a new owner means the last one
died. A run is resumed only with the resolved config it was started with (``config.yaml``);
another config is refused, naming the changed keys, never mixed into the old run's files.
Checkpoints are written to a temporary file, fsynced, and renamed over ``checkpoint.pt`` after
the previous one has become ``checkpoint.prev.pt``; the folder is fsynced after the renames.
On load a checkpoint must pass a full zip test (the CRC-32 of every record, which
``torch.load`` does not check) and carry the config's fingerprint; a latest checkpoint that
fails falls back to the previous one, with a warning, and is kept aside as
``checkpoint.rejected.pt``. A checkpoint is read onto the CPU, whichever device wrote it, so
a run resumes on any device. Temporary files of interrupted writes are removed when the next
owner starts. ``summary.json`` is written last and marks a finished run (whose checkpoints
are then pruned as ``keep_checkpoints`` says); starting afresh removes it first.

Every file of a run is written here. Per step (:meth:`RunDir.logs`): a line of
``metrics.jsonl``, a line per consumed group in ``groups.jsonl`` (:func:`group_record`) and in
``staleness_trace.jsonl`` (what the ``trace`` delay mode replays), each flushed as the step
ends, and with ``rollout_correction.record_logprobs`` a file of its tokens' log-probs in
``logprobs/``; a resumed run first cuts these back to its checkpoint's step
(:meth:`RunDir.truncate_logs`). A history writes each batch of its fixed delays' queues to
``queues/d~<d>/`` as it generates it (:meth:`RunDir.write_queue_batch`), so that neither it
nor a run that starts from it holds more of them in memory than it needs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import time
import zipfile
from pathlib import Path
from typing import Any

import yaml

from gmc.io import atomic_path, flatten, truncate_jsonl, write_json
from gmc.rollouts.sources import trace_line

log = logging.getLogger(__name__)

LOCK = ".lock"
CONFIG = "config.yaml"
CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
REJECTED = "checkpoint.rejected.pt"
SUMMARY = "summary.json"
INFO = "run.json"
MODEL = "model"
METRICS = "metrics.jsonl"
"""One line per optimizer step."""
GROUPS = "groups.jsonl"
"""One line per consumed group: its staleness, lengths, rewards."""
TRACE = "staleness_trace.jsonl"
"""The run's consumption order, replayable by the trace delay mode."""
LOGS = (METRICS, GROUPS, TRACE)
LOGPROBS = "logprobs"
"""Per step, every trained token's three log-probs (``rollout_correction.record_logprobs``)."""
HISTORY = "history"
"""The run directory of the history a run with ``warmup: history`` made for itself (none shared)."""
QUEUES = "queues"
"""A history's queues, one folder per fixed delay ``d``, a file per batch (:meth:`RunDir.queue_batch`)."""
SHARED = "shared.json"
"""What a sweep's point holds instead of a run when its run is provably another point's: which
run (its point), and why."""
RUN_FILES = (CONFIG, INFO, *LOGS, LOGPROBS, QUEUES, CHECKPOINT, PREVIOUS, REJECTED, SUMMARY, MODEL)
"""Everything a run writes into its directory (besides the lock)."""


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked; the message says why and what to do."""


class RunDirBusy(RunDirError):
    """Another live process owns the run directory."""


class ConfigMismatch(RunDirError):
    """A resume was asked with a config other than the run's."""


class CheckpointError(RunDirError):
    """No checkpoint of the run can be read and verified; the message names the files."""


def config_fingerprint(config: dict[str, Any]) -> str:
    """SHA-256 of the resolved config (canonical JSON); stored in every checkpoint."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def nonfinite_tensors(state_dict: dict) -> list[str]:
    """Names of the floating-point tensors of ``state_dict`` holding a NaN or an infinity."""
    import torch

    return [
        name
        for name, t in state_dict.items()
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunDir:
    """One run's folder. :meth:`open` (or ``with``) before use, :meth:`close` after."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.checkpoint = self.path / CHECKPOINT
        self.previous = self.path / PREVIOUS
        self.fingerprint: str | None = None
        self.created = False  # whether open() made the folder (abandon() may then remove it)
        self._lock = None

    # -- ownership --------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take the directory's lock, or raise :class:`RunDirBusy` naming the live owner."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"{self.path}: a file, not a run directory (--out names the folder of a run)")
        self.path.mkdir(parents=True, exist_ok=True)
        fh = (self.path / LOCK).open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            fh.seek(0)
            holder = _parse_owner(fh.read())
            fh.close()
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunDirBusy(
                f"{self.path}: in use by {_describe(holder)}; wait for it to end or choose another --out"
            ) from None
        fh.seek(0)
        last = _parse_owner(fh.read())
        if last:
            log.warning(
                "%s: the last owner (%s) ended without closing the run; taking over", self.path, _describe(last)
            )
        fh.seek(0)
        fh.truncate()
        fh.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            )
        )
        fh.flush()
        self._lock = fh

    def close(self) -> None:
        """Release the lock (an empty lock file: the owner ended cleanly)."""
        if self._lock is not None:
            self._lock.seek(0)
            self._lock.truncate()
            self._lock.flush()
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def abandon(self) -> None:
        """Release the lock after a start that failed before training: a folder that :meth:`open`
        made and that holds nothing of a run but its config and record is removed, so that no
        folder is left that looks like a run."""
        self.close()
        if self.created and self.path.is_dir() and {p.name for p in self.path.iterdir()} <= {LOCK, CONFIG, INFO}:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- opening a run ------------------------------------------------------------------------

    def open(self, config: dict[str, Any], resume: bool) -> bool:
        """Own the directory for a run of ``config``; True when a checkpoint is to be resumed.

        Without ``resume`` a finished run or a checkpoint is an error (FileExistsError). With it,
        a directory holding another config's run raises :class:`ConfigMismatch`."""
        self.created = not self.path.exists()
        self.acquire()
        try:
            self.fingerprint = config_fingerprint(config)
            self.clean_interrupted_writes()
            if not resume:
                if self.finished:
                    raise FileExistsError(f"{self.path}: a finished run is already there; choose another --out")
                if self.has_checkpoint():
                    raise FileExistsError(
                        f"{self.path}: holds a checkpoint; pass --resume to continue it, or choose another --out"
                    )
                return False
            self._check_config(config)
            return self.has_checkpoint()
        except BaseException:
            self.abandon()
            raise

    def _check_config(self, config: dict[str, Any]) -> None:
        present = [name for name in RUN_FILES if (self.path / name).exists()]
        if not present:
            return
        path = self.path / CONFIG
        try:
            saved = yaml.safe_load(path.read_text()) if path.exists() else None
        except (OSError, yaml.YAMLError):
            saved = None
        current = yaml.safe_load(yaml.safe_dump(config, sort_keys=False))
        if saved == current:
            return
        if saved is None:
            raise ConfigMismatch(
                f"{self.path}: holds run files ({', '.join(present)}) but no readable {CONFIG}, "
                "so its run cannot be told apart from another; move it away or choose another --out"
            )
        old, new = flatten(saved if isinstance(saved, dict) else {}), flatten(current)
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ConfigMismatch(
            f"{self.path}: holds a run made with another config (changed: {', '.join(changed)}); resuming would "
            f"mix two runs. To continue the run as it was started: gmc train --resume --out {self.path} (its "
            f"{CONFIG} is the config); to start another, choose another --out"
        )

    def clean_interrupted_writes(self) -> list[Path]:
        """Remove what interrupted atomic writes left behind (``.<name>.*.tmp``, ``.model.old``)."""
        leftovers = [
            p
            for folder in (self.path, self.path / LOGPROBS, *(self.path / QUEUES).glob("d~*"))
            if folder.is_dir()
            for p in folder.iterdir()
            if p.name.startswith(".") and (p.name.endswith(".tmp") or p.name == f".{MODEL}.old")
        ]
        for p in leftovers:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if leftovers:
            log.info(
                "%s: removed %d leftover(s) of interrupted writes: %s",
                self.path,
                len(leftovers),
                ", ".join(sorted(p.name for p in leftovers)),
            )
        return leftovers

    def unfinish(self) -> None:
        """Remove the finished marker, then the final model: the run is continuing."""
        (self.path / SUMMARY).unlink(missing_ok=True)
        shutil.rmtree(self.path / MODEL, ignore_errors=True)

    def reset(self) -> None:
        """Remove a previous attempt's outputs, the finished marker first."""
        self.unfinish()
        for name in (CHECKPOINT, PREVIOUS, REJECTED, *LOGS):
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.path / LOGPROBS, ignore_errors=True)
        shutil.rmtree(self.path / QUEUES, ignore_errors=True)

    # -- the step logs -------------------------------------------------------------------------

    @contextlib.contextmanager
    def logs(self, updates_per_batch: int = 1):
        """The run's step logs opened for appending, as a :class:`StepLogs` (of a run making
        ``updates_per_batch`` updates per step)."""
        with (
            (self.path / METRICS).open("a") as metrics,
            (self.path / GROUPS).open("a") as groups,
            (self.path / TRACE).open("a") as trace,
        ):
            yield StepLogs(metrics, groups, trace, updates_per_batch)

    def truncate_logs(self, step: int) -> None:
        """Cut the step logs back to the steps before ``step`` (a resume from its checkpoint)."""
        for name in (METRICS, GROUPS):
            truncate_jsonl(self.path / name, step)
        truncate_jsonl(self.path / TRACE, step, key="consumed_version")
        for path in (self.path / LOGPROBS).glob("step_*.pt"):
            if int(path.stem.removeprefix("step_")) >= step:
                path.unlink()

    def write_logprobs(self, step: int, tokens: dict) -> None:
        """Step ``step``'s token log-probs (:meth:`gmc.policy.update.TokenLogprobs.packed`), atomically."""
        import torch

        folder = self.path / LOGPROBS
        folder.mkdir(exist_ok=True)
        with atomic_path(folder / f"step_{step:06d}.pt") as tmp:
            torch.save({"step": step, **tokens}, tmp)

    def queue_batch(self, d: int, j: int) -> Path:
        """The file of batch ``j`` of a history's queue for the fixed delay ``d`` (a list of group states)."""
        return self.path / QUEUES / f"d~{d}" / f"batch_{j:06d}.pt"

    def write_queue_batch(self, d: int, j: int, groups: list[dict]) -> None:
        """Batch ``j`` of the queue of ``d``, atomically (a resumed history writes it again, the same)."""
        import torch

        with atomic_path(self.queue_batch(d, j)) as tmp:
            torch.save(groups, tmp)

    def queues(self, delays) -> list[int]:
        """The fixed delays of ``delays`` whose queues this history holds whole (``d`` batches each)."""
        return [d for d in delays if all(self.queue_batch(d, j).exists() for j in range(d))]

    # -- checkpoints --------------------------------------------------------------------------

    def has_checkpoint(self) -> bool:
        return self.checkpoint.exists() or self.previous.exists()

    def write_checkpoint(self, state: dict) -> None:
        """Write ``state`` durably as the latest checkpoint; the latest so far becomes the previous."""
        import torch

        state = {**state, "config_sha256": self.fingerprint}
        with atomic_path(self.checkpoint) as tmp:
            torch.save(state, tmp)
            fsync_path(tmp)
            if self.checkpoint.exists():
                os.replace(self.checkpoint, self.previous)
        fsync_path(self.path)

    def load_checkpoint(self) -> dict:
        """The newest checkpoint that verifies, its tensors on the CPU whichever device wrote
        them (the trainer puts each where it belongs); raises :class:`CheckpointError` naming
        the files when none does."""
        errors = []
        for path in (self.checkpoint, self.previous):
            if not path.exists():
                continue
            try:
                state = self.read_checkpoint(path)
            except CheckpointError as e:
                log.warning("%s", e)
                errors.append(str(e))
                continue
            if path == self.previous:
                if self.checkpoint.exists():  # keep it out of the next rotation, for inspection
                    os.replace(self.checkpoint, self.path / REJECTED)
                log.warning(
                    "%s: resuming from the previous checkpoint %s (step %s)", self.path, path.name, state.get("step")
                )
            return state
        raise CheckpointError(
            f"no usable checkpoint in {self.path}: {'; '.join(errors)}. Move these files away "
            "to start the run afresh, or restore them from a copy"
        )

    def read_checkpoint(self, path: Path) -> dict:
        """The checkpoint at ``path`` once it verifies (a full zip test, the config's fingerprint),
        its tensors on the CPU; a :class:`CheckpointError` naming the file otherwise. Reads only:
        a shared history is read so by every run that starts from it."""
        import torch

        try:
            with zipfile.ZipFile(path) as zf:
                bad = zf.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            raise CheckpointError(f"{path}: not a complete checkpoint ({e})") from None
        if bad is not None:
            raise CheckpointError(f"{path}: corrupted (checksum mismatch in record {bad})")
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a verified zip whose pickle still fails: name the file
            raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
        if not isinstance(state, dict) or "step" not in state:
            raise CheckpointError(f"{path}: not a training checkpoint")
        if state.get("config_sha256", self.fingerprint) != self.fingerprint:
            raise CheckpointError(f"{path}: made with another config (fingerprint {state['config_sha256'][:12]})")
        return state

    # -- the finished marker ------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return (self.path / SUMMARY).exists()

    def finish(self, summary: dict, keep_checkpoints: str = "all") -> None:
        """Mark the run finished, then prune its checkpoints: ``last`` keeps the latest, ``none``
        keeps no checkpoint, ``all`` keeps every file (the previous one, and a rejected one for
        inspection)."""
        write_json(self.path / SUMMARY, summary)
        prune = {"all": [], "last": [PREVIOUS, REJECTED], "none": [CHECKPOINT, PREVIOUS, REJECTED]}
        for name in prune[keep_checkpoints]:
            (self.path / name).unlink(missing_ok=True)


class StepLogs:
    """The step logs of a run being trained (:meth:`RunDir.logs`)."""

    def __init__(self, metrics, groups, trace, updates_per_batch: int = 1):
        self.files = (metrics, groups, trace)
        self.updates_per_batch = updates_per_batch

    def write(self, record: dict, groups: list[dict]) -> None:
        """One step: its metrics line and its consumed groups (:func:`group_record` lines, versions
        in updates), each file flushed. The trace counts steps, as a replay consumes it batch by
        batch (:func:`~gmc.rollouts.sources.trace_line`)."""
        metrics, group_file, trace = self.files
        metrics.write(json.dumps(record) + "\n")
        group_file.write("".join(json.dumps(g) + "\n" for g in groups))
        trace.write("".join(json.dumps(trace_line(g, self.updates_per_batch)) + "\n" for g in groups))
        for f in self.files:
            f.flush()


def group_record(step: int, g) -> dict:
    """A consumed :class:`~gmc.rollouts.groups.Group`'s line in ``groups.jsonl``: the step, its
    prompt, the worker that made it (null when simulated), the version that generated it, the
    version (optimizer update) that consumed it and their difference, whether an update trained it
    before (``reused``), its length and reward, the latency model's virtual times
    and, under real asynchrony, its wall clock times and ``versions``, the sorted versions its
    tokens came from (more than one under partial rollouts; ``version`` is the oldest)."""
    record = {
        "step": step,
        "prompt_index": g.prompt_index,
        "worker": g.worker,
        "version": g.version,
        "consumed_version": g.consumed_version,
        "staleness": g.staleness,
        "reused": g.trained,
        "length_max": g.max_length,
        "length_mean": float(g.lengths.float().mean()),
        "reward_mean": float(g.rewards.mean()),
        "submitted_at": g.submitted_at,
        "completed_at": g.completed_at,
    }
    if g.finish_wall is not None:
        record.update(
            submit_wall=g.submit_wall,
            finish_wall=g.finish_wall,
            consume_wall=g.consume_wall,
            generation_seconds=g.generation_seconds,
            versions=g.versions,
        )
    return record


def _parse_owner(text: str) -> dict:
    try:
        owner = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        owner = {}
    return owner if isinstance(owner, dict) else {}


def _describe(owner: dict) -> str:
    if not owner:
        return "another process"
    return f"pid {owner.get('pid')} on {owner.get('host')} (since {owner.get('since')})"
