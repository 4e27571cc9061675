"""Documents that quote published bundles: every number a document quotes from a bundle is the
bundle's, none copied by hand.

Two markers, invisible in rendered Markdown (paths relative to the document's folder, as its
links are):

- ``<!-- include published/default/tables/main.md -->`` ... ``<!-- end include -->``: the block
  between them is the named file, verbatim (a table of a bundle, its ``stages.md``).
  :func:`refresh` rewrites every such block from its file.
- ``<!-- numbers from published/default -->`` ... ``<!-- end numbers -->``: prose whose every
  number must be printed in that bundle. :func:`unquoted` lists those that are not.

A number, as both sides print it: an estimate with its interval, as one (``-0.204 ± 0.100``,
``+0.186 [+0.131, +0.240]``; signs must match), a lone decimal (``0.176``, ``31.1%``; sign
ignored, so that prose may say "costs 0.188" of a difference the table prints as ``-0.188``), a
sign count (``4/4``) or a duration (``972 s``, ``74.0 min``; a decimal one, ``0.815 s``, may
also be a decimal the bundle prints without its unit). An estimate quoted with its interval
cannot match by chance; a lone decimal is checked only to be one the bundle prints somewhere,
which a number copied from an earlier run passes about as often as the bundle's tables cover
three-decimal values, so quote estimates with their intervals. Integers without a unit (seeds,
steps, jobs) are the sweep's configuration, not its results, and are not checked. The bundle's
printed numbers are those of its Markdown files (tables, ``stages.md``) and of its
configuration (``configs/``).

A verdict in a ``numbers from`` region is the bundle's too (:func:`misjudged`): a word
"resolved", "equivalent", "no cost", "inconclusive", "not resolved" or "unresolved" judges the
difference quoted with its interval nearest before it in its clause (else the first after it),
and where ``tables/conclusions.md`` judges that difference, the word must be its verdict. Every
test is in one family there (a ``## ... family`` section: ``hypotheses``, ``paired``, ``league``);
a sentence that names a family ("the league's family", "the paired table", "the hypotheses
family") takes the verdict from that family, and a verdict word judging a difference that family
does not hold is named too. A pre-registered hypothesis's finding, "confirmed", "contradicted" or
"undecided", must be the one ``conclusions.md`` prints beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

from gmc.io import write_text

INCLUDE = re.compile(r"<!-- include (?P<path>\S+) -->\n(?P<body>.*?)<!-- end include -->", re.S)
NUMBERS = re.compile(r"<!-- numbers from (?P<path>\S+) -->\n(?P<body>.*?)<!-- end numbers -->", re.S)
_SIGNED = r"[+\-−]?\d+\.\d+"
DURATION = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?) (s|min)\b")
INTERVAL = re.compile(rf"(?<![\w.])({_SIGNED})\s+±\s+(\d+\.\d+)(?!\.?\w)")  # \s: prose wraps lines
BRACKETS = re.compile(rf"(?<![\w.])({_SIGNED})\s+\[({_SIGNED}),\s+({_SIGNED})\]")
DECIMAL = re.compile(r"(?<![\w.])(\d+\.\d+%?)(?!\.?\w)")
FRACTION = re.compile(r"(?<![\w./])(\d+/\d+)(?![\w/])")


def _signed(x: str) -> str:
    return x.replace("−", "-").lstrip("+")


KINDS = (
    (DURATION, lambda m: f"{m[1].replace(',', '')} {m[2]}"),
    (INTERVAL, lambda m: f"{_signed(m[1])} ± {m[2]}"),
    (BRACKETS, lambda m: f"{_signed(m[1])} [{_signed(m[2])}, {_signed(m[3])}]"),
    (DECIMAL, lambda m: m[1]),
    (FRACTION, lambda m: m[1]),
)
"""Each kind of number, in the order they are taken from a text, and its normal form."""


def numbers(text: str) -> list[tuple[str, int]]:
    """Every number of ``text`` (module docstring) with its offset, in normal form: an estimate
    with its interval as one (``-0.204 ± 0.100``, ``+0.186 [+0.131, +0.240]``: its signs must
    match), a lone decimal without its sign, durations as ``<value> <unit>`` without thousands
    separators."""
    found = []
    for pattern, normal in KINDS:
        found += [(normal(m), m.start()) for m in pattern.finditer(text)]
        text = pattern.sub(lambda m: " " * len(m[0]), text)
    return sorted(found, key=lambda x: x[1])


def bundle_numbers(bundle: Path) -> set[str]:
    """Every number the bundle prints: its Markdown files and its configuration."""
    files = [*bundle.rglob("*.md"), *(bundle / "configs").rglob("*.yaml")]
    if not files:
        raise FileNotFoundError(f"{bundle}: no tables or configuration to quote (not a bundle made by gmc publish?)")
    texts = [path.read_text() for path in files]
    # every estimate with its interval, and each of its numbers alone
    return {n for text in texts for n, _ in numbers(text)} | {m[1] for t in texts for m in DECIMAL.finditer(t)}


VERDICT_WORD = re.compile(
    r"\b(not\s+resolved|none\s+resolved|unresolved|resolved|inconclusive|equivalent|no cost|"
    r"confirmed|contradicted|undecided)\b",
    re.I,
)
CLAUSE_END = re.compile(r"[;|]|\.(?=\s)|\n\s*\n")
SENTENCE_END = re.compile(r"[|]|\.(?=\s)|\n\s*\n")
CONCLUSION = re.compile(
    rf"^- .*?: ({_SIGNED}) \[({_SIGNED}), ({_SIGNED})\], .*?\*\*(\w+)[^*]*\*\*(?:; as predicted: \*\*(\w+)\*\*)?", re.M
)
FAMILY_SECTION = re.compile(r"^## .*: (\w+) family$", re.M)
FAMILY_NAMED = re.compile(r"\b(paired|league|hypotheses)(?:'s)?\s+(?:table|family)\b", re.I)
"""A family named in prose: ``the league's family``, ``the paired table``, ``the hypotheses family``."""
AGREES = {
    "resolved": {"resolved"},
    "not resolved": {"equivalent", "inconclusive"},
    "none resolved": {"equivalent", "inconclusive"},
    "unresolved": {"equivalent", "inconclusive"},
    "inconclusive": {"inconclusive"},
    "equivalent": {"equivalent"},
    "no cost": {"equivalent"},
}
FINDING_WORDS = ("confirmed", "contradicted", "undecided")
"""Words that judge a pre-registered hypothesis: each must be the finding ``conclusions.md`` gives it."""
"""The verdicts of ``conclusions.md`` each word of prose may stand for."""


