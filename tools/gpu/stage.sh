#!/usr/bin/env bash
# On the CPU machine: build the GPU binaries (host target, never musl) and copy them with the
# scripts and configs into DEST (default .gpu/), stripped, for the H200 machine. genslot-gpu is
# a release build (it times steps); the test binaries use the test profile (they only check
# results), and DEST.tar.xz packs the folder for the transfer. The kernels are compiled from
# the binaries' embedded source (genslot-gpu kernels writes it out). A model larger than one
# transfer goes separately: tools/gpu/stage_model.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpu}
mkdir -p "$DEST"
# No test binary or base build of an earlier staging stays behind: run.sh runs every gpu_*
# it finds, and its `base` variant whatever genslot-gpu-base is there.
rm -f "$DEST"/gpu_* "$DEST/genslot-gpu-base"
cargo build --release --bin genslot-gpu --bin genslot
cp target/release/genslot-gpu target/release/genslot "$DEST/"
# BASE_BIN: a genslot-gpu built from another commit, staged as genslot-gpu-base for the
# bench's `base` variant (run.sh), so one run times a change against what it changes.
[ -z "${BASE_BIN:-}" ] || cp "$BASE_BIN" "$DEST/genslot-gpu-base"
# The test binaries that need a GPU (the other tests/gpu_*.rs run on the CPU, in CI).
for name in ${GPU_TESTS:-gpu_backend gpu_retained}; do
  # The test target's own executable (cargo also lists the crate's binaries).
  exe=$(cargo test --no-run --test "$name" --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1)
  cp "$exe" "$DEST/$name"
done
cp tools/gpu/run.sh tools/gpu/parity.py tools/gpu/hybrid_model.py tools/gpu/parity_table.py \
  tools/gpu/serve_check.py tools/gpu/serve_real.py tools/gpu/serve_paused.py \
  tools/gpu/serve_client.py tools/gpu/ncu_summary.py config/cuda-llama-1b.yaml \
  config/cuda-smollm2.yaml config/cuda-smollm2-draft.yaml config/cuda-llama-hybrid-1b.yaml "$DEST/"
strip "$DEST/genslot-gpu" "$DEST/genslot" "$DEST"/gpu_* "$DEST"/genslot-gpu-base 2>/dev/null || true
# The same folder compressed (about a quarter of its size): what a device call carries, beside
# the model's parts. There: python3 -c "import tarfile; tarfile.open('DEST.tar.xz').extractall(filter='tar')"
tar -cJf "$DEST.tar.xz" "$DEST"
du -sh "$DEST" "$DEST.tar.xz"
