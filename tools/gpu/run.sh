#!/usr/bin/env bash
# One call on the H200 machine: GPU tests, the CPU-reference checks (tiny, SmolLM2), parity
# against PyTorch (tiny, tiny-hybrid, llama-1b, SmolLM2), the served SmolLM2 check, the
# llama-8b decode bench and the served llama-1b check. Expects the files tools/gpu/stage.sh
# puts in .gpu/ (binaries built on the CPU machine) and, for the SmolLM2 stages, the GGUF that
# tools/gpu/stage_model.sh assembled (GGUF, default .gpu-model/ beside .gpu/; its stages
# skip with a message without it). STAGES picks a subset of
#   "probe kernels tests tiny smollm2 parity serve-smollm2 gemv bench sampler serve retained ncu".
# TEST_FILTER names the tests to run (the test binaries' filter; default all).
# GENSLOT_ATTN_KERNEL=simt|tc picks the attention kernel (default tc); BENCH_KERNELS lists the
# kernels the bench stage times one after the other, and BENCH_VARIANTS the launch options
# (src/gpu/cuda/step_options.rs) it times for each: words of comma-joined VAR=VALUE settings,
# `default` for none, `plain` for every option off, `base` for none on genslot-gpu-base (a
# build of another commit that stage.sh staged from BASE_BIN) (default "default plain"); PARITY_SHAPES
# the parity models.
# Logs and JSON go to a work folder, then into $OUT/gpu-results.tar.gz with a summary
# ($OUT/summary.txt): only a few files come back from a call.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
G=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$G/.." && pwd)
OUT=${OUT:-/tmp/gpu-out}
W=$(mktemp -d /tmp/genslot-run.XXXX)
mkdir -p "$OUT"
STAGES=${STAGES:-"probe kernels tests tiny smollm2 parity serve-smollm2 bench sampler serve retained"}
GGUF=${GGUF:-$ROOT/.gpu-model/SmolLM2-135M-Instruct.Q4_1.gguf}
status=0
fail() { echo "FAILED: $1" | tee -a "$W/summary.txt"; status=1; }
stage() { echo "=== $1 ($(date -u +%H:%M:%S))" | tee -a "$W/summary.txt"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
have_gguf() { [ -f "$GGUF" ] || { echo "skipping: no $GGUF (tools/gpu/stage_model.sh)" | tee -a "$W/summary.txt"; return 1; }; }
[ -f "$GGUF" ] && export GENSLOT_SMOLLM2_GGUF="$GGUF"

# Starts `genslot serve` on CONFIG at PORT from the repository root (the config's model path is
# relative to it), runs CHECK URL JSON, stops the server.
serve_and_check() {
  local name=$1 config=$2 port=$3 check=$4
  (cd "$ROOT" && exec "$G/genslot" serve --config "$config" --port "$port") > "$W/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 180); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  # A server that exited (a refused config, say) fails now with its log, rather than after
  # the check script's own wait for health.
  if ! kill -0 "$pid" 2>/dev/null; then
    fail "serve $name: the server exited"
    tail -20 "$W/serve-$name.log"
    return
  fi
  python3 "$check" "http://127.0.0.1:$port" "$W/serve-$name.json" 2>&1 | tee "$W/serve-$name.txt" \
    || { fail "serve $name"; tail -20 "$W/serve-$name.log"; }
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

# nvidia-smi sampling in the background: smi_start FILE, then smi_stop FILE prints a summary.
SMI_PID=
smi_start() {
  local reasons=clocks_event_reasons.active
  nvidia-smi --query-gpu=$reasons --format=csv > /dev/null 2>&1 || reasons=clocks_throttle_reasons.active
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
    --format=csv,noheader,nounits -lms 200 > "$1" 2>/dev/null &
  SMI_PID=$!
}
smi_stop() {
  [ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null && wait "$SMI_PID" 2>/dev/null
  SMI_PID=
  python3 - "$1" <<'PY'
import sys, collections
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 5]
busy = [r for r in rows if float(r[3]) > 200]  # samples under load (power above 200 W)
if not busy:
    print("smi: no samples under load"); sys.exit()
sm = sorted(float(r[1]) for r in busy); mem = sorted(float(r[2]) for r in busy)
pw = sorted(float(r[3]) for r in busy); temp = max(float(r[4]) for r in busy)
why = collections.Counter(r[5].strip() for r in busy).most_common(3)
print(f"smi: {len(busy)} samples under load: SM clock min {sm[0]:.0f} median {sm[len(sm)//2]:.0f} MHz, "
      f"memory clock {mem[len(mem)//2]:.0f} MHz, power median {pw[len(pw)//2]:.0f} max {pw[-1]:.0f} W, "
      f"max {temp:.0f} C, clock-limit reasons {why}")
PY
}

if has probe; then
  stage probe
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  "$G/genslot-gpu" probe || fail probe
fi
if has kernels; then
  # Registers, shared memory and spills of every kernel, compiled by NVRTC as the backend does.
  stage kernels
  "$G/genslot-gpu" kernels --shape llama-8b --ptxas 2>&1 | tee "$W/kernels-llama-8b.txt" || fail kernels
  [ -f "$GGUF" ] && { "$G/genslot-gpu" kernels --model "$GGUF" --ptxas 2>&1 | grep attn || fail kernels; }
fi
if has tests; then
  stage tests
  for t in "$G"/gpu_*; do
    [ -x "$t" ] || continue
    "$t" ${TEST_FILTER:-} --test-threads=1 --nocapture 2>&1 | tee "$W/$(basename "$t").log" \
      | grep -E "^test |test result|panicked|skipping|vs CPU|equal" || fail "$(basename "$t")"
  done
fi
if has tiny; then
  stage check-tiny
  for kern in ${BENCH_KERNELS:-tc}; do
    echo "attention kernel: $kern"
    GENSLOT_ATTN_KERNEL=$kern "$G/genslot-gpu" check-tiny 2>&1 || fail "check-tiny $kern"
  done
fi
if has smollm2 && have_gguf; then
  # The chat answer on the GPU against the f32 CPU reference: >= 32 equal greedy tokens.
  stage "check-model smollm2"
  "$G/genslot-gpu" check-model --model "$GGUF" --steps 32 --expect Paris \
    --json "$W/check-smollm2.json" 2>&1 | tail -40 || fail "check-model smollm2"
fi
if has parity; then
  # PARITY_INITS: hf (transformers' default init) and/or scaled (see parity.py --init);
  # PARITY_KERNELS: the attention kernels compared against each reference. The hybrid
  # shapes (tiny-hybrid, llama-hybrid-1b) take PyTorch from hybrid_model.py.
  tables=()
  for shape in ${PARITY_SHAPES:-tiny tiny-hybrid llama-1b smollm2}; do
    for init in ${PARITY_INITS:-hf}; do
      stage "parity $shape (init $init)"
      P=/tmp/parity-$shape-$init
      if [ "$shape" = smollm2 ]; then
        have_gguf || continue
        "$G/genslot-gpu" export-hf --model "$GGUF" --out /tmp/smollm2-hf || { fail "export smollm2"; continue; }
        src=(--checkpoint /tmp/smollm2-hf)
      else
        src=(--shape "$shape" --init "$init")
      fi
      python3 "$G/parity.py" "${src[@]}" --out "$P" 2>&1 | grep -v "Writing model" \
        || { fail "parity.py $shape"; continue; }
      for kern in ${PARITY_KERNELS:-tc}; do
        echo "attention kernel: $kern"
        j="$W/parity-$shape-$init-$kern.json"
        GENSLOT_ATTN_KERNEL=$kern "$G/genslot-gpu" parity --weights "$P/model" --ref "$P/ref" \
          --json "$j" ${PARITY_ARGS:-} 2>&1 | grep -v "^ *[0-9]*: \|Stack backtrace" \
          || fail "parity $shape $kern"
        [ -f "$j" ] && tables+=("$j")
      done
    done
  done
  [ ${#tables[@]} -gt 0 ] && python3 "$G/parity_table.py" "${tables[@]}" | tee -a "$W/summary.txt"
fi
if has serve-smollm2 && have_gguf; then
  # The capital of France over HTTP (streaming and not), paused-vs-solo identical outputs,
  # seeded sampling reproducible.
  stage "serve smollm2"
  serve_and_check smollm2 "$G/cuda-smollm2.yaml" 18001 "$G/serve_real.py"
fi
if has gemv; then
  # Each llama-8b weight product at 1-4 rows on cuBLAS and on the GEMV kernels: outputs
  # compared (the command fails past 1e-2), times side by side, with and without PDL.
  for pdl in 0 1; do
    stage "gemv (PDL $pdl)"
    GENSLOT_PDL=$pdl "$G/genslot-gpu" gemv --shape llama-8b --json "$W/gemv-llama-8b-pdl$pdl.json" \
      2>&1 | tee -a "$W/summary.txt" || fail "gemv PDL $pdl"
  done
fi
if has sampler; then
  # The device sampler alone, each mode on logits of several spreads (nucleus sizes from a
  # flat row to a few tokens), every token checked against the host sampler.
  stage "sampler"
  "$G/genslot-gpu" sampler --shape llama-8b --json "$W/sampler-llama-8b.json" 2>&1 \
    | tee -a "$W/summary.txt" || fail "sampler"
fi
if has bench; then
  for kern in ${BENCH_KERNELS:-tc}; do
    for v in ${BENCH_VARIANTS:-default plain}; do
      settings=() bin="$G/genslot-gpu"
      case $v in
        default) ;;
        plain) settings=(GENSLOT_LAUNCH=plain) ;;
        base) bin="$G/genslot-gpu-base"
          [ -x "$bin" ] || { fail "bench base: no genslot-gpu-base staged"; continue; } ;;
        *) IFS=, read -ra settings <<< "$v" ;;
      esac
      tag=$(echo "$v" | tr -c 'A-Za-z0-9\n' '-' | sed 's/GENSLOT-//g')
      # A variant listed again (rounds in turn: "default plain default plain") keeps its own
      # files: the second is TAG-2, the third TAG-3.
      base=$tag n=1
      while [ -e "$W/bench-llama-8b-$kern-$tag.json" ]; do n=$((n + 1)); tag=$base-$n; done
      stage "bench ($kern attention, $v)"
      # Clocks, power and the driver's clock-limit reasons while it runs (every 200 ms).
      smi_start "$W/smi-llama-8b-$kern-$tag.csv"
      env "${settings[@]}" GENSLOT_ATTN_KERNEL=$kern "$bin" bench --shape llama-8b \
        --json "$W/bench-llama-8b-$kern-$tag.json" ${BENCH_ARGS:-} 2>&1 | tee -a "$W/summary.txt" \
        || fail "bench $kern $v"
      smi_stop "$W/smi-llama-8b-$kern-$tag.csv" | tee -a "$W/summary.txt"
      # A small model shows what graph replay saves on launch overhead (BENCH_SMALL=0: not).
      [ "${BENCH_SMALL:-1}" = 0 ] || env "${settings[@]}" GENSLOT_ATTN_KERNEL=$kern "$bin" bench --shape llama-1b \
        --batches 1,32 --contexts 4096 --json "$W/bench-llama-1b-$kern-$tag.json" 2>&1 \
        | tee -a "$W/summary.txt" || fail "bench llama-1b $kern $v"
    done
  done
