"""The synthetic arithmetic task: the default training and evaluation data of the CPU run
(method.md section 5).

:class:`SyntheticTask` draws seeded problems such as ``Compute 7*3+12.`` whose gold answer is the
integer value; train and test splits are disjoint by a hash of the problem text.
:func:`solution_steps` writes the worked solutions the tiny model's warm start learns.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Annotated

from pydantic import Field

from gmc.settings import ConfigError, PositiveInt, settings
from gmc.tasks.datasets import DataError, Record


@settings(prefix="synthetic.")
class SyntheticTask:
    """Seeded arithmetic problems such as ``Compute 7*3+12.``; the gold answer is the integer
    value (usual precedence). Difficulty knobs: operand count, digits per operand, operators.

    The splits are disjoint by construction: a problem belongs to the test split when the SHA-1
    of its text falls in the first ``test_fraction`` of the hash range, to the validation split
    when it falls in the next ``validation_fraction``, and to the train split otherwise.
    """

    min_operands: Annotated[int, Field(ge=2)] = 2
    """Fewest operands of a problem."""
    max_operands: Annotated[int, Field(ge=2)] = 3
    """Most operands of a problem."""
    min_digits: PositiveInt = 1
    """Fewest digits of an operand."""
    max_digits: PositiveInt = 1
    """Most digits of an operand."""
    operators: str = "+-*"
    """Operators to draw from: a non-empty subset of ``+-*``."""
    test_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.2
    """Share of the problem space (by hash) held out as the test split."""
    validation_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Share of the problem space (by hash) held out as the validation split, on which a warm
    start is judged (problems no training and no evaluation uses); 0: none."""

    def __post_init__(self) -> None:
        if self.min_operands > self.max_operands:
            raise ConfigError(f"must be >= min_operands ({self.min_operands}), got {self.max_operands}", "max_operands")
        if self.min_digits > self.max_digits:
            raise ConfigError(f"must be >= min_digits ({self.min_digits}), got {self.max_digits}", "max_digits")
        if not self.operators or set(self.operators) - set("+-*"):
            raise ConfigError(f"must be a non-empty subset of '+-*', got {self.operators!r}", "operators")
        if self.test_fraction + self.validation_fraction >= 1:
            raise ConfigError(
                f"test_fraction + validation_fraction must stay below 1, got {self.test_fraction} + "
                f"{self.validation_fraction}",
                "validation_fraction",
            )

    def _expression(self, rng: random.Random) -> str:
        n = rng.randint(self.min_operands, self.max_operands)
        terms = [
            str(rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1))
            for d in (rng.randint(self.min_digits, self.max_digits) for _ in range(n))
        ]
        out = terms[0]
        for t in terms[1:]:
            out += rng.choice(self.operators) + t
        return out

    def split_of(self, problem: str) -> str:
        h = int.from_bytes(hashlib.sha1(problem.encode()).digest()[:8], "big") / 2**64
        if h < self.test_fraction:
            return "test"
        return "validation" if h < self.test_fraction + self.validation_fraction else "train"

    def generate(self, split: str, n: int, seed: int = 0) -> list[Record]:
        """``n`` distinct problems of ``split`` (``train``, ``test`` or ``validation``)."""
        if split not in ("train", "test", "validation"):
            raise DataError(f"synthetic split must be 'train', 'test' or 'validation', got {split!r}")
        if split == "validation" and self.validation_fraction == 0:
            raise DataError("synthetic: no validation split (validation_fraction is 0)")
        rng = random.Random(f"{seed}-{split}")
        out: list[Record] = []
        seen: set[str] = set()
        attempts = 0
        while len(out) < n:
            attempts += 1
            if attempts > 200 * n + 10_000:
                raise DataError(f"synthetic: cannot find {n} distinct {split} problems; widen the difficulty knobs")
            expr = self._expression(rng)
            problem = f"Compute {expr}."
            if problem in seen or self.split_of(problem) != split:
                continue
            seen.add(problem)
            out.append(
                Record(
                    f"synthetic-{split}-{len(out)}",
                    problem,
                    str(eval_expression(expr)),
                    "synthetic",
                    {"expression": expr},
                )
            )
        return out


_TOKEN_RE = re.compile(r"\d+|[+\-*]")
_EXPR_RE = re.compile(r"\d+(?:[+\-*]\d+)*")


def eval_expression(expr: str) -> int:
    """Evaluate ``+ - *`` over non-negative integers with the usual precedence (no ``eval``)."""
    if not _EXPR_RE.fullmatch(expr):
        raise DataError(f"not an arithmetic expression: {expr!r}")
    tokens = _TOKEN_RE.findall(expr)
    # fold products first, then sums
    terms, signs = [int(tokens[0])], [1]
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            terms[-1] *= int(num)
        else:
            terms.append(int(num))
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


def solution_steps(expr: str, answer_offset: int = 0) -> str:
    """A worked solution for the tiny model's warm start: products first, then left to right,
    ending with the boxed answer. Example: ``7*3+12`` -> ``7*3=21. 21+12=33. \\boxed{33}``.
    ``answer_offset`` shifts the boxed number (a wrong final answer after right steps)."""
    tokens = _TOKEN_RE.findall(expr)
    steps = []
    # products
    items: list[str] = [tokens[0]]
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            value = int(items[-1]) * int(num)
            steps.append(f"{items[-1]}*{num}={value}.")
            items[-1] = str(value)
        else:
            items += [op, num]
    acc = int(items[0])
    for op, num in zip(items[1::2], items[2::2]):
        new = acc + int(num) if op == "+" else acc - int(num)
        steps.append(f"{acc}{op}{num}={new}.")
        acc = new
    return " ".join(steps + [f"\\boxed{{{acc + answer_offset}}}"])
