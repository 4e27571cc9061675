"""Answers as text: gold answers normalised and final answers extracted from completions
(method.md section 5).

:func:`normalize_gold` turns a data set's gold answer into a string (integers of any length
canonical, ``$`` delimiters and lists handled); :func:`extract_answer` finds a completion's
final answer (the last ``\\boxed{}``, a brace-less ``\\boxed 5``, "the final answer is X",
"Answer: X") in linear time, so a hostile completion costs milliseconds. Whether two answers
are equivalent is :mod:`gmc.tasks.grading`' business.
"""

from __future__ import annotations

import re
from typing import Any

MAX_COMPLETION_CHARS = 1_000_000
"""Extraction reads at most the last this-many characters of a completion."""


_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_INT_RE = re.compile(r"^([+-]?\d+)\.0*$")
_DOLLAR_RE = re.compile(r"(?<!\\)\$")  # an unescaped $


def canonical_int(digits: str) -> str:
    """``"+007"`` -> ``"7"``, ``"-0"`` -> ``"0"``: as ``str(int(x))``, without Python's limit on
    the number of digits an ``int`` may be parsed from."""
    sign = "-" if digits.startswith("-") else ""
    body = digits.lstrip("+-").lstrip("0") or "0"
    return ("" if body == "0" else sign) + body


def normalize_gold(value: Any) -> str:
    """Gold answers as strings: ``"025"`` -> ``"25"``, ``27.0`` -> ``"27"``, surrounding ``$``
    and whitespace removed; a list (OlympiadBench's ``final_answer``, e.g. ``["$69$,$84$"]``)
    -> its items without ``$`` delimiters, joined by commas (``"69,84"``, as in the local copy);
    everything else kept as written. Integers of any length are handled as text."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not a gold answer")
    if isinstance(value, (list, tuple)):
        return ",".join(normalize_gold(_DOLLAR_RE.sub("", str(v))) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip().strip("$").strip()
    if _INT_RE.match(text):
        return canonical_int(text)
    m = _FLOAT_INT_RE.match(text)
    if m:
        return canonical_int(m.group(1))
    return text


_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` whose braces balance (nested
    braces matched), else None. Linear time: one pass pairs every brace."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            closing[stack.pop()] = m.start()
    for m in reversed(list(_BOXED_OPEN.finditer(text))):
        start = m.end() - 1
        if start in closing:
            return text[start + 1 : closing[start]]
    return None


# extraction: every pattern runs in linear time (no pattern can fail after a quantifier whose
# characters overlap the next one's), so hostile completions cost milliseconds, not minutes

# "The final answer is $X$" / "the answer is X": X runs to a sentence's period (not a decimal
# point), a "$" or the line's end
_PHRASE = re.compile(r"(?:final answer|the answer) is[:\s]*\$?(?P<a>\.?(?:[^\n$.]|(?<=\d)\.(?=\d))*)", re.IGNORECASE)
_DOLLAR_END = re.compile(r"\$\s*(?:\.|$)", re.MULTILINE)
# "Answer: X" at a line start; X runs to a "$" or the line's end
_ANSWER_LINE = re.compile(r"^[^\S\n]*\**answer\**\s*[:：]\s*\**\s*\$?(?P<a>[^\n$]*)", re.IGNORECASE | re.MULTILINE)
_LINE_END_AFTER_DOLLAR = re.compile(r"\$[^\S\n]*\.?[^\S\n]*(?:\n|\Z)")
_BRACELESS_BOXED = re.compile(r"\\boxed\s+([^\s$]+)")


def _phrase_answer(text: str) -> str | None:
    found = None
    for m in _PHRASE.finditer(text):
        a, end = m.group("a").strip(), m.end()
        term = text[end] if end < len(text) else ""
        if a and (term != "$" or _DOLLAR_END.match(text, end)):
            found = a
    return found


def _line_answer(text: str) -> str | None:
    found = None
    for m in _ANSWER_LINE.finditer(text):
        a, end = m.group("a").rstrip(), m.end()
        if a.endswith("."):
            a = a[:-1].rstrip()
        if a and (end == len(text) or text[end] == "\n" or _LINE_END_AFTER_DOLLAR.match(text, end)):
            found = a
    return found


def extract_answer(text: str) -> str | None:
    """The final answer in a completion's last :data:`MAX_COMPLETION_CHARS` characters, or
    None. In order of preference:

    1. the content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces matched);
    2. a brace-less ``\\boxed 5`` (the token after it);
    3. the last "final answer is X" / "the answer is X" phrase;
    4. the last line of the form "Answer: X".

    The result is cleaned by :func:`clean_answer`.
    """
    if not text:
        return None
    text = text[-MAX_COMPLETION_CHARS:]
    boxed = last_boxed(text)
    if boxed is not None:
        return clean_answer(boxed)
    braceless = _BRACELESS_BOXED.findall(text)
    if braceless:
        return clean_answer(braceless[-1])
    found = _phrase_answer(text)
    if found is None:
        found = _line_answer(text)
    return None if found is None else clean_answer(found)


_BOLD = re.compile(r"\\(?:mathbf|textbf|boldsymbol|bm)\{([^{}]*)\}")
_DIGIT_GAP = re.compile(r"(?<=\d)\s+(?=\d)")
_PAREN_INT = re.compile(r"^\(\s*([+-]?\d+)\s*\)$")


def clean_answer(answer: str) -> str:
    """Typography that does not change an answer's value: surrounding ``$``, a trailing period,
    bold wrappers (``\\mathbf{17}`` -> ``17``), spaces between digits (``1 4 4`` is 144 in LaTeX
    math mode) and parentheses around a lone integer (``(073)`` -> ``073``)."""
    a = answer.strip().strip("$").strip()
    if a.endswith("."):
        a = a[:-1].strip().strip("$").strip()
    for _ in range(8):  # nested wrappers, innermost first; deeper nesting is not typography
        a, n = _BOLD.subn(r"\1", a)
        if not n:
            break
    a = _DIGIT_GAP.sub("", a)
    m = _PAREN_INT.match(a)
    return m.group(1) if m else a
