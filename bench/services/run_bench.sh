#!/usr/bin/env bash
# Time per generated token in-process (target-only, speculative) vs through
# the three services on loopback, and service throughput at 1/4/16 streams.
# Results go to stdout as JSON lines; bench/README.md explains them.
#
#   bench/services/run_bench.sh [--build-dir build] [--device cpu]
#       [--threads 1] [--max-tokens 64] [--requests 4] [--model-args "..."]
#       [--model-dir checkpoints/tiny] [--window 16] [--passes 3]
#       [--ngram-window 8] [--prompts FILE] [--client cpp|python]
#       [--idle-spin-us N]
#
# --prompts takes JSON lines of prompt ids (e.g. real text encoded with
# dedit-cli tokenize); without it the prompts are random ids. Every run
# also measures the n-gram method (prompt lookup, no drafter) at
# --ngram-window.
#
# --model-dir uses DIR/target and DIR/drafter (e.g. the bundled trained pair)
# instead of a generated random pair.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD="$ROOT/build"
DEVICE=cpu
DTYPE=float32
THREADS=1
MAX_TOKENS=64
REQUESTS=4
W=16
K=3
# A small random pair: big enough that the model, not the RPCs, is most of
# a step on CPU; random weights, so acceptance is near 1 token per round.
MODEL_ARGS="--vocab 4096 --hidden 256 --layers 8 --heads 8 --kv_heads 4 --drafter_layers 1 --block_size 16 --passes 3 --max_positions 4096"
OUT=/tmp/dedit-bench
MODEL_DIR=""
NGRAM_W=8
PROMPTS_FILE=""
CLIENT=cpp
IDLE_SPIN_US=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --model-args) MODEL_ARGS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --model-dir) MODEL_DIR=$(cd "$2" && pwd); shift 2 ;;
    --window) W=$2; shift 2 ;;
    --passes) K=$2; shift 2 ;;
    --ngram-window) NGRAM_W=$2; shift 2 ;;
    --client) CLIENT=$2; shift 2 ;;
    --idle-spin-us) IDLE_SPIN_US=$2; shift 2 ;;
    --prompts) PROMPTS_FILE=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    *) echo "run_bench.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
bin() { find "$BUILD" -name "$1" -type f -perm -u+x | head -1; }
STUBS=$(find "$BUILD" -type d -path '*proto/python' | head -1)
mkdir -p "$OUT"
MODELS=${MODEL_DIR:-$OUT/models}
if [ -z "$MODEL_DIR" ] && [ ! -f "$MODELS/target/config.json" ]; then
  # shellcheck disable=SC2086
  "$(bin dedit-make-tiny-model)" --out "$MODELS" $MODEL_ARGS >/dev/null
fi
# Everything model-specific comes from the pair's config.json files
# (bench/model_info.py): any pair works, not only one vocabulary.
eval "$(python3 "$ROOT/bench/model_info.py" fit "$MODELS/target" "$MODELS/drafter" \
        "$W" 32 "$MAX_TOKENS")"
W=$WINDOW
MAX_TOKENS=$MAX_NEW_TOKENS

# Same prompts for every configuration: REQUESTS prompts of 32 ids.
if [ -n "$PROMPTS_FILE" ]; then
  head -n "$REQUESTS" "$PROMPTS_FILE" > "$OUT/prompts.jsonl"
else
  python3 "$ROOT/bench/model_info.py" prompts "$MODELS/target" "$REQUESTS" 32 \
      "$MAX_TOKENS" "$W" > "$OUT/prompts.jsonl"
fi

inprocess() {  # label, extra flags...
  local label=$1; shift
  "$(bin dedit-generate)" --target "$MODELS/target" --drafter "$MODELS/drafter" \
      --device "$DEVICE" --dtype "$DTYPE" --threads "$THREADS" --json --ignore_eos \
      --max_tokens "$MAX_TOKENS" "$@" < "$OUT/prompts.jsonl" |
  python3 -c "
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
per = [r['timings']['decode_s'] / (len(r['tokens']) - 1) for r in rows]
tau = [r['mean_acceptance_length'] for r in rows]
print(json.dumps({'config': '$label', 'requests': len(rows),
                  'decode_ms_per_token': 1000 * sum(per) / len(per),
                  'mean_acceptance_length': sum(tau) / len(tau)}))"
}

echo "# (a) in-process target-only, (b) in-process speculative W=$W K=$K"
inprocess inprocess_target_only --ar
inprocess inprocess_speculative --window "$W" --passes "$K"
inprocess inprocess_ngram --method ngram --window "$NGRAM_W"

echo "# (c) through the services on loopback (device $DEVICE)"
"$ROOT/scripts/serve.sh" --build-dir "$BUILD" --run-dir "$OUT/serve" \
    --target-dir "$MODELS/target" --drafter-dir "$MODELS/drafter" \
    --target-device "$DEVICE" --drafter-device "$DEVICE" --dtype "$DTYPE" \
    --threads "$THREADS" --router-port 50150 --target-port 50151 \
    --drafter-port 50152 --metrics-ports 9150,9151,9152 \
    --idle-spin-us "$IDLE_SPIN_US" --detach >&2
trap 'kill -TERM $(cat "$OUT"/serve/*.pid) 2>/dev/null || true' EXIT
# The C++ client (its own cost per streamed message is small; the Python one's
# is large enough to count as services overhead); --client python uses
# bench_client.py.
client() {
  if [ "$CLIENT" = cpp ]; then
    local args=()
    while [ $# -gt 0 ]; do
      case "$1" in
        --no-speculation) args+=(--no_speculation); shift ;;
        *) args+=("$1"); shift ;;
      esac
    done
    "$(bin dedit-services-bench-client)" --router 127.0.0.1:50150 \
        --max_tokens "$MAX_TOKENS" --window "$W" --passes "$K" \
        --prompts "$OUT/prompts.jsonl" "${args[@]}"
  else
    /usr/bin/python3 "$ROOT/bench/services/bench_client.py" \
        --router 127.0.0.1:50150 --stubs "$STUBS" --vocab "$VOCAB" \
        --max-tokens "$MAX_TOKENS" --window "$W" --passes "$K" \
        --prompts "$OUT/prompts.jsonl" "$@"
  fi
}
# Each one-stream run also reports where its rounds' time went, from the
# router's and the target's histograms (round_breakdown.py).
breakdown() {  # label, client flags...
  local label=$1; shift
  python3 "$ROOT/bench/services/round_breakdown.py" snap 127.0.0.1:9150 \
      127.0.0.1:9151 > "$OUT/metrics-before.json"
  client "$@"
  python3 "$ROOT/bench/services/round_breakdown.py" report \
      "$OUT/metrics-before.json" 127.0.0.1:9150 127.0.0.1:9151 "$label"
}
breakdown rounds_target_only --concurrency 1 --requests "$REQUESTS" --no-speculation
breakdown rounds_speculative --concurrency 1 --requests "$REQUESTS"
breakdown rounds_ngram --concurrency 1 --requests "$REQUESTS" --method ngram --window "$NGRAM_W"
echo "# throughput at 1/4/16 concurrent streams (speculative)"
for c in 4 16; do client --concurrency "$c" --requests 2; done
echo "# throughput at 1/4/16 concurrent streams (target-only)"
for c in 4 16; do client --concurrency "$c" --requests 2 --no-speculation; done
