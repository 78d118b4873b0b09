#!/usr/bin/env bash
# The production regime's engine gates in one run (issue 46, bench/README.md
# "The production regime"): the machine's DRAM read bandwidth and, on a
# model whose weights stream from DRAM at every step,
#   decode as a fraction of that bandwidth,
#   verify(9)/decode, verify(17)/decode, a 16-sequence decode step/decode,
#   draft(W=16, K=1)/decode,
# for a random pair of the wide shape (the kernels cannot lean on the
# widened pair's duplicate structure there) and for the shipped pair widened
# x8 (scripts/make_wide_pair.sh). One table, both models measured in turns,
# the median of ROUNDS (default 3) runs of dedit-engine-bench each (each run
# a median of 20 repetitions per forward), with only
# --threads given (default: the machine's cores), as a user would run it.
#
#   bench/engine/production_regime.sh [BUILD_DIR]
#
# Environment: THREADS (--threads), ROUNDS, WORK (folder for the pairs,
# default BUILD_DIR/production-regime). Nothing else should run meanwhile.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
THREADS=${THREADS:-$(nproc)}
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-$BUILD/production-regime}
BENCH=$BUILD/bench/engine/dedit-engine-bench
[ -x "$BENCH" ] || { echo "production_regime.sh: build $BENCH first" >&2; exit 1; }
mkdir -p "$WORK"

if [ ! -f "$WORK/random/target/model.safetensors" ]; then
  "$BUILD/cli/dedit-make-tiny-model" --out "$WORK/random" --vocab 2048 \
    --hidden 1024 --intermediate 3072 --layers 12 --heads 32 --kv_heads 16 \
    --head_dim 32 --drafter_layers 2 --block_size 16 --dtype bfloat16 >/dev/null
fi
BUILD=$BUILD bash "$ROOT/scripts/make_wide_pair.sh" "$WORK/wide-x8" 8 >/dev/null

for r in $(seq 1 "$ROUNDS"); do
  for pair in random wide-x8; do
    "$BENCH" --target "$WORK/$pair/target" --drafter "$WORK/$pair/drafter" \
      --threads "$THREADS" --window 16 --passes 1 --verify_rows 1,9,17 \
      --batch_decode 16 --concurrency 1 --max_tokens 16 --reps 20 \
      --dram_gb "$([ "$pair" = random ] && echo 2 || echo 0)" \
      >"$WORK/$pair.$r.jsonl"
  done
done

python3 - "$WORK" "$ROUNDS" "$THREADS" <<'PY'
import json, sys
work, rounds, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(pair, r):
    rows = {}
    for line in open(f"{work}/{pair}.{r}.jsonl"):
        d = json.loads(line)
        rows[d["what"]] = d
    return rows
dram = max(load("random", r)["dram_read"]["gb_per_s"] for r in range(1, rounds + 1))
one = max(load("random", r)["dram_read"]["one_thread_gb_per_s"] for r in range(1, rounds + 1))
print(f"DRAM read bandwidth: {dram:.1f} GB/s on all cores ({one:.1f} on one), "
      f"best of 5 sums over 2 GB in each of {rounds} runs; --threads {threads}")
gates = [("decode / DRAM bandwidth", ">= 0.80"), ("verify(9) / decode", "<= 1.2"),
         ("verify(17) / decode", "<= 1.6"), ("16-sequence step / decode", "<= 1.8"),
         ("draft(W=16, K=1) / decode", "<= 0.3")]
print(f"| figure (median of {rounds} runs) | random wide pair | tiny pair widened x8 | gate |")
print("|---|---|---|---|")
def median(values):
    values = sorted(values)
    return values[len(values) // 2]
cols = {}
for pair in ("random", "wide-x8"):
    runs = [load(pair, r) for r in range(1, rounds + 1)]
    f = lambda x: x["forward_ms"]
    v = lambda n: median(x["verify_rows_ms"][str(n)] / f(x)["decode_ms"] for x in runs)
    cols[pair] = {
        "decode ms": f"{median(f(x)['decode_ms'] for x in runs):.2f}",
        "decode GB/s": f"{median(f(x)['decode_gb_per_s'] for x in runs):.1f}",
        "decode / DRAM bandwidth": f"{median(f(x)['decode_gb_per_s'] for x in runs) / dram:.2f}",
        "verify(9) / decode": f"{v(9):.2f}",
        "verify(17) / decode": f"{v(17):.2f}",
        "16-sequence step / decode": f"{median(f(x)['batch_decode_ms'] / f(x)['decode_ms'] for x in runs):.2f}",
        "draft(W=16, K=1) / decode": f"{median(f(x)['draft_over_decode_k1'] for x in runs):.3f}",
    }
for name in ["decode ms", "decode GB/s"]:
    print(f"| {name} | {cols['random'][name]} | {cols['wide-x8'][name]} | |")
for name, gate in gates:
    print(f"| {name} | {cols['random'][name]} | {cols['wide-x8'][name]} | {gate} |")
PY
