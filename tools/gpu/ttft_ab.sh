#!/usr/bin/env bash
# On the GPU machine: the same fixed loads served by two builds of `genslot`, one after the
# other, so a change to what the client sees first (TTFT, the inter-token gap) is measured
# on one machine start. Runs in a folder holding the binaries to compare (A_BIN, B_BIN,
# default genslot-a and genslot-b), `loadgen` and CONFIG (a cuda config); prints TTFT and
# ITL per load, and packs each run's loadgen summary and the servers' logs into
# $OUT/ttft-ab.tar.gz.
#   LOADS: words of CONCURRENCY:ISL:OSL:REQUESTS (default "1:4096:32:24 16:4096:64:96")
# Each load runs on a fresh server start, A then B, in the order the loads are listed.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
G=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/ttft-ab}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/ttft-ab.XXXX)
A_BIN=${A_BIN:-$G/genslot-a}
B_BIN=${B_BIN:-$G/genslot-b}
CONFIG=${CONFIG:?a cuda config to serve}
PORT=${PORT:-18000}
LOADS=${LOADS:-"1:4096:32:24 16:4096:64:96"}

serve_load() { # LABEL BIN CONC ISL OSL N
  local label=$1 bin=$2 conc=$3 isl=$4 osl=$5 n=$6
  "$bin" serve --config "$CONFIG" --port "$PORT" > "$W/serve-$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 480); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 "$pid" 2>/dev/null || { echo "$label: the server exited"; tail -5 "$W/serve-$label.log"; return 1; }
    sleep 0.5
  done
  "$G/loadgen" --url "http://127.0.0.1:$PORT" --fixed "$isl,$osl" --concurrency "$conc" \
    --max-requests "$n" --duration 300s --no-progress --seed 1 --token-ids \
    --json "$W/loadgen-$label.json" > "$W/loadgen-$label.txt" 2>&1 \
    || { echo "$label: loadgen failed"; tail -5 "$W/loadgen-$label.txt"; }
  kill -TERM "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  python3 - "$W/loadgen-$label.json" "$label" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
t, i = s.get("time_to_first_token") or {}, s.get("inter_token_latency") or {}
n = (s.get("request_count") or {}).get("avg")
print(f"{sys.argv[2]:>24}: requests {n}  TTFT ms p50 {t.get('p50', float('nan')):.2f} "
      f"p90 {t.get('p90', float('nan')):.2f} mean {t.get('avg', float('nan')):.2f}  "
      f"ITL ms p50 {i.get('p50', float('nan')):.2f} mean {i.get('avg', float('nan')):.2f}")
PY
}

for load in $LOADS; do
  IFS=: read -r conc isl osl n <<< "$load"
  for side in a b; do
    bin=$A_BIN; [ $side = b ] && bin=$B_BIN
    serve_load "$side-c$conc-$isl-$osl" "$bin" "$conc" "$isl" "$osl" "$n"
  done
done
tar -czf "$OUT/ttft-ab.tar.gz" -C "$W" .
