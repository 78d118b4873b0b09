#!/usr/bin/env bash
# In-process engine benchmark on a generated (random-weight) model:
# decode tokens/s target-only vs speculative (W=16, K=1..3), time per round
# split into draft and verify, and the ratio verify(W=16) / decode(1 token),
# which bounds what speculation can gain on this machine:
#   speedup <= tau / (verify_ratio + draft_time / decode_time).
# Usage: bench/engine/run.sh [BUILD_DIR] [--threads N] [--dtype float32]
set -euo pipefail
BUILD=${1:-build}
shift || true
EXTRA=("$@")
MODEL=${MODEL:-/tmp/dedit-bench-model}
# Shapes of the generated target (~185M parameters by default); override
# with MODEL_ARGS to try others.
MODEL_ARGS=${MODEL_ARGS:---vocab 32000 --hidden 1024 --intermediate 3072 --layers 12 --heads 16 --kv_heads 8 --head_dim 64 --drafter_layers 2 --block_size 16}
MAX_TOKENS=${MAX_TOKENS:-64}
GEN=$BUILD/cli/dedit-generate
if [ ! -f "$MODEL/target/model.safetensors" ]; then
  # shellcheck disable=SC2086
  "$BUILD/cli/dedit-make-tiny-model" --out "$MODEL" $MODEL_ARGS --seed 5
fi
PROMPTS=$(mktemp)
cat > "$PROMPTS" <<'P'
[1, 17, 42, 99, 7, 256, 3, 1000, 5, 77, 31, 12, 8, 400, 2, 9]
[5000, 12, 88, 3, 4, 901, 77, 23000, 45, 6, 19, 1, 300, 42, 8, 11, 7, 650, 33, 2]
[14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43]
P
run() {
  local label=$1; shift
  "$GEN" --target "$MODEL/target" --drafter "$MODEL/drafter" --json \
    --max_tokens "$MAX_TOKENS" --ignore_eos "${EXTRA[@]}" "$@" < "$PROMPTS" > "/tmp/dedit-bench-$label.jsonl"
}
run ar --ar
for k in 1 2 3; do run "w16k$k" --window 16 --passes "$k"; done
python3 - "$@" <<'PY'
import json
def load(label):
    rows = [json.loads(l) for l in open(f"/tmp/dedit-bench-{label}.jsonl")]
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
    r = load(f"w16k{k}")
    print(f"{'W=16 K=%d' % k:<22}{r['tps']:>8.2f}{r['tps'] / ar['tps']:>9.2f}{r['tau']:>7.2f}"
          f"{r['draft_ms']:>13.2f}{r['verify_ms']:>14.2f}")
r1 = load("w16k1")
print(f"verify(W=16) / decode(1 token) = {r1['verify_ms'] / ar['verify_ms']:.2f}")
print(f"draft(K=1) / decode(1 token)   = {r1['draft_ms'] / ar['verify_ms']:.2f}")
PY
rm -f "$PROMPTS"
