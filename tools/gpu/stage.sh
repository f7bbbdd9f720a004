#!/usr/bin/env bash
# On the CPU machine: build the GPU binaries (host target, never musl) and copy them with the
# scripts into DEST (default .gpu/), stripped, for the H200 machine. genslot-gpu is a release
# build (it times steps); the test binaries use the test profile (they only check results).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpu}
mkdir -p "$DEST"
cargo build --release --bin genslot-gpu
cp target/release/genslot-gpu "$DEST/"
for t in tests/gpu_*.rs; do
  name=$(basename "$t" .rs)
  exe=$(cargo test --no-run --test "$name" --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
  cp "$exe" "$DEST/$name"
done
cp tools/gpu/run.sh tools/gpu/parity.py "$DEST/"
strip "$DEST/genslot-gpu" "$DEST"/gpu_* 2>/dev/null || true
du -sh "$DEST"
