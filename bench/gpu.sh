#!/usr/bin/env bash
# GPU check (installs nothing; one call; writes JSON to $OUT, default bench/results): every
# estimator trained 3 stale steps on CUDA (tiny model, bfloat16 over float32 masters,
# checkpointing, micro-batches; the device regression check), one update at the paper's batch
# shape within the preset's token budget on a random-init Qwen3-0.6B-sized model (peak memory,
# step time), the HF engine's lean decoder against the model's forward, the vLLM engine with
# weight sync. Parts whose packages are missing (bitsandbytes, vLLM) fall back or are skipped.
#   device run: bash bench/gpu.sh   (with results/models/tiny carried for the tokenizer)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 python3 bench/gpu_check.py "$OUT" 2>&1 | tee "$OUT/gpu.log"
