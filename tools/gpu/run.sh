#!/usr/bin/env bash
# One call on the H200 machine: GPU tests, the tiny CPU-reference check, PyTorch parity
# (tiny and llama-1b) and the llama-8b decode bench. Expects the files that
# tools/gpu/stage.sh puts in .gpu/ (binaries built on the CPU machine). Logs and JSON go
# to $OUT (or /tmp/gpu-out): test logs and JSON only, since few files come back; tee the
# whole output for the rest. STAGES picks a subset: "probe tests tiny parity bench".
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
G=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"probe tests tiny parity bench"}
status=0
stage() { echo "=== $1 ($(date -u +%H:%M:%S))"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has probe; then
  stage probe
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  "$G/genslot-gpu" probe || status=1
fi
if has tests; then
  stage tests
  for t in "$G"/gpu_*; do
    [ -x "$t" ] || continue
    "$t" --test-threads=1 2>&1 | tee "$OUT/$(basename "$t").log" | grep -E "^test |test result|panicked|skipping" || status=1
  done
fi
if has tiny; then
  stage check-tiny
  "$G/genslot-gpu" check-tiny 2>&1 || status=1
fi
if has parity; then
  for shape in ${PARITY_SHAPES:-tiny llama-1b}; do
    stage "parity $shape"
    W=/tmp/parity-$shape
    python3 "$G/parity.py" --shape "$shape" --out "$W" 2>&1 | grep -v "Writing model" || { status=1; continue; }
    "$G/genslot-gpu" parity --weights "$W/model" --ref "$W/ref" --json "$OUT/parity-$shape.json" ${PARITY_ARGS:-} \
      2>&1 || status=1
  done
fi
if has bench; then
  stage bench
  "$G/genslot-gpu" bench --shape llama-8b --json "$OUT/bench-llama-8b.json" ${BENCH_ARGS:-} \
    2>&1 || status=1
  # A small model shows what graph replay saves on launch overhead.
  "$G/genslot-gpu" bench --shape llama-1b --batches 1,32 --contexts 4096 \
    --json "$OUT/bench-llama-1b.json" ${BENCH_ARGS:-} 2>&1 || status=1
fi
stage "done status=$status"
exit $status
