#!/usr/bin/env bash
# The demo: the in-process DEdit engine, speculative vs target-only, with
# acceptance statistics. Uses the bundled trained pair (models/tiny) on a text
# prompt when present, and a generated random pair otherwise.
set -euo pipefail
BUILD=${1:-build}
GEN=$BUILD/tools/generate/dedit-generate
if [ -f models/tiny/target/model.safetensors ] && [ -f models/tiny/drafter/model.safetensors ]; then
  TARGET=models/tiny/target
  DRAFTER=models/tiny/drafter
  PROMPT=(--prompt "def read_config(path):
    \"\"\"Read a configuration file and return a dict.\"\"\"
")
  echo "model: bundled models/tiny (see models/tiny/target/MODEL_CARD.md)"
else
  MODEL=$BUILD/demo-model
  if [ ! -f "$MODEL/target/model.safetensors" ]; then
    "$BUILD/tools/make_tiny_model/dedit-make-tiny-model" --out "$MODEL" \
      --vocab 512 --hidden 128 --layers 4 --heads 4 --kv_heads 2 --block_size 16 --seed 7
  fi
  TARGET=$MODEL/target
  DRAFTER=$MODEL/drafter
  PROMPT=(--prompt_ids 1,17,42,99,7,256,3)
  echo "model: generated random pair (acceptance near 1 token per round)"
fi
echo "== speculative (W=16, K=3) =="
"$GEN" --target "$TARGET" --drafter "$DRAFTER" "${PROMPT[@]}" --window 16 --passes 3 \
  --max_tokens 96 --threads 1
echo
echo "== target-only baseline =="
"$GEN" --target "$TARGET" --ar "${PROMPT[@]}" --max_tokens 96 --threads 1
