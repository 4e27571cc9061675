"""Data preparation: fill a local data root from the Hugging Face hub, or check one offline,
and write a manifest of what is there (method.md section 5).

:func:`prepare` takes registered set names (the MATH training split ``math`` and the six
benchmarks of :data:`gmc.tasks.datasets.BENCHMARKS`; ``synthetic`` is generated and has no file). With
``source='hub'`` each set is fetched with the hub loader of :mod:`gmc.tasks.datasets`, mapped to the
local layout (``problem`` and a normalised ``answer``, the original fields kept) by
:func:`local_rows`, and written as JSONL to ``<root>/<spec.local>``. Then, for either source,
every file is read back with the loader training and evaluation use, so a bad row fails here
naming its file and line, and the manifest records per set its file, rows, bytes and sha256.
:func:`check_manifest` compares a folder against an earlier manifest (same bytes, same rows).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from gmc.io import write_text
from gmc.tasks.datasets import (
    BENCHMARKS,
    TRAIN_SETS,
    DataError,
    DatasetSpec,
    Record,
    data_root,
    hub_records,
    load_dataset,
    load_file,
)

MANIFEST = "manifest.json"
"""The manifest's file name inside a data root."""
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def registered() -> list[str]:
    """Every registered set with a file: the training sets, then the benchmarks."""
    return [*TRAIN_SETS, *BENCHMARKS]


def _spec(name: str) -> DatasetSpec:
    spec = TRAIN_SETS.get(name) or BENCHMARKS.get(name)
    if spec is None:
        raise DataError(f"unknown dataset {name!r}; registered: {registered()} (or 'synthetic')")
    return spec


def local_rows(records: list[Record], spec: DatasetSpec) -> list[dict[str, Any]]:
    """Rows of the local layout: the original fields, with ``problem`` and the normalised
    ``answer`` under the spec's local field names."""
    return [{**r.meta, spec.problem_field: r.problem, spec.answer_field: r.answer} for r in records]


def write_jsonl(path: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    write_text(path, "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows))


def download(name: str, root: str | os.PathLike, rows=None) -> Path:
    """Fetch set ``name`` from the hub (or convert the given hub ``rows``, e.g. a local
    ``datasets.Dataset``) and write it under ``root``; returns the file."""
    spec = _spec(name)
    if rows is None:
        records = load_dataset(name, source="hub")
    else:
        records = hub_records(name, spec, rows)
    path = Path(root) / spec.local
    write_jsonl(path, local_rows(records, spec))
    return path


def sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(name: str, root: str | os.PathLike) -> dict[str, Any]:
    """One manifest entry: the set read back with the training/evaluation loader."""
    spec = _spec(name)
    path = Path(root) / spec.local
    rows = len(load_dataset(name, source="local", root=root))
    return {
        "file": spec.local,
        "rows": rows,
        "bytes": path.stat().st_size,
        "sha256": sha256(path),
        "hub_id": spec.hub_id,
    }


def prepare(names: list[str], root: str | os.PathLike | None = None, source: str = "local") -> dict[str, Any]:
    """Download (``source='hub'``) or check (``'local'``) the named sets under ``root``
    (default :func:`gmc.tasks.datasets.data_root`); returns the manifest."""
    if source not in ("local", "hub"):
        raise DataError(f"data source must be 'local' or 'hub', got {source!r} (setting data_source)")
    root = data_root(root)
    sets: dict[str, Any] = {}
    for name in dict.fromkeys(names):  # order kept, duplicates dropped
        if name == "synthetic":
            sets[name] = {"generated": True}
            continue
        if Path(name).suffix in FILE_SUFFIXES:  # a training file given by path
            sets[name] = {
                "file": name,
                "rows": len(load_file(name)),
                "bytes": Path(name).stat().st_size,
                "sha256": sha256(name),
            }
            continue
        if source == "hub":
            download(name, root)
        sets[name] = describe(name, root)
    return {"root": str(root.resolve()), "source": source, "sets": sets}


def check_manifest(manifest: dict[str, Any], root: str | os.PathLike | None = None) -> None:
    """Every file of ``manifest`` is under ``root`` with the same rows and checksum."""
    current = prepare([n for n, entry in manifest["sets"].items() if not entry.get("generated")], root)
    for name, entry in current["sets"].items():
        want = manifest["sets"][name]
        for key in ("rows", "sha256"):
            if entry[key] != want[key]:
                where = Path(entry["file"]) if name == entry["file"] else Path(current["root"]) / entry["file"]
                raise DataError(
                    f"{where}: {key} {entry[key]} differs from the manifest's {want[key]} (dataset {name!r})"
                )
