"""Grading throughput with the process pool (2 workers), against grading in one process.

Three answer sets from MATH500: the reference answers themselves (the fast path decides them),
answers rewritten into an equivalent but different form (math-verify must decide), and answers
with a digit appended (mostly wrong; a few, like ``\\frac{1}{2}1``, stay equivalent). Also the
worst-case latency of a pathological answer. Run: python bench/grading.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from gmc.tasks.answers import extract_answer  # noqa: E402
from gmc.tasks.datasets import load_dataset  # noqa: E402
from gmc.tasks.grading import Grader, _verify_worker, fast_verdict  # noqa: E402


def rewrite(answer: str) -> str:
    """An equivalent form that defeats the textual fast path."""
    return f"{answer} + 0" if not any(c in answer for c in ",=<>") else f"\\left({answer}\\right)"


def serial(completions, golds):
    """The alternative: one process, math-verify on every item (no pool, no fast path)."""
    out = []
    for c, g in zip(completions, golds):
        a = extract_answer(c)
        out.append(False if a is None else _verify_worker((g, a, 5))[0])
    return out


def main() -> None:
    records = load_dataset("math500")
    golds = [r.answer for r in records]
    sets = {
        "reference": [f"\\boxed{{{g}}}" for g in golds],
        "rewritten": [f"\\boxed{{{rewrite(g)}}}" for g in golds],
        "appended": [f"\\boxed{{{g}1}}" for g in golds],
    }
    result = {"items": len(golds), "workers": 2}
    with Grader(workers=2, timeout=5.0) as grader:
        grader.grade_batch(sets["reference"][:8], golds[:8])  # start the pool
        for name, completions in sets.items():
            t = time.perf_counter()
            grades = grader.grade_batch(completions, golds)
            dt = time.perf_counter() - t
            t = time.perf_counter()
            ser = serial(completions, golds)
            dt_serial = time.perf_counter() - t
            result[name] = {
                "pool_answers_per_s": len(golds) / dt,
                "serial_answers_per_s": len(golds) / dt_serial,
                "speedup": dt_serial / dt,
                "fast_path_fraction": sum(
                    fast_verdict(g, extract_answer(c)) is not None for c, g in zip(completions, golds)
                )
                / len(golds),
                "correct": sum(g.correct for g in grades) / len(golds),
                "agrees_with_serial": sum(g.correct == s for g, s in zip(grades, ser)) / len(golds),
            }
        t = time.perf_counter()
        bad = grader.grade_batch(["\\boxed{9^{9^{9^{9}}}}"], ["1"], timeout=2.0)[0]
        result["pathological"] = {
            "answer": "9^{9^{9^{9}}}",
            "timeout_s": 2.0,
            "latency_s": time.perf_counter() - t,
            "reason": bad.reason,
        }
    write_result("grading", result)


if __name__ == "__main__":
    main()
