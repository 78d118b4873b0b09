#!/usr/bin/env bash
# Engine efficiency, old and new builds side by side in one run
# (bench/README.md, "Engine efficiency"): dedit-engine-bench on the shipped
# pair and on a random pair of the production shape (a 12-layer, hidden-128
# target with a 1-layer drafter, 4096 positions), then peak RSS with 64
# sequences of 2048-token prompts. Runs alternate between the builds.
#
#   bench/engine/efficiency.sh NEW_BUILD [OLD_BUILD] [-- dedit-engine-bench flags]
#
# OLD_BUILD is any build of an older tree with bench/engine/engine_bench.cc
# copied in (the bench uses only the models' public API). Prints one JSON
# object per line, each tagged with "build" and "pair".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NEW=$1; shift
OLD=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then OLD=$1; shift; fi
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
RANDOM_PAIR=${RANDOM_PAIR:-/tmp/dedit-bench-12x128}
if [ ! -f "$RANDOM_PAIR/target/model.safetensors" ]; then
  "$NEW/cli/dedit-make-tiny-model" --out "$RANDOM_PAIR" --vocab 2048 \
    --hidden 128 --intermediate 384 --layers 12 --heads 4 --kv_heads 2 \
    --head_dim 32 --drafter_layers 1 --block_size 16 --passes 1 \
    --max_positions 4096 --seed 5 >/dev/null
fi
builds=(new)
[ -n "$OLD" ] && builds+=(old)
run() {  # build label, pair label, target, drafter, flags...
  local build=$1 pair=$2 target=$3 drafter=$4; shift 4
  local dir=$NEW
  [ "$build" = old ] && dir=$OLD
  "$dir/bench/engine/dedit-engine-bench" --target "$target" --drafter "$drafter" \
    "$@" "${EXTRA[@]}" |
    python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    d.update(build='$build', pair='$pair')
    print(json.dumps(d), flush=True)"
}
for pair in shipped random12x128; do
  case $pair in
    shipped) t=$ROOT/checkpoints/tiny/target d=$ROOT/checkpoints/tiny/drafter ;;
    random12x128) t=$RANDOM_PAIR/target d=$RANDOM_PAIR/drafter ;;
  esac
  for b in "${builds[@]}"; do
    run "$b" "$pair" "$t" "$d" --concurrency 1,4,16,64 --max_tokens 64
  done
done
# Memory: 64 sequences with 2048-token prompts on the 4096-position pair.
for b in "${builds[@]}"; do
  run "$b" random12x128-2k "$RANDOM_PAIR/target" "$RANDOM_PAIR/drafter" \
    --concurrency 64 --prompt_tokens 2048 --max_tokens 16 --reps 3 |
    grep '"memory"\|"throughput"'
done
