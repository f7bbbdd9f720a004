#!/usr/bin/env bash
# Regenerates every simulator result behind docs/results.md §1–3 (the calibration of §1.3
# included) from scratch with the release binary, building it first. About 1½–3 minutes on
# a 2-core machine. Usage: tools/sim/results.sh [OUTDIR] (default docs, overwriting its files)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs}
trace=../shared/traces/weka_cc_agentic/weka_traces_runs.jsonl.gz
[ -f "$trace" ] || { echo "needs the Weka traces at $trace" >&2; exit 1; }
cargo build --release --quiet
sim() { ./target/release/genslot sim --preset reference --trace "$trace" --quiet "$@"; }
main=control,tpot_budget=0.10,target_output_tps=auto

# §1: the reference's paired experiment at c220 and c250.
for c in 220 250; do
  sim --concurrency $c --seeds 16 --arms $main \
    --json "$out/sim-c$c.json" --svg "$out/ttft-cdf-c$c.svg" | tee "$out/sim-c$c.txt"
done
# §1: X, g and the paused count over four simulated hours at c220 (first seed).
sim --concurrency 220 --seeds 1 --duration 14400 --arms $main \
  --json "$out/sim-c220-4h.json" --timeline "$out/timeline-c220-4h.svg" | tee "$out/sim-c220-4h.txt"
# §2: the load sweep, with the bigger batch alone and combined with preemption.
sim --sweep 130,160,190,220,250 --seeds 8 \
  --arms $main,max_batch_size=144,max_batch_size=144+tpot_budget=0.10 \
  --json "$out/sim-sweep.json" | tee "$out/sim-sweep.txt"
# §2: the same sweep over four simulated hours per run (the controller's start-up excluded).
sim --sweep 130,160,190,220,250 --seeds 8 --duration 14400 --arms $main \
  --json "$out/sim-sweep-4h.json" | tee "$out/sim-sweep-4h.txt"
# §2: preemption against the bigger batch at equal TPOT cost.
sim --concurrency 220 --seeds 16 \
  --arms control,max_batch_size=144,max_batch_size=136,tpot_budget=0.16,tpot_budget=0.20,tpot_budget=0.22,tpot_budget=0.24 \
  --json "$out/sim-equal-tpot.json" | tee "$out/sim-equal-tpot.txt"
# §3: ablations of the pop order and the victim.
sim --concurrency 220 --seeds 16 \
  --arms control,order=guard_first,order=edf,order=fcfs,tpot_budget=0.10,tpot_budget=0.10+order=guard_first,tpot_budget=0.10+order=edf,target_output_tps=auto+order=guard_first \
  --json "$out/sim-ablation-order.json" | tee "$out/sim-ablation-order.txt"
sim --concurrency 220 --seeds 16 \
  --arms control,tpot_budget=0.10,tpot_budget=0.10+victim=newest_resident,tpot_budget=0.10+victim=most_remaining,tpot_budget=0.10+victim=fewest_remaining \
  --json "$out/sim-ablation-victim.json" | tee "$out/sim-ablation-victim.txt"
# §3: where tpot_budget's window gain starts (g0) and whether it holds until a paused request
# completes (g_from=paused), on the H200 preset at the served experiment's load, over three
# windows (warm-up + measured: 60 + 120, 300 + 900, 600 + 3600 s).
for wdm in "60 180 180" "300 1200 900" "600 4200 3600"; do
  set -- $wdm
  ./target/release/genslot sim --preset h200-llama-8b --trace "$trace" --quiet \
    --context-scale 0.03125 --max-context 8192 --concurrency 288 --seeds 8 \
    --warmup "$1" --duration "$2" \
    --arms control,tpot_budget=0.10,tpot_budget=0.10+g0=0.5,tpot_budget=0.10+g0=0.25,tpot_budget=0.10+g_from=paused,tpot_budget=0.10+g0=0.5+g_from=paused \
    --json "$out/sim-ablation-g0-$3.json" > /dev/null
done
# §3.1: tpot_budget's pauses per request (SPEC §4.3's 2) against 3, 4 and 6, at c220 and on the
# H200 preset at the served experiment's load.
pauses=control,tpot_budget=0.10,tpot_budget=0.10+pauses=3,tpot_budget=0.10+pauses=4,tpot_budget=0.10+pauses=6,tpot_budget=0.06+pauses=4,tpot_budget=0.14
sim --concurrency 220 --seeds 16 --arms $pauses --json "$out/sim-ablation-pauses.json" > /dev/null
./target/release/genslot sim --preset h200-llama-8b --trace "$trace" --quiet \
  --context-scale 0.03125 --max-context 8192 --concurrency 288 --seeds 16 --warmup 60 --duration 480 \
  --arms $pauses --json "$out/sim-ablation-pauses-h200.json" > /dev/null
# §1.3: the calibration scan of the control (output scale × idle cap) at c220.
for os_ic in "1.8 5" "2.0 5" "2.2 10" "2.4 10" "2.5 5" "2.5 13" "2.6 13" "2.6 15" "2.7 15" "2.8 20"; do
  set -- $os_ic
  echo "output_scale=$1 idle_cap=$2"
  sim --concurrency 220 --seeds 4 --arms control --output-scale "$1" --idle-cap "$2" | grep '^control'
done | tee "$out/sim-calibration.txt"
# §1.3: the fit of the step model's jump and slope above 128 requests. For each slope s the jump
# is 11.48 − s, so the step at 129 requests stays at 102 ms; the objective is the sum of
# squared relative errors against the reference's step points and its max_batch_size=144
# run's TPOT and throughput cost (tools/sim/fit_slope.py).
for s in 0.20 0.27 0.35 0.38 0.42 0.49; do
  j=$(python3 -c "print(round(11.48 - $s, 3))")
  sim --concurrency 220 --seeds 8 --arms control,max_batch_size=144 \
    --jump-ms "$j" --per-request-above-ms "$s" --json "$out/sim-slope-$s.json" > /dev/null
done
python3 tools/sim/fit_slope.py "$out"/sim-slope-*.json | tee "$out/sim-slope-fit.txt"
rm -f "$out"/sim-slope-*.json
