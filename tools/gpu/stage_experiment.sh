#!/usr/bin/env bash
# On the CPU machine: stage the served H200 experiment into DEST (default .gpu/, carried to
# the H200 machine): the GPU binaries and tests (tools/gpu/stage.sh), loadgen, the Weka
# trace, tools/gpu/h200_experiment.sh, and one config per arm (exp-control.yaml,
# exp-tpot.yaml, exp-tpot-g05.yaml, exp-tpot-held.yaml, exp-tpot-g05-held.yaml,
# exp-target.yaml), each checked here with
# `genslot check-config` so a config error costs no time on the H200 machine.
#
# CONTEXT_YAML: the line(s) appended to every arm's config to select `context: transfer`
# (default "context: transfer"; set it to what the config schema calls it, or to "" to serve
# with prefill). SKIP_GPU_STAGE=1 builds only genslot and loadgen (a CPU check of the
# pipeline with BACKEND=model needs no more). TRACE: the Weka trace to copy.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpu}
CONTEXT_YAML=${CONTEXT_YAML-context: transfer}
TRACE=${TRACE:-../shared/traces/weka_cc_agentic/weka_traces_runs.jsonl.gz}
mkdir -p "$DEST"
if [ "${SKIP_GPU_STAGE:-0}" = 1 ]; then
  cargo build --release --bin genslot
  cp target/release/genslot "$DEST/"
else
  tools/gpu/stage.sh "$DEST"
fi
cargo build --release -p loadgen
cp target/release/loadgen "$DEST/"
strip "$DEST/loadgen" "$DEST/genslot" 2>/dev/null || true
install -m 0644 "$TRACE" "$DEST/weka.jsonl.gz"
cp tools/gpu/h200_experiment.sh "$DEST/"
stage_arm() { # NAME SOURCE [EXTRA_YAML]
  { cat "tools/gpu/$2"; [ -n "$CONTEXT_YAML" ] && printf '%s\n' "$CONTEXT_YAML"; printf '%s' "${3:-}"; } \
    > "$DEST/exp-$1.yaml"
  "$DEST/genslot" check-config "$DEST/exp-$1.yaml" > /dev/null \
    || { echo "error: $DEST/exp-$1.yaml does not pass check-config (CONTEXT_YAML?)" >&2; exit 1; }
}
# CARD: which card's configs (tools/gpu/CARD-llama-8b-control.yaml; default h200). The
# H100's KV is half the H200's: its tpot arm is its control with the preemption line.
CARD=${CARD:-h200}
CONTROL=$CARD-llama-8b-control.yaml
[ -f "tools/gpu/$CONTROL" ] || { echo "error: no tools/gpu/$CONTROL (CARD=$CARD)" >&2; exit 1; }
stage_arm control "$CONTROL"
if [ -f "tools/gpu/$CARD-llama-8b-tpot.yaml" ]; then
  stage_arm tpot "$CARD-llama-8b-tpot.yaml"
else
  stage_arm tpot "$CONTROL" "scheduler_config:"$'\n'"  gen_preemption: { tpot_budget: 0.10 }"$'\n'
fi
# tpot-g05: the preemption arm with the controller's window gain starting at 0.5, which the
# simulator says holds a three-minute run's TPOT cost to the setpoint (docs/results.md §3).
stage_arm tpot-g05 "$CONTROL" \
  "scheduler_config:"$'\n'"  gen_preemption: { tpot_budget: 0.10, initial_gain: 0.5 }"$'\n'
# tpot-held, tpot-g05-held: the same two starts with g held until a paused request completes
# (`gain_from: paused`, docs/results.md §3 and §4.3).
stage_arm tpot-held "$CONTROL" \
  "scheduler_config:"$'\n'"  gen_preemption: { tpot_budget: 0.10, gain_from: paused }"$'\n'
stage_arm tpot-g05-held "$CONTROL" \
  "scheduler_config:"$'\n'"  gen_preemption: { tpot_budget: 0.10, initial_gain: 0.5, gain_from: paused }"$'\n'
# kvshort (CARD=h100): the control on 2,048 tokens of KV a slot, a pool too small for this
# load's outputs, the simulator's copy under tests/ (docs/h100/experiment-2, results §7.1).
if [ "$CARD" = h100 ]; then
  stage_arm kvshort ../../tests/fixtures/config/h100-llama-8b-kv-short.yaml
fi
# target_output_tps: the simulator's T (control rate / 1.10) at c288 is 37.4 tok/s; set
# TARGET_OUTPUT_TPS from the first control run's served rate (h200_analyze.py prints it).
stage_arm target "$CONTROL" \
  "scheduler_config:"$'\n'"  gen_preemption: { target_output_tps: ${TARGET_OUTPUT_TPS:-37.4} }"$'\n'
du -sh "$DEST"
