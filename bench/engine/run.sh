#!/usr/bin/env bash
# In-process engine benchmark: decode tokens/s target-only vs speculative
# (W, K=1..3), time per round split into draft and verify, and the ratio
# verify(W) / decode(1 token), which bounds what speculation can gain on
# this machine:
#   speedup <= tau / (verify_ratio + draft_time / decode_time).
#
#   bench/engine/run.sh [BUILD_DIR] [--model-dir DIR] [--window W]
#                       [dedit-generate flags: --threads N --dtype float32 ...]
#
# Without --model-dir it generates a random pair (MODEL_ARGS, ~185M
# parameters by default) under $MODEL. Any pair works: prompt ids, the window
# and the token budget come from the pair's own config.json
# (bench/model_info.py), and a failed dedit-generate run stops the script
# with its error.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then BUILD=$1; shift; fi
MODEL=${MODEL:-/tmp/dedit-bench-model}
MODEL_DIR=""
WINDOW=16
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model-dir) MODEL_DIR=$(cd "$2" && pwd); shift 2 ;;
    --window) WINDOW=$2; shift 2 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
MODEL_ARGS=${MODEL_ARGS:---vocab 32000 --hidden 1024 --intermediate 3072 --layers 12 --heads 16 --kv_heads 8 --head_dim 64 --drafter_layers 2 --block_size 16}
MAX_TOKENS=${MAX_TOKENS:-64}
GEN=$BUILD/cli/dedit-generate
for b in "$GEN" "$BUILD/cli/dedit-make-tiny-model"; do
  [ -x "$b" ] || { echo "bench/engine/run.sh: $b not built" >&2; exit 1; }
done
if [ -z "$MODEL_DIR" ]; then
  if [ ! -f "$MODEL/target/model.safetensors" ]; then
    # shellcheck disable=SC2086
    "$BUILD/cli/dedit-make-tiny-model" --out "$MODEL" $MODEL_ARGS --seed 5
  fi
  MODEL_DIR=$MODEL
fi
# Prompts of 16 ids; W and the token budget fitted to the pair.
eval "$(python3 "$HERE/../model_info.py" fit "$MODEL_DIR/target" "$MODEL_DIR/drafter" \
        "$WINDOW" 16 "$MAX_TOKENS")"
MAX_TOKENS=$MAX_NEW_TOKENS
echo "model $MODEL_DIR: vocab $VOCAB, context $MAX_POSITIONS, W=$WINDOW, $MAX_TOKENS tokens per prompt" >&2
PROMPTS=$(mktemp)
trap 'rm -f "$PROMPTS"' EXIT
python3 "$HERE/../model_info.py" prompts "$MODEL_DIR/target" 3 16 "$MAX_TOKENS" "$WINDOW" > "$PROMPTS"
run() {
  local label=$1; shift
  if ! "$GEN" --target "$MODEL_DIR/target" --drafter "$MODEL_DIR/drafter" --json \
      --max_tokens "$MAX_TOKENS" --ignore_eos "${EXTRA[@]}" "$@" < "$PROMPTS" \
      > "/tmp/dedit-bench-$label.jsonl"; then
    echo "bench/engine/run.sh: dedit-generate failed for $label ($*)" >&2
    exit 1
  fi
}
run ar --ar
for k in 1 2 3; do run "w${WINDOW}k$k" --window "$WINDOW" --passes "$k"; done
python3 - "$WINDOW" <<'PY'
import json, sys
W = int(sys.argv[1])
def load(label):
    rows = [json.loads(l) for l in open(f"/tmp/dedit-bench-{label}.jsonl")]
    if not rows:
        sys.exit(f"bench/engine/run.sh: no results for {label}")
    tokens = sum(len(r["tokens"]) - 1 for r in rows)
    decode = sum(r["timings"]["decode_s"] for r in rows)
    rounds = sum(r["rounds"] for r in rows)
    draft = sum(r["timings"]["draft_s"] for r in rows)
    verify = sum(r["timings"]["verify_s"] for r in rows)
    drafted = sum(r["drafted_rounds"] for r in rows)
    tau = (sum(r["mean_acceptance_length"] * r["drafted_rounds"] for r in rows) / drafted) if drafted else 1.0
    return dict(tps=tokens / decode, rounds=rounds, draft_ms=1e3 * draft / rounds,
                verify_ms=1e3 * verify / rounds, tau=tau, tokens=tokens)
ar = load("ar")
print(f"{'config':<22}{'tok/s':>8}{'speedup':>9}{'tau':>7}{'draft ms/rd':>13}{'verify ms/rd':>14}")
print(f"{'target-only (W=1)':<22}{ar['tps']:>8.2f}{1.0:>9.2f}{1.0:>7.2f}{0.0:>13.2f}{ar['verify_ms']:>14.2f}")
for k in (1, 2, 3):
    r = load(f"w{W}k{k}")
    print(f"{'W=%d K=%d' % (W, k):<22}{r['tps']:>8.2f}{r['tps'] / ar['tps']:>9.2f}{r['tau']:>7.2f}"
          f"{r['draft_ms']:>13.2f}{r['verify_ms']:>14.2f}")
r1 = load(f"w{W}k1")
print(f"verify(W={W}) / decode(1 token) = {r1['verify_ms'] / ar['verify_ms']:.2f}")
print(f"draft(K=1) / decode(1 token)   = {r1['draft_ms'] / ar['verify_ms']:.2f}")
PY
