"""A run's provenance (``run.json``): a fresh run id, the git revision of the checkout, the
versions of the packages and of Python, and what the run adds (seed, device, threads); and the
name of a published bundle's record of the same (:data:`PROVENANCE`)."""

from __future__ import annotations

import platform
import subprocess
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

PROVENANCE = "provenance.json"
"""A published bundle's record of where it was made: commit, date, machine, threads, packages."""


def git_revision() -> str:
    """The checkout's commit, ``-dirty`` when it has uncommitted changes; ``unknown`` outside git."""
    try:
        root = Path(__file__).resolve().parents[2]
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


PACKAGES = (
    "gmc",
    "torch",
    "transformers",
    "tokenizers",
    "numpy",
    "math-verify",
    "mlflow",
    "bitsandbytes",
    "vllm",
    "ray",
)
"""The packages whose versions a run records."""


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def provenance(**extra: Any) -> dict[str, Any]:
    """``run.json`` of a new run: a fresh run id, the git revision, package and Python versions,
    and ``extra`` (seed, device, ...)."""
    return {
        "run_id": uuid.uuid4().hex,
        "git_revision": git_revision(),
        "packages": package_versions(),
        "python": platform.python_version(),
        **extra,
    }
