"""Equivalence grading with math-verify in a pool of processes: answer pairs, reasons, time
limits, hostile and long input, stop signals, closing, and the oracle on MATH-500."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers import HOSTILE

from gmc.tasks.grading import (
    Grade,
    Grader,
    grade,
    grade_batch,
    grade_oracle,
)


def test_long_integers_and_hostile_text_grade_without_crashing():
    from gmc.tasks.grading import Grader

    big = "9" * 5_000  # past Python's 4,300-digit int conversion limit
    completions = [
        f"\\boxed{{{big}}}",
        f"\\boxed{{0{big}}}",
        f"\\boxed{{{big[:-1]}8}}",
        "\\boxed{" + "x+" * 2_000 + "1}",
        *HOSTILE.values(),
    ]
    golds = [big, big, big, "1", *["1"] * len(HOSTILE)]
    with Grader(workers=2, timeout=1.0) as grader:
        start = time.perf_counter()
        grades = grader.grade_batch(completions, golds)
        elapsed = time.perf_counter() - start
    assert [g.reason for g in grades[:4]] == ["ok", "ok", "wrong", "too_long"]
    assert all(g.reason in ("no_answer", "wrong", "parse_error", "timeout", "too_long") for g in grades[4:])
    assert elapsed < 30


# (gold, model answer, equivalent?)
PAIRS = [
    # integers, leading zeros, decimals
    ("25", "025", True),
    ("27", "27.0", True),
    ("-1", "-1.00", True),
    ("1000", "1,000", True),
    ("12", "13", False),
    ("0.5", "0.50", True),
    ("0.5", "0.51", False),
    # fractions
    ("\\frac{1}{2}", "0.5", True),
    ("\\frac{1}{2}", "\\dfrac{1}{2}", True),
    ("\\frac{1}{2}", "1/2", True),
    ("\\frac{3}{4}", "\\frac{6}{8}", True),
    ("\\frac{2}{3}", "0.67", False),
    ("\\frac{1}{3}", "\\frac{1}{4}", False),
    # expressions and radicals
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\sqrt{2}", "2^{1/2}", True),
    ("\\pi", "3.14", False),
    ("2\\pi", "\\pi \\cdot 2", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2+1", "x^2-1", False),
    ("2^{1009}", "2^{1009}", True),
    # intervals
    ("[1,3)", "[1, 3)", True),
    ("(-\\infty, 2]", "(-\\infty,2]", True),
    ("[1,3]", "(1,3)", False),
    # sets and tuples
    ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
    ("\\{1,2\\}", "\\{1,3\\}", False),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("(1,2)", "(2,1)", False),
    # matrices
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}", False),
    # units
    ("5", "5\\text{ cm}", True),
    ("10", "10 \\mbox{ inches}", True),
    ("7", "8\\text{ cm}", False),
    # percentages
    ("50\\%", "50\\%", True),
    ("20", "20\\%", True),
    ("30\\%", "40\\%", False),
    # degrees
    ("106^\\circ", "106", True),
    ("45^\\circ", "45^{\\circ}", True),
    ("90^\\circ", "60^\\circ", False),
    # LaTeX spacing and typography
    ("\\frac{9}{25}", "\\frac{\\mathbf{9}}{\\mathbf{2 5}}", True),
    ("14400", "\\mathbf{1 4 4 0 0}", True),
    ("3", "\\, 3 \\,", True),
    ("\\text{(C)}", "\\text{(C)}", True),
    # equations: the right-hand side counts
    ("3", "x = 3", True),
    ("4", "x=5", False),
]


def test_pair_table_is_big_enough():
    assert len(PAIRS) >= 40
    assert sum(not eq for _, _, eq in PAIRS) >= 12


def test_answer_pairs():
    grades = grade_batch([f"so \\boxed{{{a}}}" for _, a, _ in PAIRS], [g for g, _, _ in PAIRS])
    wrong = [(g, a, eq, gr.reason) for (g, a, eq), gr in zip(PAIRS, grades) if gr.correct != eq]
    assert not wrong, wrong
    for gr in grades:
        assert gr.reward == float(gr.correct)
        assert gr.reason in ("ok", "wrong", "parse_error")


def test_grade_reasons():
    assert grade("\\boxed{4}", "4") == Grade(True, 1.0, "4", "ok")
    assert grade("\\boxed{5}", "4").reason == "wrong"
    assert grade("I don't know", "4") == Grade(False, 0.0, None, "no_answer")
    assert grade("\\boxed{@@@}", "4").reason in ("parse_error", "wrong")


def test_pathological_answer_costs_at_most_the_timeout():
    with Grader(workers=2, timeout=1.0) as g:
        start = time.time()
        out = g.grade_batch(["\\boxed{9^{9^{9^{9}}}}", "\\boxed{2}"], ["1", "2"])
        elapsed = time.time() - start
        assert out[0].correct is False and out[0].reason in ("timeout", "wrong", "parse_error")
        assert out[1].correct
        assert elapsed < 6.0
        # the grader still works after a timeout
        assert g.grade_batch(["\\boxed{\\frac{1}{2}}"], ["0.5"])[0].correct


def _worker_dispositions():
    return signal.getsignal(signal.SIGTERM) == signal.SIG_IGN, signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN


def _pid():
    return os.getpid()


def _parent():
    return os.getppid()


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_grading_goes_on_through_a_jobs_stop_signal_and_the_pool_still_closes(start_method):
    """SLURM signals every process of a job: the grading workers ignore SIGTERM and SIGUSR1 (and
    never run the handlers of the run that started them), so the step in progress finishes its
    grading; the pool's terminate() still ends them. Forked workers are the run's children;
    a forkserver's are not (they copy none of the run's threads)."""
    received = []
    previous = {
        s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in (signal.SIGTERM, signal.SIGUSR1)
    }
    try:
        g = Grader(workers=2, start_method=start_method)
        pool = g._ensure_pool()
        assert pool.apply(_worker_dispositions) == (True, True)
        assert (pool.apply(_parent) == os.getpid()) == (start_method == "fork")
        pids = {pool.apply(_pid) for _ in range(8)}
        for pid in pids:  # what the job's stop signal does to them
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGUSR1)
        assert all(x.correct for x in g.grade_batch(["\\boxed{\\frac{1}{2}}"] * 4, ["0.5"] * 4))
        closer = threading.Thread(target=g.close, daemon=True)
        closer.start()
        closer.join(timeout=30)
        assert not closer.is_alive(), "Grader.close() hangs"
        assert received == []
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _kill_the_worker_handler(pool):
    """The pool's worker-handler thread dies (as it did when a test's clock ran out under it):
    a message it cannot read on the pipe that wakes it."""
    pool._change_notifier._writer.send_bytes(b"not a pickle")
    pool._worker_handler.join(timeout=10)
    assert not pool._worker_handler.is_alive()


def _stop_the_workers(pool):
    """Every worker stopped (SIGSTOP), the idle one holding the task queue's lock."""
    for w in pool._pool:
        os.kill(w.pid, signal.SIGSTOP)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
