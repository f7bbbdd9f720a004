#!/usr/bin/env bash
# On the two-GPU H200 machine (nvidia-h200-x2), from the files stage_tp.sh staged: the NCCL
# tests, the all-reduce timings, the TP=2 roofline for llama-8b at batch 1/64/128 x context
# 4k/32k, and the rank check of a served run (model backend, 2 ranks). JSON and logs go to
# $OUT (default /tmp/gpu-out). NVLink multicast stays off on that machine.
# STAGES picks a subset of: "tests allreduce roofline serve".
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
G=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"tests allreduce roofline serve"}
PORT=${PORT:-8000}
status=0
stage() { echo "=== $1 ($(date -u +%H:%M:%S))"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has tests; then
  stage "gpu_tp tests"
  nvidia-smi topo -m || true
  "$G/gpu_tp" --test-threads=1 --nocapture 2>&1 | tee "$OUT/gpu_tp.log" \
    | grep -E "^test |test result|panicked|skipping" || status=1
fi
if has allreduce; then
  stage "all-reduce timings"
  "$G/genslot-tp" allreduce --ranks 2 --json "$OUT/allreduce-tp2.json" || status=1
fi
if has roofline; then
  stage "TP=2 roofline, llama-8b"
  "$G/genslot-tp" roofline --shape llama-8b --ranks 2 --batches 1,64,128 --contexts 4096,32768 \
    --json "$OUT/roofline-tp2.json" || status=1
fi
if has serve; then
  # The decision-hash check in a served run (timing-model backend, 2 ranks): it must have
  # checked every pass and reported no failure.
  stage "serve with 2 ranks (rank check)"
  "$G/genslot" serve --config "$G/tp2-model.yaml" --port "$PORT" > "$OUT/serve-tp2.log" 2>&1 &
  pid=$!
  for _ in $(seq 50); do curl -sf localhost:$PORT/health > /dev/null && break; sleep 0.2; done
  clients=()
  for _ in $(seq 16); do
    curl -s localhost:$PORT/v1/completions -H 'content-type: application/json' \
      -d '{"prompt":"hello","max_tokens":64}' > /dev/null &
    clients+=($!)
  done
  wait "${clients[@]}"
  curl -s localhost:$PORT/debug/actors | python3 -c '
import json, sys
r = json.load(sys.stdin)["ranks"]
print("ranks:", r)
sys.exit(0 if r["failure"] is None and r["passes_checked"] > 0 else 1)' || status=1
  kill "$pid"; wait "$pid" 2>/dev/null
fi
exit $status
