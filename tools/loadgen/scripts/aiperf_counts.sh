#!/usr/bin/env bash
# AIPerf against a fresh `genslot serve` (embedded default) counting tokens itself with the
# shipped word tokenizer (assets/word-tokenizer, no --use-server-token-count), then checks
# every request's client-side counts against its `usage` and AIPerf's mean ITL against the
# server's TPOT histogram (aiperf_counts.py).
# Usage: AIPERF=path/to/aiperf OUT=dir [ENDPOINT=completions|chat] [REQUESTS=200] [SEED=1] \
#          tools/loadgen/scripts/aiperf_counts.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${AIPERF:?set AIPERF to the aiperf executable}" "${OUT:?set OUT}"
ENDPOINT=${ENDPOINT:-completions}
REQUESTS=${REQUESTS:-200}
SEED=${SEED:-1}
PORT=${PORT:-18000}
GENSLOT=${GENSLOT:-target/release/genslot}
mkdir -p "$OUT"
"$GENSLOT" serve --port "$PORT" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  sleep 0.1
done
MODEL=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics-before.txt"
"$AIPERF" profile --model "$MODEL" --url "http://127.0.0.1:$PORT" --endpoint-type "$ENDPOINT" \
  --streaming --tokenizer ./assets/word-tokenizer --isl 64 --osl 32 --request-count "$REQUESTS" \
  --concurrency 8 --random-seed "$SEED" --ui none --output-artifact-dir "$OUT/aiperf" \
  --extra-inputs ignore_eos:true > "$OUT/aiperf.log" 2>&1
curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics-after.txt"
python3 tools/loadgen/scripts/aiperf_counts.py "$OUT/aiperf" "$OUT/metrics-before.txt" "$OUT/metrics-after.txt"
