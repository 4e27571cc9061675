"""Rewards: answer extraction and equivalence grading (method.md section 5).

A completion's reward is 1.0 when its extracted final answer is equivalent to the gold answer
and 0.0 otherwise. Equivalence is decided by math-verify (``verify(gold, answer)``, gold
first), after a fast path for answers that are textually or numerically identical. math-verify
bounds its own work with ``signal.alarm``, which works only in a process's main thread, so
grading runs in a pool of worker processes: each item is bounded by math-verify's alarm inside
its worker and, as a backstop for work an alarm cannot interrupt (a huge integer power in C),
by the pool, which kills and replaces a worker that overruns. Closing the pool is bounded too
(:meth:`Grader.close`): past a grace period its workers are killed by pid.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import multiprocessing as mp
import multiprocessing.util
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gmc.stop import STOP, StopRequests
from gmc.tasks.answers import canonical_int, extract_answer, normalize_gold

log = logging.getLogger(__name__)

Reason = Literal["ok", "no_answer", "parse_error", "timeout", "too_long", "wrong"]

MAX_ANSWER_CHARS = 1_000
"""Longer answers (the longest gold answer of the benchmarks has about 200 characters) are
decided by the fast path only: identical or numerically equal, else ``too_long``."""


@dataclass(frozen=True)
class Grade:
    """The verdict on one completion."""

    correct: bool
    reward: float
    answer: str | None
    """What :func:`extract_answer` read from the completion (None when nothing was found)."""
    reason: Reason
    """``ok`` (correct), ``wrong``, ``no_answer`` (nothing to extract), ``parse_error``
    (an answer or the gold could not be parsed), ``timeout``, or ``too_long`` (an answer
    longer than :data:`MAX_ANSWER_CHARS` that the fast path could not decide)."""


# ---------------------------------------------------------------------------------------------
# fast path

_LATEX_NOISE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\s+|\\displaystyle|\\text\{\s*\}")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_INTEGER = re.compile(r"^[+-]?\d+$")


def _canonical(text: str) -> str:
    t = _LATEX_NOISE.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    t = t.replace("{,}", "")
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+", t):
        t = t.replace(",", "")
    return t


def fast_verdict(gold: str, answer: str) -> bool | None:
    """True/False when the answer is decided without sympy (identical after LaTeX-noise removal,
    or both plain numbers: integers compared exactly as text, others as floats); None when
    math-verify must decide."""
    g, a = _canonical(normalize_gold(gold)), _canonical(normalize_gold(answer))
    if g == a:
        return True
    if _NUMBER.match(g) and _NUMBER.match(a):
        if _INTEGER.match(g) and _INTEGER.match(a):
            return canonical_int(g) == canonical_int(a)  # exact, at any length
        x, y = float(g), float(a)
        if not (math.isfinite(x) and math.isfinite(y)):
            return None
        return abs(x - y) <= 1e-9 * max(1.0, abs(x))
    return None


# ---------------------------------------------------------------------------------------------
# math-verify in a worker process


def _verify_worker(args: tuple[str, str, int]) -> tuple[bool, Reason]:
    """Runs in a pool worker's main thread, where math-verify's alarm timeout works."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    gold, answer, timeout = args
    try:
        gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
        if not gold_parsed:
            gold_parsed = parse(gold, parsing_timeout=timeout)
        answer_parsed = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
        if not answer_parsed:
            answer_parsed = parse(answer, parsing_timeout=timeout)
        if not gold_parsed or not answer_parsed:
            return False, "parse_error"
        ok = verify(gold_parsed, answer_parsed, timeout_seconds=timeout, raise_on_error=True)
        return bool(ok), "ok" if ok else "wrong"
    except TimeoutException:
        return False, "timeout"
    except Exception:
        return False, "parse_error"


StartMethod = Literal["fork", "forkserver"]
"""How a grading pool starts its workers. ``fork``: from the process itself, in milliseconds,
needing no importable ``__main__``: right for a process whose only threads are torch's. ``forkserver``:
from a server process started once (fork and exec, so it holds no thread or lock of the caller),
with math-verify preloaded: for a process that runs threads of its own, such as vLLM's engine in
process, where a fork could copy a lock another thread holds (:attr:`gmc.rollouts.engines.Engine.own_threads`)."""


def _kill_on_terminate(popen):
    popen.terminate = popen.kill
    return popen


class _ForkWorker(mp.get_context("fork").Process):
    """A grading process: it ignores SIGTERM, so whatever terminates it sends SIGKILL: the pool's
    terminate() and also multiprocessing's exit handler, which terminates the daemon children
    left at interpreter exit (through their ``Popen``) and then waits for each."""

    @staticmethod
    def _Popen(process_obj):
        return _kill_on_terminate(mp.get_context("fork").Process._Popen(process_obj))


