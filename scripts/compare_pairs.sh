#!/usr/bin/env bash
# Two chat pairs (target + drafter + drafter-seeded), each on both held-out
# splits of the chat task suite, one after the other in one run: the
# evaluation that decides whether a retrained pair may replace
# checkpoints/tiny (issue 48: "none lower than today's by more than the
# run-to-run spread"). Each (pair, split) is one scripts/eval_chat_tasks.py
# run, in process, every configuration in turns over 5 slices with its own
# target-only baseline; the outputs are checked token for token against
# target-only.
#
#   scripts/compare_pairs.sh BUILD_DIR OLD_PAIR NEW_PAIR OUT_DIR
#
# Writes OUT_DIR/{old,new}-{pool,fixed}.json and prints, for each split,
# the answers right, tau and speedup per configuration, and tau per
# family (scripts/compare_pairs_summary.py: the overall tau weighs each
# family by its target's answer tokens, so it also gives both pairs on
# the old target's answer mix, and without reverse, whose answer format
# the continued target changed). Splits: pool (held-out words never seen
# in training, the default of training/chat_tasks.py) and fixed (the
# original suite's words). Environment: THREADS (default 1), LIMIT (instances per family,
# default 0 = all 35), MAX_TOKENS (448), CONFIGS (default below; DRAFTER
# and SEEDED in it are replaced by each pair's drafters). Nothing else
# should run meanwhile.
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: $0 BUILD_DIR OLD_PAIR NEW_PAIR OUT_DIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" && pwd)
OLD=$(cd "$2" && pwd)
NEW=$(cd "$3" && pwd)
OUT=$4
THREADS=${THREADS:-1}
LIMIT=${LIMIT:-0}
MAX_TOKENS=${MAX_TOKENS:-448}
CONFIGS=${CONFIGS:-"ar=ar,w16k1=model:w=16:k=1:drafter=DRAFTER,w16k3=model:w=16:k=3:drafter=DRAFTER,cut12=model:w=12:k=1:conf=0.3:adaptive:drafter=DRAFTER,seeded16=model:w=16:k=1:drafter=SEEDED,hybrid16=hybrid:w=16:k=1:drafter=DRAFTER,hy8=hybrid:w=8:k=1:conf=0.3:adaptive:drafter=DRAFTER,ngram16=ngram:w=16"}
mkdir -p "$OUT"

for split in pool fixed; do
  tasks="$OUT/tasks-$split"
  if [ ! -f "$tasks/heldout.jsonl" ]; then
    python3 "$ROOT/training/chat_tasks.py" generate --out "$tasks" \
      --train 1 --vocab "$split" >/dev/null
  fi
done

for split in pool fixed; do
  for side in old new; do
    pair=$OLD
    [ "$side" = new ] && pair=$NEW
    report="$OUT/$side-$split.json"
    [ -s "$report" ] && continue
    configs=${CONFIGS//DRAFTER/$pair/drafter}
    configs=${configs//SEEDED/$pair/drafter-seeded}
    echo "compare_pairs: $side pair on the $split split ($(date -u +%H:%M:%S))" >&2
    /usr/bin/python3 "$ROOT/scripts/eval_chat_tasks.py" --build "$BUILD" \
      --target "$pair/target" --tasks "$OUT/tasks-$split" \
      --threads "$THREADS" --max_tokens "$MAX_TOKENS" --limit "$LIMIT" \
      --configs "$configs" >"$report.tmp"
    mv "$report.tmp" "$report"
  done
done

python3 "$ROOT/scripts/compare_pairs_summary.py" "$OUT"
