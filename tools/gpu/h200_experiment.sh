#!/usr/bin/env bash
# The served H200 experiment, one phase per command on the H200 machine. Runs in the folder that
# tools/gpu/stage_experiment.sh fills on the CPU machine (binaries, configs, the Weka trace);
# writes everything to $OUT; the analysis (tools/gpu/h200_analyze.py) runs back on the CPU
# machine. docs/gpu.md ("The served experiment") has the plan and why it looks like this.
#
#   bash h200_experiment.sh grid            step-time grid (genslot-gpu bench) and the
#                                           transfer probe                   (~4 min)
#   bash h200_experiment.sh run ARM REP     one served run: ARM = control | tpot (| tpot-g05
#                                           | tpot-held | tpot-g05-held | target),
#                                           REP = 1, 2, ...; WARMUP_S + MEASURE_S of
#                                           loadgen, every request recorded   (~7.5 min)
#   bash h200_experiment.sh grid-only | probe   the two halves of `grid`
#
# The machine runs a command for 10 min at most and is available 30 min at a time, its start
# included (docs/gpu.md has the plan):
#   sitting 1: grid (~3.5 min); run control 1; run tpot 1 (~8 min each)   ~22 min with start
#   sitting 2: run control 2; run tpot 2 [; run target 1]                 ~18 [26] min
# At most 8 files of 16 MiB come back from $OUT: the grid command writes 4, a run 2
# (a tarball, and loadgen's per-request records).
#
# BACKEND=model serves on the timing model instead of the GPU (the same configs, their
# `timing:` section standing in for the H200): that is how the pipeline is checked on a CPU.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
G=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
BACKEND=${BACKEND:-cuda}
PORT=${PORT:-18000}
CONCURRENCY=${CONCURRENCY:-288}
CONTEXT_SCALE=${CONTEXT_SCALE:-0.03125}
MAX_CONTEXT=${MAX_CONTEXT:-8192}
WARMUP_S=${WARMUP_S:-90}
MEASURE_S=${MEASURE_S:-300}
GRACE_S=${GRACE_S:-30}
SEED=${SEED:-}                 # loadgen seed; default: the repeat number (same for A and B)
START_WAIT_S=${START_WAIT_S:-240}
BATCHES=${BATCHES:-1,2,4,8,16,32,64,96,128}
CONTEXTS=${CONTEXTS:-1024,2048,4096,8192,16384,32768}
GRID_ITERS=${GRID_ITERS:-10}
PROBE_CONTEXTS=${PROBE_CONTEXTS:-1024 4096 8192 16384}
PROBE_REQUESTS=${PROBE_REQUESTS:-8}

stage() { echo "=== $* ($(date -u +%H:%M:%S))"; }
die() { echo "error: $*" >&2; exit 1; }

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null
    # The server drains, then flushes its --record file before it exits.
    for _ in $(seq 1 60); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    server_pid=""
  fi
}
trap stop_server EXIT

# start_server CONFIG RECORD LOG
start_server() {
  "$G/genslot" serve --config "$1" --backend "$BACKEND" --port "$PORT" --record "$2" > "$3" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 "$START_WAIT_S"); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return 0
    kill -0 "$server_pid" 2>/dev/null || { tail -20 "$3"; die "the server exited during start"; }
    sleep 1
  done
  tail -20 "$3"
  die "the server did not answer /health within ${START_WAIT_S} s"
}

grid() {
  stage "grid: llama-8b, batches $BATCHES x contexts $CONTEXTS"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  "$G/genslot-gpu" bench --shape llama-8b --batches "$BATCHES" --contexts "$CONTEXTS" \
    --iters "$GRID_ITERS" --json "$OUT/grid-llama-8b.json" 2>&1 | tee "$OUT/grid.txt"
  [ -s "$OUT/grid-llama-8b.json" ] || die "the bench wrote no grid"
}

# Transfer probe: one request at a time on an idle server (`context: transfer`), one output
# token each, at several context lengths; `genslot fit-step --transfer-record` takes each
# request's admission → KV-ready time (a recording older than those fields: its TTFT less
# the fitted one-row step) as a transfer time.
probe() {
  stage "transfer probe: contexts $PROBE_CONTEXTS, $PROBE_REQUESTS requests each"
  local w=/tmp/h200-probe
  rm -rf "$w" && mkdir -p "$w"
  start_server "$G/exp-control.yaml" "$w/probe.jsonl" "$w/serve.log"
  for l in $PROBE_CONTEXTS; do
    "$G/loadgen" run --url "http://127.0.0.1:$PORT" --fixed "$l,1" --concurrency 1 \
      --max-requests "$PROBE_REQUESTS" --duration 60s --send-jitter 0 --token-ids \
      --no-progress --no-scrape > "$w/loadgen-$l.txt" 2>&1 || { cat "$w/loadgen-$l.txt"; die "probe at $l failed"; }
  done
  stop_server
  cp "$w/probe.jsonl" "$OUT/probe.jsonl"
  cat "$w"/loadgen-*.txt > "$OUT/probe-loadgen.txt"
  echo "probe: $(wc -l < "$OUT/probe.jsonl") requests recorded"
}

