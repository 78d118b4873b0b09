#!/usr/bin/env bash
# The demo: the in-process DEdit engine on a generated tiny model (random
# weights), speculative vs target-only, with acceptance statistics. Once the
# trained bundled model and the services land, this runs them instead.
set -euo pipefail
BUILD=${1:-build}
MODEL=$BUILD/demo-model
if [ ! -f "$MODEL/target/model.safetensors" ]; then
  "$BUILD/tools/make_tiny_model/dedit-make-tiny-model" --out "$MODEL" \
    --vocab 512 --hidden 128 --layers 4 --heads 4 --kv_heads 2 --block_size 16 --seed 7
fi
PROMPT=1,17,42,99,7,256,3
echo "== speculative (W=16, K=3, random drafter: expect tau near 1) =="
"$BUILD/tools/generate/dedit-generate" --target "$MODEL/target" --drafter "$MODEL/drafter" \
  --prompt_ids $PROMPT --window 16 --passes 3 --max_tokens 48 --threads 1
echo
echo "== target-only baseline =="
"$BUILD/tools/generate/dedit-generate" --target "$MODEL/target" --ar \
  --prompt_ids $PROMPT --max_tokens 48 --threads 1
