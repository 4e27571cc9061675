"""The GPU check's harness (bench/gpu.sh, bench/gpu_check.py) and the FLOP counts of its MFU
(bench/update.py), on any machine: what runs on the GPU itself is checked where one is lent."""

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def gpu_sh(out: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(BENCH / "gpu.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GMC_INSTALL": "0", **env},
    )


@pytest.fixture
def bench_modules(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", str(tmp_path)])
    for name in ("gpu_check", "update", "common"):
        sys.modules.pop(name, None)
    yield
    for name in ("gpu_check", "update", "common"):
        sys.modules.pop(name, None)


def test_the_check_refuses_to_start_without_vllm(tmp_path):
    """On a real check (not the small CPU one) a missing vLLM stops it before any part runs."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    run = gpu_sh(tmp_path)
    assert run.returncode == 1 and "the GPU check needs vllm" in run.stderr + run.stdout
    assert not list(tmp_path.glob("gpu.*.json"))


def test_a_part_that_does_not_fit_the_window_is_skipped_and_merged_as_such(tmp_path):
    (tmp_path / "gpu.setup.json").write_text('{"finished": true, "from": "an earlier check"}')
    run = gpu_sh(tmp_path, GMC_GPU_CHECK_SMALL="1", GMC_GPU_CHECK_WINDOW="0")
    assert run.returncode == 0, run.stderr
    merged = json.loads((tmp_path / "gpu.json").read_text())
    parts = [
        line.split()[0]
        for line in subprocess.run(
            [sys.executable, str(BENCH / "gpu_check.py"), str(tmp_path), "--parts"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    ]
    assert len(parts) == 9 and parts[0] == "setup"
    for part in parts:
        assert merged[part]["finished"] is False and "left of the 0 s window" in merged[part]["skipped"], part


def test_a_part_writes_each_measurement_as_it_makes_it(bench_modules, tmp_path):
    import gpu_check

    rec = gpu_check.Record("probe")
    path = tmp_path / "gpu.probe.json"
    assert json.loads(path.read_text()) == {"finished": False}
    rec["first"] = 1.5
    assert json.loads(path.read_text()) == {"finished": False, "first": 1.5}
    rec.update(second={"a": 2})
    assert json.loads(path.read_text())["second"] == {"a": 2}


def test_the_limits_leave_the_window_ninety_seconds(bench_modules):
    import gpu_check

    assert sum(limit for _, limit in gpu_check.PARTS.values()) + 6 * len(gpu_check.PARTS) <= 600 - 90


def test_attention_flops_and_the_parameters_that_multiply(bench_modules):
    import update

    from gmc.policy.memory import ModelShape

    shape = ModelShape(
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        vocab_size=32,
        tie_word_embeddings=True,
    )
    # a row of 3 tokens: 1 + 2 + 3 = 6 (query, key) pairs, each 2 FLOPs for the score and 2 for the sum,
    # per layer and per head dimension: 4 x (2 layers x 2 heads x 4) x 6
    assert update.attention_forward_flops(shape, [3]) == 4 * 16 * 6
    assert update.attention_forward_flops(shape, [3, 1]) == 4 * 16 * 7
    assert update.spec_tflops("NVIDIA H200") == 989.4 and update.spec_tflops("NVIDIA H100 PCIe") == 756.0
    assert update.spec_tflops("Tesla T4") is None
    from common import random_qwen3

    tied = random_qwen3(shape, "cpu")
    total = sum(p.numel() for p in tied.parameters())
    assert update.matmul_parameters(tied, shape) == total
    untied_shape = dataclasses.replace(shape, tie_word_embeddings=False)
    untied = random_qwen3(untied_shape, "cpu")
    assert update.matmul_parameters(untied, untied_shape) == sum(p.numel() for p in untied.parameters()) - 32 * 8