fi
if has ncu; then
  # One eager llama-8b step per batch (4k context) under ncu: kernel time by role
  # (tools/gpu/ncu_summary.py). NCU_ATTN=1 adds the attention kernel's sections.
  stage ncu
  nb=${NCU_BATCHES:-1,64,128}
  # NCU_STEP=0: only the attention sections below.
  [ "${NCU_STEP:-1}" = 0 ] || /usr/local/cuda/bin/ncu --clock-control none --profile-from-start off \
    --csv --page raw --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    "$G/genslot-gpu" bench --shape llama-8b --batches "$nb" --contexts 4096 --iters 2 \
    --kv-fraction 0.6 --profile > "$W/ncu-step.csv" 2> "$W/ncu-step.log" || fail "ncu step"
  [ "${NCU_STEP:-1}" = 0 ] || python3 "$G/ncu_summary.py" "$W/ncu-step.csv" $(echo "$nb" | sed 's/\([0-9]*\)/b\1/g; s/,/ /g') \
    --json "$W/ncu-step.json" 2>&1 | tee -a "$W/summary.txt" || fail "ncu summary"
  if [ -n "${NCU_ATTN:-}" ]; then
    # One attention launch (layer 9) of the profiled step per batch in NCU_ATTN_BATCHES, with
    # the stall reasons (WarpStateStats), issue (SchedulerStats) and the SASS lines that stall
    # most (SourceCounters); the KV cache as large as in the step profile (no aliased pages).
    # NCU_ENV adds launch options (VAR=VALUE words).
    for kern in ${BENCH_KERNELS:-tc}; do
      for b in ${NCU_ATTN_BATCHES:-64 128}; do
        env ${NCU_ENV:-} GENSLOT_ATTN_KERNEL=$kern /usr/local/cuda/bin/ncu --clock-control none \
          --profile-from-start off --kernel-name regex:paged_attn \
          --launch-skip 8 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
          --section InstructionStats --section SourceCounters \
          "$G/genslot-gpu" bench --shape llama-8b --batches "$b" --contexts 4096 --iters 2 --kv-fraction 0.6 \
          --profile 2>&1 | tee "$W/ncu-attn-$kern-b$b${NCU_TAG:-}.txt" | grep -E "Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Compute \(SM\)|Stall|Theoretical Occ|Block Limit|Issued Warp|No Eligible|Active Warps|Eligible Warps|Executed Instructions " || fail ncu
      done
    done
  fi