class _ForkserverWorker(mp.get_context("forkserver").Process):
    """:class:`_ForkWorker`, forked by the forkserver."""

    @staticmethod
    def _Popen(process_obj):
        return _kill_on_terminate(mp.get_context("forkserver").Process._Popen(process_obj))


class _ForkContext(type(mp.get_context("fork"))):
    Process = _ForkWorker


class _ForkserverContext(type(mp.get_context("forkserver"))):
    Process = _ForkserverWorker


_CONTEXTS = {"fork": _ForkContext, "forkserver": _ForkserverContext}


def _warm_worker() -> None:
    # a job's stop signals (SLURM sends them to every process of the job; gmc.stop turns them into
    # a checkpoint at the step boundary) are ignored by grading workers, so that the step in
    # progress can finish its grading; they are blocked while the pool forks, so that no worker
    # ever runs the run's handlers, and one that came since the fork is pending until here
    for s in StopRequests.SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, StopRequests.SIGNALS)
    import math_verify  # noqa: F401  (import once per worker, not per item)

    # answers reach a worker at most MAX_ANSWER_CHARS long, and the pool bounds each item's time:
    # Python's guard against slow int <-> str conversions only turned long integers into errors
    sys.set_int_max_str_digits(0)


CLOSE_GRACE = 5.0
"""Seconds :meth:`Grader.close` gives the pool's own ``terminate()`` (milliseconds when the pool
is sound) before it kills the workers itself."""


def _terminate(pool) -> None:
    try:
        pool.terminate()
        pool.join()
    except Exception:
        log.exception("grading pool: terminate failed")


def _free(lock) -> None:
    """Leave a pool's inter-process lock free; a worker killed while holding it never releases it
    (a lock of :mod:`multiprocessing` has no owner: any process may release it)."""
    if lock is not None:
        lock.acquire(False)
        lock.release()


def _end_pool(pool, grace: float) -> None:
    """End ``pool`` within about ``2 * grace`` seconds, whatever state it is in.

    First the pool's own terminate, in a thread of its own, for ``grace`` seconds. That one
    waits without a timeout on the pool's helper threads and on the task queue's lock, which an
    idle worker holds while it waits for a task; it never returns when a helper thread is gone
    (nothing then tells the workers to leave) or a worker is stopped. Then every worker is
    killed by pid (SIGKILL; workers ignore SIGTERM) and reaped for up to ``grace`` seconds, the
    locks the dead may hold are freed and the task handler gets its end sentinel, so the
    terminate thread can finish; it is waited for up to what is left of the second ``grace``
    and otherwise left behind (a daemon thread: it keeps no process alive)."""
    try:
        ender = threading.Thread(target=_terminate, args=(pool,), name="gmc-grader-close", daemon=True)
        ender.start()
    except RuntimeError:  # at interpreter shutdown (Python 3.12+) no thread starts: kill only
        pool._terminate.cancel()  # and at exit multiprocessing must not run it either
        ender = None
    else:
        ender.join(grace)
        if not ender.is_alive():
            return
        log.warning("grading pool: terminate() did not end within %.1f s; killing its workers", grace)
    deadline = time.monotonic() + grace
    workers = list(pool._pool)
    for w in workers:
        if w.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGKILL)
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    alive = [w.pid for w in workers if w.exitcode is None]
    if alive:
        log.error("grading pool: workers %s survived SIGKILL for %.1f s", alive, grace)
        return
    if ender is not None:
        _free(pool._inqueue._rlock)  # the task queue's, held by the worker that waited for a task
        _free(pool._outqueue._wlock)  # the result queue's, held by a worker killed mid-send
        pool._taskqueue.put(None)  # what the task handler waits for from the worker handler
        ender.join(max(0.0, deadline - time.monotonic()))
        if ender.is_alive():
            log.warning("grading pool: its threads did not end; the workers are gone")


