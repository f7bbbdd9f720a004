#!/usr/bin/env bash
# Paired AIPerf / loadgen runs against a fresh `genslot serve` (embedded default) per run, in
# blocks of (AIPerf, loadgen, loadgen, AIPerf), each tool on the same synthetic load of 64 prompt
# / 32 output tokens. By default a closed loop of 8 lanes and 200 requests; with RATE=R an open
# loop of Poisson arrivals at R requests/s (AIPerf `--request-rate R --arrival-pattern poisson`,
# loadgen `--request-rate R`, no concurrency cap in either) and 300 requests, so neither
# tool's sends depend on the server's decode steps. REQUESTS overrides the request count.
# With PIN=1 the server runs on CPU 0 and the client on CPU 1, so the client's own CPU use
# cannot slow the server's decode loop.
# An odd last seed runs as a single pair (AIPerf, loadgen).
# AIPerf counts tokens itself with TOKDIR (default: the shipped word tokenizer, whose counts
# equal the server's `usage`) and sends the model the server lists at /v1/models.
# Usage: AIPERF=path/to/aiperf OUT=dir SEEDS="11 12" [RATE=4] [TOKDIR=dir] \
#          tools/loadgen/scripts/aiperf_pairs.sh
# Prints one row per pair: TTFT p50 and mean ITL of both tools and their differences.
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${AIPERF:?set AIPERF to the aiperf executable}" "${OUT:?set OUT}"
TOKDIR=${TOKDIR:-./assets/word-tokenizer}
SEEDS=${SEEDS:-"11 12"}
PORT=${PORT:-18000}
PIN=${PIN:-1}
RATE=${RATE:-}
if [ -n "$RATE" ]; then
  REQUESTS=${REQUESTS:-300}
  aiperf_load=(--request-rate "$RATE" --arrival-pattern poisson)
  # Bounded by the request count, as AIPerf's run is, not by loadgen's default 120 s.
  loadgen_load=(--request-rate "$RATE" --duration 1h)
else
  REQUESTS=${REQUESTS:-200}
  aiperf_load=(--concurrency 8)
  loadgen_load=(--concurrency 8)
fi
GENSLOT=${GENSLOT:-target/release/genslot}
LOADGEN=${LOADGEN:-target/release/loadgen}
NICE=${NICE:-0}
server_cpu=(); client_cpu=()
if [ "$PIN" = 1 ]; then server_cpu=(taskset -c 0); client_cpu=(taskset -c 1); fi
# NICE=-10 (as root) keeps server and client ahead of other work on a shared machine.
if [ "$NICE" != 0 ]; then server_cpu=(nice -n "$NICE" "${server_cpu[@]}"); client_cpu=(nice -n "$NICE" "${client_cpu[@]}"); fi
mkdir -p "$OUT"

serve() {
  "${server_cpu[@]}" "$GENSLOT" serve --port "$PORT" > "$OUT/serve-$1.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return 0
    sleep 0.1
  done
  echo "server did not start" >&2; return 1
}
stop() { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true; }

aiperf_run() {  # seed
  serve "aiperf-$1"
  model=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
  "${client_cpu[@]}" "$AIPERF" profile --model "$model" --url "http://127.0.0.1:$PORT" \
    --endpoint-type completions --streaming --tokenizer "$TOKDIR" --isl 64 --osl 32 \
    --request-count "$REQUESTS" "${aiperf_load[@]}" --random-seed "$1" --ui none \
    --output-artifact-dir "$OUT/aiperf-$1" --extra-inputs ignore_eos:true > "$OUT/aiperf-$1.log" 2>&1
  stop
  cp "$OUT/aiperf-$1/profile_export_aiperf.json" "$OUT/aiperf-$1.json"
}
loadgen_run() {  # seed
  serve "loadgen-$1"
  "${client_cpu[@]}" "$LOADGEN" --url "http://127.0.0.1:$PORT" --fixed 64,32 "${loadgen_load[@]}" \
    --max-requests "$REQUESTS" --seed "$1" --json "$OUT/loadgen-$1.json" > "$OUT/loadgen-$1.log" 2>&1
  stop
}

seeds=($SEEDS)
for ((i = 0; i + 1 < ${#seeds[@]}; i += 2)); do
  a=${seeds[i]}; b=${seeds[i + 1]}
  aiperf_run "$a"; loadgen_run "$a"; loadgen_run "$b"; aiperf_run "$b"
done
if ((${#seeds[@]} % 2)); then  # an odd last seed: one pair, AIPerf first
  aiperf_run "${seeds[-1]}"; loadgen_run "${seeds[-1]}"
fi
python3 - "$OUT" $SEEDS <<'PY'
import json, sys
out, seeds = sys.argv[1], sys.argv[2:]
print("seed  aiperf_ttft_p50  loadgen_ttft_p50  d_ttft%  aiperf_itl  loadgen_itl  d_itl%")
for s in seeds:
    a = json.load(open(f"{out}/aiperf-{s}.json"))
    l = json.load(open(f"{out}/loadgen-{s}.json"))
    at, lt = a["time_to_first_token"]["p50"], l["time_to_first_token"]["p50"]
    ai, li = a["inter_token_latency"]["avg"], l["inter_token_latency"]["avg"]
    print(f"{s:>4}  {at:15.1f}  {lt:16.1f}  {100*(lt-at)/at:+7.1f}  {ai:10.2f}  {li:11.2f}  {100*(li-ai)/ai:+6.1f}")
PY
