"""File input and output without heavy dependencies: every artefact is written to a temporary
file beside its target and renamed into place, so an interrupted job never leaves a file that
looks finished; JSONL metrics files are read tolerating a torn last line; nested configs are
flattened to dotted keys. Files and folders get the modes the umask allows (644 and 755
under umask 022), not the private ones of ``mkstemp``/``mkdtemp``. Imports nothing from the
rest of the package."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto ``path`` on success."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` whole."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_csv(frame, path: str | os.PathLike) -> None:
    """Write a pandas DataFrame as CSV, atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def save_figure(fig, path: str | os.PathLike, **kwargs: Any) -> None:
    """``fig.savefig`` through a temporary file; the format comes from ``path``'s suffix."""
    fmt = Path(path).suffix.lstrip(".")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, bbox_inches="tight", **kwargs)


def read_jsonl(path: str | Path) -> list[dict]:
    """Lines of a JSONL file; a torn last line (a crash mid-write) is ignored."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    with p.open() as fh:
        for line in fh:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def truncate_jsonl(path: Path, step: int, key: str = "step") -> None:
    """Keep the lines whose ``key`` is below ``step`` (what a checkpoint at ``step`` had seen)."""
    rows = [r for r in read_jsonl(path) if r[key] < step]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = v
    return out
