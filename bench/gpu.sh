#!/usr/bin/env bash
# GPU check (installs nothing; one call of under 8 minutes; JSON written to $OUT after each part,
# default bench/results): every estimator on CUDA (the regression check), then a random Qwen3-4B
# shape built on the GPU: the update's peak per budget with and without a stand-in for vLLM
# against the memory plan, its MFU with causal against masked attention, log-prob identity on
# CUDA, the top kernels of one micro-batch; vLLM when installed (bench/gpu_check.py says more).
#   device run: bash bench/gpu.sh   (with results/models/tiny/seed~0 carried for the tokenizer)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 python3 bench/gpu_check.py "$OUT" 2>&1 | tee "$OUT/gpu.log"
