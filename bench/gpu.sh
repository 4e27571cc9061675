#!/usr/bin/env bash
# GPU check (installs nothing; one call; writes JSON to $OUT, default bench/results):
# the HF engine's lean Qwen3 decoder against the model's forward (bfloat16), the vLLM engine
# with weight sync and a few training steps with 8-bit AdamW on a random-init
# Qwen3-0.6B-sized model with the tiny tokenizer. Parts whose packages are missing are reported
# as skipped, not failed.
#   device run: bash bench/gpu.sh   (with results/models/tiny carried for the tokenizer)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 python3 bench/gpu_check.py "$OUT" 2>&1 | tee "$OUT/gpu.log"
