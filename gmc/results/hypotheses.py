"""Pre-registered hypotheses of a confirmatory sweep (``analysis.hypotheses``; docs/results/
confirmatory.md): each a contrast of the sweep's cells with a predicted outcome, all of them one
family. This module reads and checks them (no pandas: the workflow's configuration loads it);
:func:`gmc.results.inference.hypothesis_tests` tests them.

A contrast is a signed sum of cells ``<algorithm>@<delay>`` (an estimator or a variant at a fixed
delay or a named delay mode, at the hypothesis's group size), with parentheses::

    gmc@64 - tic@64                          GMC against TIC at delay 64
    tic@64 - tic@0                           TIC's cost of staleness
    (tic@64 - tic@0) - (grpo@64 - grpo@0)    TIC's cost minus GRPO's

Its coefficients sum to zero (a contrast compares cells; a lone cell is a level, not a
difference). Each seed's value is the contrast of that seed's runs, and the hypothesis is tested
on those values over the seeds that ran every cell.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from gmc.settings import PositiveInt, settings

PREDICTIONS = ("positive", "negative", "equivalent")
"""What a hypothesis predicts of its contrast: above zero, below zero, or within the equivalence
margin of zero."""

FINDINGS = ("confirmed", "contradicted", "undecided")
"""What a confirmatory sweep finds of a hypothesis (:func:`finding`)."""

_TOKEN = re.compile(r"\s*(?:(?P<cell>[a-z][a-z0-9_]*@(?:trace-)?[A-Za-z0-9_]+)|(?P<op>[-+−()]))")


def parse_contrast(text: str) -> dict[tuple[str, str], int]:
    """The coefficients of ``text``'s cells, ``{(algorithm, delay): coefficient}`` in the order
    the cells first appear, cells of coefficient 0 dropped. A ValueError names what is wrong: an
    unreadable token, an unbalanced parenthesis, a contrast of no cells or whose coefficients do
    not sum to zero."""
    tokens, at = [], 0
    while at < len(text.rstrip()):
        m = _TOKEN.match(text, at)
        if m is None:
            raise ValueError(f"cannot read {text[at:].strip()!r}: write cells as <algorithm>@<delay> joined by + and -")
        tokens.append(m["cell"] or m["op"].replace("−", "-"))
        at = m.end()
    coefficients: dict[tuple[str, str], int] = {}
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def expression(sign: int) -> None:  # [+-] term ([+-] term)*
        nonlocal pos
        op = 1
        if peek() in ("+", "-"):
            op = -1 if tokens[pos] == "-" else 1
            pos += 1
        term(sign * op)
        while peek() in ("+", "-"):
            op = -1 if tokens[pos] == "-" else 1
            pos += 1
            term(sign * op)

    def term(sign: int) -> None:  # cell | ( expression )
        nonlocal pos
        tok = peek()
        if tok is None or tok in ("+", "-", ")"):
            raise ValueError(f"{text!r}: a sign or parenthesis with no term after it")
        pos += 1
        if tok == "(":
            expression(sign)
            if peek() != ")":
                raise ValueError(f"{text!r}: a '(' without its ')'")
            pos += 1
            return
        algorithm, delay = tok.split("@", 1)
        coefficients[(algorithm, delay)] = coefficients.get((algorithm, delay), 0) + sign

    expression(1)
    if pos < len(tokens):
        raise ValueError(
            f"{text!r}: a ')' without its '('"
            if tokens[pos] == ")"
            else f"{text!r}: two terms without + or - between them"
        )
    out = {cell: c for cell, c in coefficients.items() if c != 0}
    if not out:
        raise ValueError(f"{text!r}: no cell is left once its terms cancel")
    if sum(out.values()) != 0:
        raise ValueError(
            f"{text!r}: its coefficients sum to {sum(out.values())}, not 0: a hypothesis compares cells "
            "(a - b, (a - b) - (c - d))"
        )
    return out


def _contrast(text: str) -> str:
    parse_contrast(text)
    return text


@settings(prefix="analysis.hypotheses.")
class Hypothesis:
    """One pre-registered hypothesis: a contrast of the sweep's cells and what it predicts of it."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")]
    """A short name the tables and the pre-registration call it by (``H1``)."""
    contrast: Annotated[str, AfterValidator(_contrast)]
    """A signed sum of cells ``<algorithm>@<delay>`` whose coefficients sum to zero
    (:func:`parse_contrast`): ``gmc@64 - tic@64``, ``(tic@64 - tic@0) - (grpo@64 - grpo@0)``."""
    predict: Literal[PREDICTIONS]
    """``positive`` or ``negative``: the contrast differs from zero with this sign; ``equivalent``:
    it lies within the analysis' equivalence margin of zero."""
    group: PositiveInt | None = None
    """The group size of its cells; None: the sweep's one group size."""

    @property
    def cells(self) -> dict[tuple[str, str], int]:
        """The contrast's coefficients by ``(algorithm, delay)`` (:func:`parse_contrast`)."""
        return parse_contrast(self.contrast)


def finding(predict: str, diff: float, p_holm: float, p_equivalent_holm: float, alpha: float) -> str:
    """What the family's adjusted tests find of a hypothesis (:data:`FINDINGS`). A predicted sign:
    **confirmed** where the difference from zero is resolved (``p_holm < alpha``) with that sign,
    **contradicted** where it is resolved with the other sign or is equivalent to zero within the
    margin (no difference of the size the study was powered for), **undecided** otherwise. A
    predicted equivalence: **confirmed** where the equivalence test is resolved, **contradicted**
    where the difference from zero is resolved and the equivalence is not, **undecided** otherwise."""
    resolved, equivalent = p_holm < alpha, p_equivalent_holm < alpha
    if predict == "equivalent":
        return "confirmed" if equivalent else "contradicted" if resolved else "undecided"
    sign = 1 if predict == "positive" else -1
    if resolved:
        return "confirmed" if sign * diff > 0 else "contradicted"
    return "contradicted" if equivalent else "undecided"
