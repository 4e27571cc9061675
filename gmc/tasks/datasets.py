"""Data: the six evaluation benchmarks and the training sets as lists of :class:`Record`, and
the prompt around a problem (method.md section 5).

A registered set (:data:`BENCHMARKS`, :data:`TRAIN_SETS`) loads from a local JSONL, JSON or
Parquet file under a data root (``$GMC_DATA_ROOT``, else ``data/``, filled by ``gmc
prepare-data``) or from the Hugging Face hub; bad input raises :class:`DataError` naming the
file and line. The generated task is :mod:`gmc.tasks.synthetic`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmc.tasks.answers import last_boxed, normalize_gold

log = logging.getLogger(__name__)

DEFAULT_DATA_ROOT_ENV = "GMC_DATA_ROOT"


class DataError(ValueError):
    """A data file or data setting is wrong; the message names the file, line or setting."""


@dataclass(frozen=True)
class Record:
    """One problem. ``answer`` is the normalised gold answer (see :func:`normalize_gold`)."""

    id: str
    problem: str
    answer: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "problem": self.problem, "answer": self.answer, "source": self.source, "meta": self.meta}


@dataclass(frozen=True)
class DatasetSpec:
    """Where a named set lives, locally and on the hub, and which fields hold what."""

    local: str
    """Path relative to the data root."""
    hub_id: str
    """Hugging Face dataset id for ``source='hub'``."""
    hub_split: str = "test"
    hub_config: str | None = None
    problem_field: str = "problem"
    answer_field: str = "answer"
    hub_problem_field: str | None = None
    """Field names on the hub when they differ from the local file's."""
    hub_answer_field: str | None = None
    id_field: str | None = None
    hub_answer_from_boxed: bool = False
    """The hub copy has no answer field: take the last ``\\boxed{}`` of its answer field."""
    label: str = ""
    """Name in tables, figures and reports."""
    k: int = 4
    """Benchmarks: samples per problem for Pass@1 by default (``evaluate.samples`` overrides)."""
    solution_field: str | None = None
    """Benchmarks: the field holding a worked reference solution (for ``gmc grade-oracle``)."""


BENCHMARKS: dict[str, DatasetSpec] = {
    "math500": DatasetSpec(
        "benchmarks/math500/test.jsonl",
        "HuggingFaceH4/MATH-500",
        id_field="unique_id",
        label="MATH500",
        solution_field="solution",
    ),
    "aime24": DatasetSpec(
        "benchmarks/aime24/test.jsonl",
        "HuggingFaceH4/aime_2024",
        hub_split="train",
        id_field="id",
        label="AIME 2024",
        k=16,
        solution_field="solution",
    ),
    "aime25": DatasetSpec("benchmarks/aime25/test.jsonl", "math-ai/aime25", id_field="id", label="AIME 2025", k=16),
    "amc23": DatasetSpec(
        "benchmarks/amc23/test.jsonl",
        "math-ai/amc23",
        hub_problem_field="question",
        id_field="id",
        label="AMC 2023",
        k=16,
    ),
    "minerva_math": DatasetSpec(
        "benchmarks/minerva_math/test.jsonl",
        "math-ai/minervamath",
        hub_problem_field="question",
        id_field="idx",
        label="Minerva Math",
        solution_field="solution",
    ),
    "olympiadbench": DatasetSpec(
        "benchmarks/olympiadbench/test.jsonl",
        "math-ai/olympiadbench",
        hub_problem_field="question",
        hub_answer_field="final_answer",
        id_field="id",
        label="OlympiadBench",
        solution_field="solution",
    ),
}
"""The six evaluation benchmarks of method.md section 5; the one place to add one."""

SYNTHETIC = DatasetSpec("", "", label="synthetic arithmetic", k=4)
"""The generated benchmark ``synthetic`` (the synthetic task's test split): no file, no hub copy."""

TRAIN_SETS: dict[str, DatasetSpec] = {
    "math": DatasetSpec(
        "train/math/train.jsonl",
        "DigitalLearningGmbH/MATH-lighteval",
        hub_split="train",
        hub_answer_field="solution",
        hub_answer_from_boxed=True,
        label="MATH train split",
    ),
}
"""Training sets: the MATH training split."""

REFERENCE_SOLUTION_FIELDS = {name: spec.solution_field for name, spec in BENCHMARKS.items() if spec.solution_field}
"""Benchmarks whose data carries a worked reference solution (used by the grading oracle)."""


