#!/usr/bin/env bash
# One call on the H200 machine: GPU tests, the tiny CPU-reference check, PyTorch parity
# (tiny and llama-1b) and the llama-8b decode bench. Expects the files that
# tools/gpu/stage.sh puts in .gpu/ (binaries built on the CPU machine). Logs and JSON go
# to $OUT (or /tmp/gpu-out): test logs and JSON only, since few files come back; tee the
# whole output for the rest. STAGES picks a subset: "probe kernels tests tiny parity bench ncu serve".
# GENSLOT_ATTN_KERNEL=simt|tc picks the attention kernel (default tc); BENCH_KERNELS lists the
# kernels the bench stage times one after the other.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
G=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"probe kernels tests tiny parity bench serve"}
status=0
stage() { echo "=== $1 ($(date -u +%H:%M:%S))"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has probe; then
  stage probe
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  "$G/genslot-gpu" probe || status=1
fi
if has kernels; then
  # Registers, shared memory and spills of every kernel, from the same source NVRTC compiles.
  stage kernels
  cat "$G"/kernels/common.cuh "$G"/kernels/init.cu "$G"/kernels/layers.cu "$G"/kernels/attention.cu \
    "$G"/kernels/attention_tc.cu > /tmp/genslot-kernels.cu
  /usr/local/cuda/bin/nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -o /tmp/genslot-kernels.cubin \
    /tmp/genslot-kernels.cu 2>&1 | grep -A1 "paged_attn_tc_d128_g4\|paged_attn_d128_g4\|paged_attn_tc_d64_g4" || status=1
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
  for kern in ${BENCH_KERNELS:-tc}; do
    echo "attention kernel: $kern"
    GENSLOT_ATTN_KERNEL=$kern "$G/genslot-gpu" check-tiny 2>&1 || status=1
  done
fi
if has parity; then
  # PARITY_INITS: hf (transformers' default init) and/or scaled (see parity.py --init);
  # PARITY_KERNELS: the attention kernels compared against each reference.
  for shape in ${PARITY_SHAPES:-tiny llama-1b}; do
    for init in ${PARITY_INITS:-hf}; do
      stage "parity $shape (init $init)"
      W=/tmp/parity-$shape-$init
      python3 "$G/parity.py" --shape "$shape" --init "$init" --out "$W" 2>&1 | grep -v "Writing model" \
        || { status=1; continue; }
      for kern in ${PARITY_KERNELS:-tc}; do
        echo "attention kernel: $kern"
        GENSLOT_ATTN_KERNEL=$kern "$G/genslot-gpu" parity --weights "$W/model" --ref "$W/ref" \
          --json "$OUT/parity-$shape-$init-$kern.json" ${PARITY_ARGS:-} 2>&1 | grep -v "^ *[0-9]*: \|Stack backtrace" \
          || status=1
      done
    done
  done
fi
if has bench; then
  for kern in ${BENCH_KERNELS:-tc}; do
    stage "bench ($kern attention)"
    GENSLOT_ATTN_KERNEL=$kern "$G/genslot-gpu" bench --shape llama-8b \
      --json "$OUT/bench-llama-8b-$kern.json" ${BENCH_ARGS:-} 2>&1 || status=1
    # A small model shows what graph replay saves on launch overhead.
    GENSLOT_ATTN_KERNEL=$kern "$G/genslot-gpu" bench --shape llama-1b --batches 1,32 --contexts 4096 \
      --json "$OUT/bench-llama-1b-$kern.json" 2>&1 || status=1
  done
fi
if has ncu; then
  # Hardware counters of the attention kernel at batch 128, context 4096 (one launch each).
  stage ncu
  for kern in ${BENCH_KERNELS:-tc}; do
    GENSLOT_ATTN_KERNEL=$kern /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:paged_attn \
      --launch-skip 40 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section WarpStateStats --section LaunchStats \
      "$G/genslot-gpu" bench --shape llama-8b --batches 128 --contexts 4096 --iters 2 --kv-fraction 0.05 2>&1 \
      | tee "$OUT/ncu-attn-$kern.txt" | grep -E "Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Compute \(SM\)|Stall|Theoretical Occ|Block Limit" || status=1
  done
fi
if has serve; then
  # genslot serve on the CUDA backend with preemption on, checked end to end over loopback.
  stage serve
  "$G/genslot" serve --config "$G/cuda-llama-1b.yaml" --port 18000 > "$OUT/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    curl -sf http://127.0.0.1:18000/health > /dev/null && break
    sleep 1
  done
  python3 "$G/serve_check.py" http://127.0.0.1:18000 2>&1 | tee "$OUT/serve_check.txt" || status=1
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
fi
stage "done status=$status"
exit $status