fi
if has serve; then
  # genslot serve on the CUDA backend (llama-1b, random weights) with preemption on.
  stage "serve llama-1b"
  serve_and_check llama-1b "$G/cuda-llama-1b.yaml" 18000 "$G/serve_check.py"
fi
if has retained; then
  # The retained state. Drafter: drafted vs plain greedy tokens on the repetitive and the
  # non-repetitive prompt set (tiny; SmolLM2 with the GGUF), tokens per step and wall time of
  # each, paused vs solo; served SmolLM2 with the drafter under preemption (serve_real.py).
  # Hybrid: tiny-hybrid against its f32 CPU reference, paused vs solo, served llama-hybrid-1b
  # under preemption (serve_paused.py), and its decode step against the roofline beside
  # llama-1b's.
  stage retained
  m=(); [ -f "$GGUF" ] && m=(--model "$GGUF")
  "$G/genslot-gpu" check-retained "${m[@]}" --json "$W/retained.json" 2>&1 \
    | tee -a "$W/summary.txt" || fail check-retained
  "$G/genslot-gpu" check-tiny --shape tiny-hybrid --tol 1e-2 2>&1 | tee -a "$W/summary.txt" \
    || fail "check-tiny tiny-hybrid"
  if have_gguf; then
    serve_and_check smollm2-draft "$G/cuda-smollm2-draft.yaml" 18002 "$G/serve_real.py"
  fi
  serve_and_check llama-hybrid-1b "$G/cuda-llama-hybrid-1b.yaml" 18003 "$G/serve_paused.py"
  for shape in llama-hybrid-1b llama-1b; do
    "$G/genslot-gpu" bench --shape "$shape" --batches 1,32,64,128 --contexts 4096 \
      --json "$W/bench-$shape-retained.json" 2>&1 | tee -a "$W/summary.txt" || fail "bench $shape"
  done
fi
stage "done status=$status"
cp "$W/summary.txt" "$OUT/summary.txt"
tar -czf "$OUT/gpu-results.tar.gz" -C "$W" .
ls -la "$OUT"
exit $status
