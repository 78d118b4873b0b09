#!/usr/bin/env bash
# The wide pair: the shipped tiny pair (checkpoints/tiny) widened exactly by
# FACTOR with `dedit-train widen` (training/widen.h). It computes the tiny
# pair's function (greedy outputs equal up to rare bf16 near-ties) while a
# decode step streams FACTOR^2 times the weight bytes: at 8, a 293 MB target
# and 55 MB drafters, a cost stand-in for a memory-bound production model
# (no real checkpoint can be downloaded here). Say so wherever its numbers
# are quoted. Nothing of it is committed.
#
#   scripts/make_wide_pair.sh OUT [FACTOR]     (FACTOR default 8, 1..64;
#                                              powers of two are exact)
#
# Writes OUT/target, OUT/drafter and OUT/drafter-seeded, and OUT/wide_pair.stamp
# last. Idempotent: when the stamp matches (same factor, same source
# checkpoints) it does nothing. Builds nothing: it needs
# $BUILD/training/dedit-train.
#
# Environment:
#   BUILD   build directory holding training/dedit-train (default build)
#   SOURCE  the pair to widen (default checkpoints/tiny)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 OUT [FACTOR]" >&2
  exit 2
fi
OUT="$1"
FACTOR="${2:-8}"
if ! [[ "$FACTOR" =~ ^[1-9][0-9]*$ ]] || ((FACTOR < 1 || FACTOR > 64)); then
  echo "make_wide_pair.sh: FACTOR must be an integer in 1..64, got '$FACTOR'" >&2
  exit 2
fi
BUILD="${BUILD:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
SOURCE="${SOURCE:-$ROOT/checkpoints/tiny}"
TRAIN="$BUILD/training/dedit-train"
if [[ ! -x "$TRAIN" ]]; then
  echo "make_wide_pair.sh: no $TRAIN; build it first:" \
    "cmake --build $BUILD --target dedit-train" >&2
  exit 1
fi
MODELS=(target drafter drafter-seeded)

# What the pair is made from: the factor and the source checkpoints.
stamp() {
  echo "factor $FACTOR"
  for m in "${MODELS[@]}"; do
    (cd "$SOURCE/$m" && sha256sum config.json model.safetensors |
      sed "s|  |  $m/|")
  done
}
WANT="$(stamp)"
if [[ -f "$OUT/wide_pair.stamp" ]] && [[ "$(cat "$OUT/wide_pair.stamp")" == "$WANT" ]]; then
  complete=1
  for m in "${MODELS[@]}"; do
    [[ -f "$OUT/$m/config.json" && -f "$OUT/$m/model.safetensors" ]] || complete=0
  done
  if ((complete)); then
    echo "make_wide_pair.sh: $OUT already holds the pair widened x$FACTOR"
    exit 0
  fi
fi

mkdir -p "$OUT"
rm -f "$OUT/wide_pair.stamp"
for m in "${MODELS[@]}"; do
  "$TRAIN" widen --from="$SOURCE/$m" --out="$OUT/$m" --factor="$FACTOR"
done
echo "$WANT" >"$OUT/wide_pair.stamp"
echo "make_wide_pair.sh: $OUT/{target,drafter,drafter-seeded} widened x$FACTOR"
