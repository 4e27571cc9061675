"""Shared helpers of the benchmarks: timing, peak memory in a child process, JSON output."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def timeit(fn, repeat: int = 5, warmup: int = 1) -> dict:
    """Median and min wall time of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeat": repeat}


def peak_rss_mb(code: str) -> float:
    """Peak resident memory (MB) of a fresh Python process running ``code``."""
    probe = "\nimport resource\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", code + probe], check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024.0


def write_result(name: str, payload: dict) -> Path:
    from gmc.io import write_json

    payload = {"benchmark": name, "machine": platform.machine(), "python": platform.python_version(),
               "torch": torch.__version__, "threads": torch.get_num_threads(), **payload}
    path = RESULTS / f"{name}.json"
    write_json(path, payload)
    print(json.dumps(payload, indent=2))
    return path
