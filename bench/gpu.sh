#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py says what each part measures), self-contained for a fresh
# clone on a GPU machine: it installs the project as the README's GPU line does, from wheels
# carried beside the clone when the machine has no network (GMC_WHEELS, default ./wheels; what
# the machine already has is used as it is), builds what it reads (the tiny model), then runs
# every part in a process of its own under its own time limit (bench/gpu_check.py --parts), so
# a part that fails, hangs or breaks CUDA costs only itself. Within ten minutes on one GPU.
# JSON per part and merged into $OUT/gpu.json (default bench/results).
#   device run: bash bench/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results}"
WHEELS="${GMC_WHEELS:-wheels}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -d "$WHEELS" ]; then  # make install TORCH=torch==2.14.0 EXTRAS=dev,gpu, offline
  "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" -e ".[gpu]" 2>&1 | tail -3 || echo "install from $WHEELS failed"
fi
"$PYTHON" - <<'PY' 2>&1 | tee "$OUT/gpu.log" || exit 1
import importlib.util
import sys
found = {name: importlib.util.find_spec(name) is not None
         for name in ("torch", "transformers", "bitsandbytes", "vllm", "math_verify")}
print(", ".join(f"{name}: {'present' if ok else 'missing'}" for name, ok in found.items()))
sys.exit(0 if found["torch"] and found["transformers"] else "torch and transformers are needed: install as the README says")
PY
"$PYTHON" bench/gpu_check.py "$OUT" --parts | while read -r part limit; do
  start=$(date +%s)
  timeout --signal=TERM --kill-after=10 "$limit" "$PYTHON" bench/gpu_check.py "$OUT" "$part" >> "$OUT/gpu.log" 2>&1
  echo "== $part: exit $? after $(( $(date +%s) - start )) s (limit $limit s)" | tee -a "$OUT/gpu.log"
done
"$PYTHON" bench/gpu_check.py "$OUT" --merge > /dev/null
echo "merged: $OUT/gpu.json"