def verdicts(bundle: Path) -> list[tuple[float, float, float, str, str, str]]:
    """Each difference ``tables/conclusions.md`` judges: (estimate, low, high, verdict, family,
    finding) as printed (the family of the section it is listed under; the finding of a
    pre-registered hypothesis, else empty)."""
    path = bundle / "tables" / "conclusions.md"
    if not path.exists():
        return []
    text = path.read_text()
    sections = [(m.start(), m[1]) for m in FAMILY_SECTION.finditer(text)]
    return [
        (
            float(m[1]),
            float(m[2]),
            float(m[3]),
            m[4],
            next((f for at, f in reversed(sections) if at < m.start()), ""),
            m[5] or "",
        )
        for m in CONCLUSION.finditer(text)
    ]


def _judged(estimate: str, judged: list[tuple[float, float, float, str, str, str]]) -> set[tuple[str, str, str]]:
    """The (verdict, family, finding) ``conclusions.md`` gives the difference quoted as ``estimate``
    (normal form, with its interval in brackets or as ``± half``; the half may differ from the
    bracket's by the rounding of its ends)."""
    values = [float(x) for x in re.findall(r"-?\d+\.\d+", estimate)]
    if "±" in estimate:
        return {
            (v, f, h) for d, lo, hi, v, f, h in judged if d == values[0] and abs((hi - lo) / 2 - values[1]) < 1.5e-3
        }
    return {(v, f, h) for d, lo, hi, v, f, h in judged if (d, lo, hi) == tuple(values)}


def _regions(text: str):
    """Each ``numbers from`` region of ``text``: the bundle it names, its prose with included
    blocks blanked (offsets kept; :func:`stale_includes` checks those) and the prose's offset."""
    for m in NUMBERS.finditer(text):
        yield m["path"], INCLUDE.sub(lambda b: " " * len(b[0]), m["body"]), m.start("body")