# run ARM REP: one served arm, recorded, its files in one tarball.
run_arm() {
  local arm=$1 rep=$2
  local cfg="$G/exp-$arm.yaml"
  [ -f "$cfg" ] || die "no $cfg (staged arms: $(cd "$G" && ls exp-*.yaml | tr '\n' ' '))"
  local seed=${SEED:-$rep}
  local name="run-$rep-$arm"
  local w="/tmp/h200-$name"
  rm -rf "$w" && mkdir -p "$w"
  stage "$name: c$CONCURRENCY, contexts x$CONTEXT_SCALE at most $MAX_CONTEXT, ${WARMUP_S} s warm-up + ${MEASURE_S} s measured, seed $seed, backend $BACKEND"
  cat > "$w/run.json" <<EOF
{"arm": "$arm", "repeat": $rep, "seed": $seed, "concurrency": $CONCURRENCY,
 "context_scale": $CONTEXT_SCALE, "max_context": $MAX_CONTEXT, "warmup_s": $WARMUP_S,
 "measure_s": $MEASURE_S, "grace_s": $GRACE_S, "backend": "$BACKEND",
 "started_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
EOF
  cp "$cfg" "$w/config.yaml"
  start_server "$cfg" "$w/served.jsonl" "$w/serve.log"
  # The counters at the end of the warm-up, so resumes and forced resumes can be windowed.
  ( sleep "$WARMUP_S"; curl -s "http://127.0.0.1:$PORT/metrics" > "$w/metrics-warm.txt" ) &
  local snap=$!
  # And at the end of the measured window: after it the grace drains the batch, and the
  # step counters' mean over the grace too would run short (h200_analyze.py uses this one).
  ( sleep "$((WARMUP_S + MEASURE_S))"; curl -s "http://127.0.0.1:$PORT/metrics" > "$w/metrics-window.txt" ) &
  local snap_window=$!
  "$G/loadgen" run --url "http://127.0.0.1:$PORT" --weka "$G/weka.jsonl.gz" \
    --concurrency "$CONCURRENCY" --context-scale "$CONTEXT_SCALE" --max-context "$MAX_CONTEXT" \
    --token-ids --seed "$seed" --duration "$((WARMUP_S + MEASURE_S))s" --grace "${GRACE_S}s" \
    --no-progress --json "$w/loadgen.json" --records "$w/loadgen-records.jsonl" \
    > "$w/loadgen.txt" 2>&1
  local lg=$?
  wait "$snap" "$snap_window" 2>/dev/null
  curl -s "http://127.0.0.1:$PORT/metrics" > "$w/metrics-end.txt"
  curl -s "http://127.0.0.1:$PORT/debug/actors" > "$w/debug-end.json"
  stop_server
  # Per-request loadgen records (every chunk's time: ~1.8 kB a request gzipped) travel as a
  # file of their own, so the tarball stays far below the 16 MiB a returned file may hold.
  gzip -c "$w/loadgen-records.jsonl" > "$OUT/$name-loadgen-records.jsonl.gz" 2>/dev/null
  rm -f "$w/loadgen-records.jsonl"
  tar czf "$OUT/$name.tar.gz" -C "$w" .
  tail -25 "$w/loadgen.txt"
  grep -E "preemption:" "$w/serve.log" | tail -3
  echo "$name: $(wc -l < "$w/served.jsonl") requests recorded, loadgen exit $lg, $(du -h "$OUT/$name.tar.gz" | cut -f1)"
  [ "$lg" -eq 0 ] || die "loadgen failed"
}

case "${1:-}" in
  grid) grid && probe ;;
  grid-only) grid ;;
  probe) probe ;;
  run) [ $# -eq 3 ] || die "usage: $0 run ARM REP"; run_arm "$2" "$3" ;;
  *) die "usage: $0 grid | grid-only | probe | run ARM REP" ;;
esac
stage "done"
