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
# Writes OUT_DIR/{old,new}-{pool,fixed}.json and prints one table: tau and
# speedup per configuration, and the answers right, for each pair and
# split. Splits: pool (held-out words never seen in training, the
# default of training/chat_tasks.py) and fixed (the original suite's
# words). Environment: THREADS (default 1), LIMIT (instances per family,
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

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
for split in ("pool", "fixed"):
    r = {s: json.load(open(os.path.join(out, f"{s}-{split}.json")))
         for s in ("old", "new")}
    print(f"\n{split} split: answers right old {r['old']['accuracy']['overall']['correct']}"
          f"/{r['old']['accuracy']['overall']['instances']}, new "
          f"{r['new']['accuracy']['overall']['correct']}"
          f"/{r['new']['accuracy']['overall']['instances']}; lossless old "
          f"{r['old']['lossless']}, new {r['new']['lossless']}")
    print("| configuration | old tau | new tau | old speedup | new speedup "
          "| old per slice | new per slice |")
    print("|---|---|---|---|---|---|---|")
    for name in r["old"]["speculation"]:
        o = r["old"]["speculation"][name]["overall"]
        n = r["new"]["speculation"].get(name, {}).get("overall", {})
        def sl(x):
            s = x.get("speedup_per_slice") or []
            return f"{min(s):.2f}-{max(s):.2f}" if s else ""
        print(f"| {name} | {o['tau']:.2f} | {n.get('tau', 0):.2f} | "
              f"{o['speedup']:.2f}x | {n.get('speedup', 0):.2f}x | {sl(o)} | {sl(n)} |")
PY
