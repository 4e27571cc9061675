#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py says what each part measures), self-contained for a fresh
# clone on a bare GPU machine:
#
# 1. install, untimed: CUDA torch (GMC_TORCH, default torch==2.14.0), then the project with its
#    GPU extra (GMC_EXTRAS, default gpu: vLLM), from the wheels carried beside the clone
#    (GMC_WHEELS, default ./wheels) when that folder exists, else from the package index;
#    GMC_INSTALL=0 uses the environment as it is. The check then refuses to start, naming what is
#    missing, without torch, transformers, pydantic, math-verify, bitsandbytes or (on a GPU)
#    vLLM: a check that silently skips vLLM or measures fp32 AdamW proves nothing.
# 2. the check, timed: every part in a process of its own under its own time limit
#    (bench/gpu_check.py --parts), so a part that fails, hangs or breaks CUDA costs only itself;
#    a part that no longer fits the ten-minute window with 90 s to spare is skipped, and says so.
#    Each part writes every measurement as it makes it ($OUT/gpu.PART.json); the merge gathers
#    them into $OUT/gpu.json (default bench/results).
#
#   device run: bash bench/gpu.sh
#   on a CPU:   GMC_GPU_CHECK_SMALL=1 GMC_TORCH=torch==2.13.0 GMC_EXTRAS=dev bash bench/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results}"
WHEELS="${GMC_WHEELS:-wheels}"
TORCH="${GMC_TORCH:-torch==2.14.0}"
EXTRAS="${GMC_EXTRAS:-gpu}"
PYTHON="${PYTHON:-python3}"
# seconds the timed parts may take: ten minutes less 90 s (three times that for the small shapes on a CPU)
WINDOW="${GMC_GPU_CHECK_WINDOW:-$([ "${GMC_GPU_CHECK_SMALL:-0}" = 1 ] && echo 1530 || echo 510)}"
mkdir -p "$OUT"
rm -f "$OUT"/gpu.*.json  # no part's result from an earlier check passes for this one's
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
: > "$OUT/gpu.log"
if [ "${GMC_INSTALL:-1}" != 0 ]; then
  if [ -d "$WHEELS" ]; then from=(--no-index --find-links "$WHEELS"); where="the wheels in $WHEELS"
  else from=(); where="the package index"; fi
  start=$(date +%s)
  echo "install: $TORCH, then .[$EXTRAS], from $where" | tee -a "$OUT/gpu.log"
  if ! { "$PYTHON" -m pip install -q "${from[@]}" "$TORCH" \
         && "$PYTHON" -m pip install -q "${from[@]}" -e ".[$EXTRAS]"; } >> "$OUT/gpu.log" 2>&1; then
    tail -5 "$OUT/gpu.log"
    echo "the install failed (the lines above; all of it in $OUT/gpu.log): nothing was checked" >&2
    exit 1
  fi
  echo "install: done in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu.log"
fi
"$PYTHON" - <<'PY' 2>&1 | tee -a "$OUT/gpu.log" || exit 1
import importlib.util
import os
import sys
needed = ["torch", "transformers", "pydantic", "math_verify", "bitsandbytes"]
if os.environ.get("GMC_GPU_CHECK_SMALL") != "1":  # the CPU check of this script runs without vLLM
    needed.append("vllm")
missing = [name for name in needed if importlib.util.find_spec(name) is None]
print(f"packages: {', '.join(needed)}: " + (f"missing {', '.join(missing)}" if missing else "all present"))
sys.exit(f"the GPU check needs {', '.join(missing)}: install as bench/gpu.sh says" if missing else 0)
PY
check_start=$(date +%s)
"$PYTHON" bench/gpu_check.py "$OUT" --parts | while read -r part limit; do
  left=$(( WINDOW - ($(date +%s) - check_start) ))
  if [ "$limit" -gt "$left" ]; then
    why="its limit $limit s, $left s left of the $WINDOW s window"
    echo "== $part: skipped ($why)" | tee -a "$OUT/gpu.log"
    printf '{"finished": false, "skipped": "%s"}\n' "$why" > "$OUT/gpu.$part.json"
    continue
  fi
  start=$(date +%s)
  timeout --signal=TERM --kill-after=5 "$limit" "$PYTHON" bench/gpu_check.py "$OUT" "$part" >> "$OUT/gpu.log" 2>&1
  echo "== $part: exit $? after $(( $(date +%s) - start )) s (limit $limit s)" | tee -a "$OUT/gpu.log"
done
"$PYTHON" bench/gpu_check.py "$OUT" --merge > /dev/null
echo "merged: $OUT/gpu.json (the check took $(( $(date +%s) - check_start )) s)"