class Grader:
    """A pool of grading processes. Use :meth:`grade_batch`; :meth:`close` when done."""

    def __init__(
        self,
        workers: int | None = None,
        timeout: float = 5.0,
        close_grace: float = CLOSE_GRACE,
        start_method: StartMethod = "fork",
    ):
        if start_method not in _CONTEXTS:
            raise ValueError(f"start_method must be one of {list(_CONTEXTS)}, got {start_method!r}")
        self.workers = workers or max(1, min(os.cpu_count() or 1, 8))
        self.timeout = timeout
        self.close_grace = close_grace
        self.start_method = start_method
        self._pool = None
        self._end = None

    def _ensure_pool(self):
        if self._pool is None:
            # the pool's threads keep the mask, so the workers they start later are forked blocked
            # too; a forkserver started here keeps it through its exec, and so do its children
            with STOP.blocked():
                context = _CONTEXTS[self.start_method]()
                if self.start_method == "forkserver":
                    context.set_forkserver_preload(["math_verify"])  # effective until the server runs
                self._pool = context.Pool(self.workers, initializer=_warm_worker)
            # at interpreter exit (or when the grader is dropped unclosed) the bounded end runs
            # before the pool's own terminate (exit priority 15), which could wait forever
            self._end = mp.util.Finalize(self, _end_pool, args=(self._pool, self.close_grace), exitpriority=20)
        return self._pool

    def close(self) -> None:
        """End the pool and its workers, within about ``2 * close_grace`` seconds whatever its
        state (see :func:`_end_pool`); the next :meth:`grade_batch` starts a new one."""
        if self._pool is not None:
            end, self._pool, self._end = self._end, None, None
            end()  # _end_pool(pool, close_grace), once

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def grade_batch(
        self, completions: Sequence[str], golds: Sequence[str], timeout: float | None = None
    ) -> list[Grade]:
        if len(completions) != len(golds):
            raise ValueError(f"grade_batch: {len(completions)} completions but {len(golds)} gold answers")
        timeout = self.timeout if timeout is None else timeout
        grades: list[Grade | None] = [None] * len(completions)
        answers = [extract_answer(c) for c in completions]
        pending: list[int] = []
        for i, (a, g) in enumerate(zip(answers, golds)):
            if a is None:
                grades[i] = Grade(False, 0.0, None, "no_answer")
                continue
            verdict = fast_verdict(str(g), a)
            if verdict is not None:
                grades[i] = Grade(verdict, float(verdict), a, "ok" if verdict else "wrong")
            elif len(a) > MAX_ANSWER_CHARS or len(str(g)) > MAX_ANSWER_CHARS:
                grades[i] = Grade(False, 0.0, a, "too_long")
            else:
                pending.append(i)
        alarm = max(1, int(round(timeout)))
        while pending:
            pool = self._ensure_pool()
            jobs = [(normalize_gold(golds[i]), answers[i], alarm) for i in pending]
            results = pool.imap(_verify_worker, jobs)  # chunksize 1: next() takes a timeout
            done = 0
            try:
                for i in pending:
                    correct, reason = results.next(timeout=2 * timeout + 1.0)
                    grades[i] = Grade(correct, float(correct), answers[i], reason)
                    done += 1
                pending = []
            except mp.TimeoutError:
                # the pool's backstop: a worker is stuck where no alarm reaches; replace the pool
                stuck = pending[done]
                grades[stuck] = Grade(False, 0.0, answers[stuck], "timeout")
                self.close()
                pending = pending[done + 1 :]
        return grades  # type: ignore[return-value]


_DEFAULT: Grader | None = None


def default_grader() -> Grader:
    """A process-wide grader, created on first use and closed at exit."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Grader()
        atexit.register(_DEFAULT.close)
    return _DEFAULT


def grade_batch(completions: Sequence[str], golds: Sequence[str], timeout: float = 5.0) -> list[Grade]:
    """Grade many completions against their gold answers in the process pool."""
    return default_grader().grade_batch(completions, golds, timeout=timeout)


def grade(completion: str, gold: str, timeout: float = 5.0) -> Grade:
    """Grade one completion (see :func:`grade_batch`)."""
    return grade_batch([completion], [gold], timeout=timeout)[0]


def grade_oracle(
    benchmarks: Sequence[str] | None = None, root=None, timeout: float = 5.0, grader: Grader | None = None
) -> dict[str, dict]:
    """Grade each benchmark's own reference solution against its gold answer.

    Returns, per benchmark, the agreement (fraction graded correct), counts and the reasons of
    the misses. Only benchmarks whose data carries a solution are eligible.
    """
    from collections import Counter

    from gmc.tasks.datasets import REFERENCE_SOLUTION_FIELDS, DataError, load_dataset

    names = list(benchmarks) if benchmarks else list(REFERENCE_SOLUTION_FIELDS)
    for name in names:
        if name not in REFERENCE_SOLUTION_FIELDS:
            raise DataError(
                f"benchmark {name!r} has no reference solutions; choose from {sorted(REFERENCE_SOLUTION_FIELDS)}"
            )
    own = grader is None
    grader = grader or Grader(timeout=timeout)
    try:
        table = {}
        for name in names:
            records = load_dataset(name, root=root)
            field = REFERENCE_SOLUTION_FIELDS[name]
            solutions = [r.meta[field] if isinstance(r.meta[field], str) else "\n".join(r.meta[field]) for r in records]
            grades = grader.grade_batch(solutions, [r.answer for r in records], timeout=timeout)
            correct = sum(g.correct for g in grades)
            table[name] = {
                "n": len(records),
                "correct": correct,
                "agreement": correct / len(records),
                "reasons": dict(Counter(g.reason for g in grades)),
            }
        return table
    finally:
        if own:
            grader.close()