def benchmark_specs() -> dict[str, DatasetSpec]:
    """Every benchmark name ``evaluate.benchmarks`` accepts: ``synthetic``, then the registered six."""
    return {"synthetic": SYNTHETIC, **BENCHMARKS}


# ---------------------------------------------------------------------------------------------
# file loading


CHECKOUT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_ROOT = (CHECKOUT if (CHECKOUT / "Snakefile").is_file() else Path()) / "data"
"""Where ``gmc prepare-data`` puts the files: ``data/`` in the repository (git-ignored) where gmc
runs from its checkout (an editable install), else ``data/`` in the working directory (``pip
install .``, run from a clone's folder)."""


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The local data root: the argument, else ``$GMC_DATA_ROOT``, else :data:`DEFAULT_DATA_ROOT`."""
    if root is not None:
        return Path(root)
    env = os.environ.get(DEFAULT_DATA_ROOT_ENV)
    if env:
        return Path(env)
    return DEFAULT_DATA_ROOT


def read_rows(path: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
    """Rows of a JSONL, JSON (array, or object with a ``data`` array) or Parquet file, each with
    its 1-based line (JSONL) or row number."""
    path = Path(path)
    if not path.exists():
        raise DataError(
            f"{path}: file not found (set the data root with --data-root, data_root or "
            f"${DEFAULT_DATA_ROOT_ENV}; `gmc prepare-data --source hub` fills it)"
        )
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        frame = pd.read_parquet(path)
        rows = [
            (i + 1, {k: v.tolist() if hasattr(v, "tolist") else v for k, v in row.items()})  # numpy -> Python
            for i, row in enumerate(frame.to_dict(orient="records"))
        ]
    elif suffix == ".json":
        data = path.read_bytes()
        try:
            obj = json.loads(_decode(data, path, 1), parse_int=_parse_int)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
        if isinstance(obj, dict) and isinstance(obj.get("data"), list):
            obj = obj["data"]
        if not isinstance(obj, list):
            raise DataError(f"{path}: expected a JSON array of objects (or an object with a 'data' array)")
        rows = list(enumerate(obj, start=1))
    elif suffix in (".jsonl", ".ndjson"):
        rows = []
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                line = _decode(raw, path, lineno)
                if not line.strip():
                    continue
                try:
                    rows.append((lineno, json.loads(line, parse_int=_parse_int)))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: invalid JSON: {e.msg}") from None
    else:
        raise DataError(f"{path}: unsupported format {suffix!r}; use .jsonl, .json or .parquet")
    if not rows:
        raise DataError(f"{path}: the file holds no rows")
    for lineno, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
    return rows


def _decode(data: bytes, path: Path, first_line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x})") from None


def _parse_int(digits: str) -> int | str:
    """JSON integers; one too long for Python's int conversion is kept as its digits."""
    return int(digits) if len(digits) <= 4000 else digits


def _check_types(row: dict, where: str, lineno: int, name: str, problem_field: str, answer_field: str) -> None:
    if not isinstance(row[problem_field], str):
        raise DataError(
            f"{where}:{lineno}: field {problem_field!r} must be text, got "
            f"{type(row[problem_field]).__name__} (dataset {name!r})"
        )
    answer = row[answer_field]
    parts = answer if isinstance(answer, (list, tuple)) else [answer]
    for part in parts:
        if (
            isinstance(part, bool)
            or not isinstance(part, (str, int, float))
            or (isinstance(part, float) and not math.isfinite(part))
        ):
            raise DataError(
                f"{where}:{lineno}: field {answer_field!r} must be text, a finite number or a list of "
                f"them, got {part!r} (dataset {name!r})"
            )


