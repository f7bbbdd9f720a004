#!/usr/bin/env bash
# On the CPU machine: build the tensor-parallel GPU binaries (host target, never musl) into
# DEST (default .gpu/) beside what stage.sh puts there: genslot-tp (NCCL check, all-reduce
# timings, the TP roofline), the gpu_tp test executable, genslot and run_tp.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpu}
mkdir -p "$DEST"
cargo build --release --bin genslot-tp --bin genslot
cp target/release/genslot-tp target/release/genslot "$DEST/"
exe=$(cargo test --no-run --test gpu_tp --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1)
cp "$exe" "$DEST/gpu_tp"
cp tools/gpu/run_tp.sh config/tp2-model.yaml "$DEST/"
strip "$DEST/genslot-tp" "$DEST/genslot" "$DEST/gpu_tp" 2>/dev/null || true
du -sh "$DEST"
