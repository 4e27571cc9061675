"""Shared helpers of the benchmarks: interleaved timing, peak memory in a child process, JSON output."""

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


def random_qwen3(shape, device: str, checkpointing: bool = False):
    """A randomly initialised Qwen3 of ``shape`` (a :class:`gmc.policy.memory.ModelShape`), built on
    ``device`` in float32 (no weights travel), in training mode; with ``checkpointing``, gradient
    checkpointing on and no KV cache."""
    from gmc.policy.build import Qwen3Shape, qwen3_model

    cfg = Qwen3Shape(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_layers=shape.num_hidden_layers,
        num_heads=shape.num_attention_heads,
        num_kv_heads=shape.num_key_value_heads,
    )
    with torch.device(device):
        model = qwen3_model(
            cfg, shape.vocab_size, head_dim=shape.head_dim, tie_word_embeddings=shape.tie_word_embeddings
        )
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    return model.train()


def interleaved(fns: dict, rounds: int = 9, warmup: int = 1) -> dict[str, dict]:
    """Median and min wall time of each ``fn()``, run in alternation (one call of each per round,
    in rotating order) so that every variant sees the same machine state."""
    names = list(fns)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t)
    return {name: {"median_s": statistics.median(ts), "min_s": min(ts), "repeat": rounds} for name, ts in times.items()}


def peak_rss_mb(code: str) -> float:
    """Peak resident memory (MB) of a fresh Python process running ``code``."""
    probe = "\nimport resource\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", code + probe], check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024.0


def write_result(name: str, payload: dict) -> Path:
    from gmc.io import write_json

    payload = {
        "benchmark": name,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **payload,
    }
    path = RESULTS / f"{name}.json"
    write_json(path, payload)
    print(json.dumps(payload, indent=2))
    return path