def records_from_rows(
    rows,
    name: str,
    spec: DatasetSpec,
    where: str,
    problem_field: str,
    answer_field: str,
    answer_from_boxed: bool = False,
) -> list[Record]:
    """Normalise raw rows; missing fields raise, duplicates (same problem text) are reported."""
    out: list[Record] = []
    seen: dict[str, int] = {}
    duplicates = 0
    for lineno, row in rows:
        for fname in (problem_field, answer_field):
            if fname not in row or row[fname] is None or (isinstance(row[fname], str) and not row[fname].strip()):
                raise DataError(f"{where}:{lineno}: missing or empty field {fname!r} (dataset {name!r})")
        _check_types(row, where, lineno, name, problem_field, answer_field)
        answer = row[answer_field]
        if answer_from_boxed:
            answer = last_boxed(str(answer))
            if answer is None:
                raise DataError(f"{where}:{lineno}: no \\boxed{{}} answer in field {answer_field!r} (dataset {name!r})")
        rid = str(row[spec.id_field]) if spec.id_field and spec.id_field in row else f"{name}-{lineno}"
        problem = str(row[problem_field])
        key = " ".join(problem.split()).lower()
        if key in seen:
            duplicates += 1
            log.warning("%s:%d: duplicate problem (first at row %d) in dataset %r", where, lineno, seen[key], name)
        else:
            seen[key] = lineno
        meta = {k: v for k, v in row.items() if k not in (problem_field,)}
        out.append(Record(rid, problem, normalize_gold(answer), name, meta))
    if duplicates:
        log.warning("dataset %r: %d duplicate problem(s) kept (see warnings above)", name, duplicates)
    return out


def _spec(name: str) -> DatasetSpec:
    if name in BENCHMARKS:
        return BENCHMARKS[name]
    if name in TRAIN_SETS:
        return TRAIN_SETS[name]
    raise DataError(
        f"unknown dataset {name!r}; benchmarks: {sorted(BENCHMARKS)}, training sets: {sorted(TRAIN_SETS)}, "
        "or 'synthetic'"
    )


def load_dataset(
    name: str, source: str = "local", root: str | os.PathLike | None = None, limit: int | None = None
) -> list[Record]:
    """Load a registered benchmark or training set.

    ``source='local'`` reads ``<root>/<spec.local>``; ``source='hub'`` calls
    ``datasets.load_dataset(spec.hub_id, ...)`` (needs a network connection).
    """
    spec = _spec(name)
    if limit is not None and limit < 1:
        raise DataError(f"limit must be >= 1 (or None for every problem), got {limit}")
    if source == "local":
        path = data_root(root) / spec.local
        rows = read_rows(path)
        records = records_from_rows(rows, name, spec, str(path), spec.problem_field, spec.answer_field)
    elif source == "hub":
        records = _load_hub(name, spec)
    else:
        raise DataError(f"data source must be 'local' or 'hub', got {source!r} (setting data_source)")
    return records[:limit] if limit else records


def _load_hub(name: str, spec: DatasetSpec) -> list[Record]:
    try:
        import datasets

        ds = datasets.load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_split)
    except Exception as e:  # offline, unknown id, auth...
        raise DataError(
            f"could not load dataset {name!r} from the hub ({spec.hub_id}, split {spec.hub_split}): {e}. "
            "Offline? Set data_source: local and data_root to a folder holding the files."
        ) from e
    return hub_records(name, spec, ds)


def hub_records(name: str, spec: DatasetSpec, rows) -> list[Record]:
    """Records from the rows of a hub copy (a ``datasets.Dataset`` or any iterable of dicts),
    mapped through the spec's hub field names."""
    rows = list(enumerate(rows, start=1))
    where = f"hub:{spec.hub_id}[{spec.hub_split}]"
    return records_from_rows(
        rows,
        name,
        spec,
        where,
        spec.hub_problem_field or spec.problem_field,
        spec.hub_answer_field or spec.answer_field,
        spec.hub_answer_from_boxed,
    )


def load_file(
    path: str | os.PathLike,
    name: str | None = None,
    problem_field: str = "problem",
    answer_field: str = "answer",
    id_field: str | None = None,
) -> list[Record]:
    """Load any local JSONL/JSON/Parquet file of problems as records."""
    path = Path(path)
    spec = DatasetSpec(local=str(path), hub_id="", id_field=id_field)
    return records_from_rows(read_rows(path), name or path.stem, spec, str(path), problem_field, answer_field)


# ---------------------------------------------------------------------------------------------
# prompts

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PLAIN_TEMPLATE = "Problem: {problem}\nSolution:"


def format_prompt(tokenizer, problem: str, thinking: bool = False) -> str:
    """The model's chat template when it has one (a user turn with the problem and the
    step-by-step instruction; ``thinking`` toggles Qwen3's thinking mode), else
    :data:`PLAIN_TEMPLATE`."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": f"{problem}\n{INSTRUCTION}"}]
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
    return PLAIN_TEMPLATE.format(problem=problem)