@pytest.mark.parametrize(
    "fault", [_kill_the_worker_handler, _stop_the_workers], ids=["worker_handler_gone", "workers_stopped"]
)
def test_close_ends_within_its_bound_whatever_the_pools_state(fault, start_method, caplog):
    """A pool whose terminate() never returns (it waits, without a timeout, for a lock an idle
    worker holds): close() kills the workers after its grace period and returns within twice
    that, with no worker left and the pool's threads ended."""
    grace = 1.0
    g = Grader(workers=2, close_grace=grace, start_method=start_method)
    pool = g._ensure_pool()
    assert all(x.correct for x in g.grade_batch(["\\boxed{\\frac{1}{2}}"] * 4, ["0.5"] * 4))
    pids = [w.pid for w in pool._pool]
    fault(pool)
    closer = threading.Thread(target=g.close, daemon=True)
    start = time.monotonic()
    closer.start()
    closer.join(timeout=30)
    elapsed = time.monotonic() - start
    assert not closer.is_alive(), "Grader.close() hangs"
    assert elapsed < 2 * grace + 1.0, elapsed
    assert "terminate() did not end within" in caplog.text  # the pool's own terminate was stuck
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for thread in (pool._task_handler, pool._result_handler):
        thread.join(timeout=5)
        assert not thread.is_alive(), thread


EXIT_WITH_A_BROKEN_POOL = """
import sys
from gmc.tasks.grading import Grader
g = Grader(workers=2, close_grace=1.0)
pool = g._ensure_pool()
assert g.grade_batch(["\\\\boxed{\\\\frac{1}{2}}"], ["0.5"])[0].correct
pool._change_notifier._writer.send_bytes(b"not a pickle")  # the worker handler dies
pool._worker_handler.join(timeout=10)
assert not pool._worker_handler.is_alive()
print(*(w.pid for w in pool._pool), flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_process_ends_at_exit_with_an_unclosed_broken_pool():
    """A grader never closed, its pool broken: the interpreter's exit ends the pool within the
    grader's bound, and no worker outlives the process (multiprocessing's exit handler sends
    the daemon workers SIGTERM, which they ignore, and waits for them without a timeout)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", EXIT_WITH_A_BROKEN_POOL], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    start = time.monotonic()
    try:
        proc.wait(timeout=30)
        seconds = time.monotonic() - start
        survivors = [pid for pid in pids if _alive(pid)]
    finally:
        proc.kill()
        for pid in pids:  # whatever the outcome, nothing is left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    err = proc.stderr.read()[-3000:]
    assert len(pids) == 2 and proc.returncode == 0, err
    assert seconds < 2 * 1.0 + 2.0 and survivors == [], (seconds, survivors, err)


def test_an_unknown_start_method_is_refused():
    with pytest.raises(ValueError, match="start_method"):
        Grader(start_method="spawn")


def test_grade_batch_length_mismatch():
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        grade_batch(["a", "b"], ["1"])


def test_oracle_math500_agreement(shared_data):
    table = grade_oracle(["math500", "minerva_math"], root=shared_data)
    assert table["math500"]["agreement"] >= 0.99
    assert table["minerva_math"]["n"] == 272
