#!/usr/bin/env bash
# The wide pair's held-out evaluation in one run (docs/RESULTS.md
# "The production regime"): the shipped pair widened x8
# (scripts/make_wide_pair.sh), every configuration on the held-out chat
# tasks, in process (dedit-generate) and through the three services
# (scripts/serve.sh), in turns, each checked token for token against
# target-only (scripts/eval_chat_tasks.py):
#   target-only; the plain DEdit drafter at W 8/16 and K 1/3 (K=1 is
#   --passes 1); the lookup-seeded drafter at W=16 K=1; n-gram W=16;
#   hybrid W=16 K=1.
# Two stacks serve the services' half: one with the plain drafter, one with
# the seeded drafter (the router serves one drafter per stack).
#
#   scripts/eval_wide_pair.sh [BUILD_DIR] [OUT_JSON]
#
# Environment: LIMIT (instances per family, default 0 = all 35),
# MAX_TOKENS (448), THREADS (--threads of every model process, default the
# machine's cores), WIDE (the pair, default BUILD_DIR/wide-pair-x8), TASKS
# (folder with heldout.jsonl, default: generated into
# BUILD_DIR/chat-tasks-VOCAB by training/chat_tasks.py), VOCAB (its
# vocabulary: fixed, the split docs/RESULTS.md's figures were measured on,
# or pool, held-out words never seen in training; default fixed), WIDEN
# (default 1; 0 evaluates WIDE as it is, any folder with target, drafter
# and drafter-seeded: WIDEN=0 WIDE=checkpoints/tiny THREADS=1 gives the
# tiny pair's table in process and through the services).
# Nothing else should run meanwhile.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
OUT=${2:-$BUILD/wide-pair-eval.json}
LIMIT=${LIMIT:-0}
MAX_TOKENS=${MAX_TOKENS:-448}
THREADS=${THREADS:-$(nproc)}
WIDE=${WIDE:-$BUILD/wide-pair-x8}
VOCAB=${VOCAB:-fixed}
TASKS=${TASKS:-$BUILD/chat-tasks-$VOCAB}

if [ "${WIDEN:-1}" = 1 ]; then
  BUILD=$BUILD bash "$ROOT/scripts/make_wide_pair.sh" "$WIDE" 8
fi
WIDE=$(cd "$WIDE" && pwd)
if [ ! -f "$TASKS/heldout.jsonl" ]; then
  mkdir -p "$TASKS"
  python3 "$ROOT/training/chat_tasks.py" generate --out "$TASKS" \
    --vocab "$VOCAB"
fi

RUN=$(mktemp -d "${TMPDIR:-/tmp}/dedit-wide-eval.XXXXXX")
# Twelve free loopback ports: two stacks' router, target, drafter and
# their /metrics.
read -r RA TA DA RB TB DB M1 M2 M3 M4 M5 M6 < <(python3 "$ROOT/scripts/free_ports.py" 12)
stop() {
  for d in "$RUN/a" "$RUN/b"; do
    for f in "$d"/router.pid "$d"/target.pid "$d"/drafter.pid; do
      [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
    done
  done
  sleep 1
  rm -rf "$RUN"
}
trap stop EXIT
serve() {  # run dir, drafter, router port, target port, drafter port, metrics
  bash "$ROOT/scripts/serve.sh" --build-dir "$BUILD" --run-dir "$1" --detach \
    --threads "$THREADS" --target-dir "$WIDE/target" --drafter-dir "$2" \
    --router-port "$3" --target-port "$4" --drafter-port "$5" \
    --metrics-ports "$6" >/dev/null
}
serve "$RUN/a" "$WIDE/drafter" "$RA" "$TA" "$DA" "$M1,$M2,$M3"
serve "$RUN/b" "$WIDE/drafter-seeded" "$RB" "$TB" "$DB" "$M4,$M5,$M6"

/usr/bin/python3 "$ROOT/scripts/eval_chat_tasks.py" --build "$BUILD" \
  --target "$WIDE/target" --drafter "$WIDE/drafter" --tasks "$TASKS" \
  --threads "$THREADS" --max_tokens "$MAX_TOKENS" --limit "$LIMIT" \
  --router "127.0.0.1:$RA" --stubs "$BUILD/proto/python" \
  --configs "ar=ar,w8k1=model:w=8:k=1,w8k3=model:w=8:k=3,w16k1=model:w=16:k=1,w16k3=model:w=16:k=3,seeded16=model:w=16:k=1:drafter=$WIDE/drafter-seeded:rport=$RB,ngram16=ngram:w=16,hybrid16=hybrid:w=16:k=1" \
  >"$OUT"

python3 - "$OUT" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"lossless: {r['lossless']}  accuracy: {r['accuracy']['overall']}")
print("| configuration | tau | in process | services | services / in process |")
print("|---|---|---|---|---|")
for name, fam in r["speculation"].items():
    s = r.get("speculation_services", {}).get(name, {}).get("overall", {})
    o = fam["overall"]
    ratio = s.get("speedup", 0) / o["speedup"] if o["speedup"] else 0
    print(f"| {name} | {o['tau']:.2f} | {o['speedup']:.2f}x | "
          f"{s.get('speedup', 0):.2f}x | {ratio:.2f} |")
PY