def misjudged(doc: str | Path) -> list[str]:
    """Each verdict word in a ``numbers from`` region of ``doc`` that is not the verdict its
    bundle's ``conclusions.md`` gives the difference it judges in the family its sentence names
    (any family where it names none), or that judges a difference the named family does not hold
    (module docstring), named by its line; a word that judges no difference ``conclusions.md``
    lists is not checked."""
    doc = Path(doc)
    text = doc.read_text()
    out = []
    judged: dict[str, list[tuple[float, float, float, str, str, str]]] = {}
    for path, body, start in _regions(text):
        if path not in judged:
            judged[path] = verdicts(doc.parent / path)
        estimates = [(n, at) for n, at in numbers(body) if "[" in n or "±" in n]
        ends = [0, *(c.end() for c in CLAUSE_END.finditer(body)), len(body)]
        stops = [0, *(c.end() for c in SENTENCE_END.finditer(body)), len(body)]
        for word in VERDICT_WORD.finditer(body):
            lo = max(e for e in ends if e <= word.start())
            hi = min(e for e in ends if e >= word.end())
            before = [n for n, at in estimates if lo <= at < word.start()]
            after = [n for n, at in estimates if word.end() <= at < hi]
            if not before + after:
                continue
            estimate = (before[-1:] or after)[0]
            found = _judged(estimate, judged[path])
            sentence = body[max(e for e in stops if e <= word.start()) : min(e for e in stops if e >= word.end())]
            named = {m[1].lower() for m in FAMILY_NAMED.finditer(sentence)}
            where = f'{doc}:{_line(text, start + word.start())}: "{word[1]}" judges {estimate}'
            if named and found and not {f for _, f, _ in found} & named:
                out.append(
                    f"{where} in the {' or '.join(sorted(named))} family; {path}/tables/conclusions.md "
                    f"judges it in the {' or '.join(sorted({f for _, f, _ in found}))} family"
                )
                continue
            said = " ".join(word[1].lower().split())
            if said in FINDING_WORDS:
                given = {h for _, f, h in found if h and (not named or f in named)}
                if given and said not in given:
                    out.append(f"{where}, which {path}/tables/conclusions.md finds {' or '.join(sorted(given))}")
                continue
            given = {v for v, f, _ in found if not named or f in named}
            if given and not given & AGREES[said]:
                out.append(f"{where}, which {path}/tables/conclusions.md finds {' or '.join(sorted(given))}")
    return out


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def documents(root: str | Path = ".") -> list[Path]:
    """The documents of a checkout that may quote bundles: ``README.md`` and every page under
    ``docs/`` (the bundles, reached through the link ``docs/published``, are not pages)."""
    root = Path(root)
    pages = [p for p in sorted((root / "docs").rglob("*.md")) if "published" not in p.relative_to(root).parts]
    return [p for p in [root / "README.md", *pages] if p.exists()]


def stale_includes(doc: str | Path) -> list[str]:
    """Each include block of ``doc`` that differs from its file, named by its line."""
    doc = Path(doc)
    root = doc.parent
    text = doc.read_text()
    out = []
    for m in INCLUDE.finditer(text):
        source = root / m["path"]
        if not source.exists():
            out.append(f"{doc}:{_line(text, m.start())}: includes {m['path']}, which does not exist")
        elif m["body"] != source.read_text():
            out.append(f"{doc}:{_line(text, m.start())}: the block differs from {m['path']}")
    return out


def refresh(doc: str | Path) -> int:
    """Rewrite every include block of ``doc`` from its file; returns how many changed. A block
    naming a missing file is an error that names it (nothing is written)."""
    doc = Path(doc)
    root = doc.parent
    text = doc.read_text()
    missing = [m["path"] for m in INCLUDE.finditer(text) if not (root / m["path"]).exists()]
    if missing:
        raise FileNotFoundError(f"{doc}: includes {', '.join(missing)}, which do not exist")
    changed = 0

    def block(m: re.Match) -> str:
        nonlocal changed
        body = (root / m["path"]).read_text()
        changed += body != m["body"]
        return f"<!-- include {m['path']} -->\n{body}<!-- end include -->"

    new = INCLUDE.sub(block, text)
    if changed:
        write_text(doc, new)
    return changed


def unquoted(doc: str | Path) -> list[str]:
    """Each number in a ``numbers from`` region of ``doc`` that its bundle does not print, named
    by its line; included blocks inside a region are checked by :func:`stale_includes` instead."""
    doc = Path(doc)
    root = doc.parent
    text = doc.read_text()
    out = []
    known: dict[str, set[str]] = {}
    for path, body, start in _regions(text):
        if path not in known:
            known[path] = bundle_numbers(root / path)
        for number, offset in numbers(body):
            value = number.split(" ")[0]  # a decimal duration may be printed without its unit
            if number not in known[path] and not (DURATION.fullmatch(number) and "." in value and value in known[path]):
                out.append(f"{doc}:{_line(text, start + offset)}: {number} is not a number of {path}")
    return out


def quoted_bundles(doc: str | Path) -> dict[str, list[str]]:
    """What ``doc`` quotes: the files it includes and the bundles its number regions name."""
    text = Path(doc).read_text()
    return {
        "include": [m["path"] for m in INCLUDE.finditer(text)],
        "numbers": [m["path"] for m in NUMBERS.finditer(text)],
    }
