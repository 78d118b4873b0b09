#!/usr/bin/env bash
# scripts/edit_toy.sh --eval on the shipped toy drafters, as a user runs
# it after `make test`: on fresh held-out toy data the edit passes
# lengthen the accepted drafts (P3 over P1), the causal twin is found and
# scored, nothing passes the analytic ceiling, and the last line is the
# one JSON object the script promises. A drafter trained on another
# target is refused by name.
#   edit_toy_eval_test.sh BUILD_DIR REPO_ROOT
set -euo pipefail
build=$1
root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

BUILD="$build" HELDOUT=4 SEED=11 THREADS=1 \
  bash "$root/scripts/edit_toy.sh" --eval "$root/checkpoints/edit-toy/drafter" \
  > "$work/out" 2> "$work/err" || { cat "$work/err"; exit 1; }
tail -n 1 "$work/out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
for k in ("p1_tau", "p3_tau", "oracle_gain_points", "causal_p3_tau",
          "ceiling_tau"):
    assert k in r, f"no {k} in {r}"
print({k: round(r[k], 3) for k in ("p1_tau", "p3_tau", "causal_p3_tau",
                                   "ceiling_tau", "oracle_gain_points")})
assert r["blocks"] == 4 * 239, r["blocks"]
assert r["p3_tau"] > r["p1_tau"] + 0.3, "the edit passes did not help"
assert r["oracle_gain_points"] > 0, "the editor ignores its neighbours"
for k in ("p1_tau", "p3_tau", "causal_p3_tau"):
    assert 1.0 <= r[k] <= r["ceiling_tau"] + 0.5, (k, r[k])
'

# Another target: same tokenizer and shape, other weights.
mkdir "$work/other"
cp "$root/checkpoints/tiny/target/config.json" \
   "$root/checkpoints/tiny/target/tokenizer.json" "$work/other/"
printf 'other weights' > "$work/other/model.safetensors"
if BUILD="$build" TARGET="$work/other" HELDOUT=2 \
   bash "$root/scripts/edit_toy.sh" --eval "$root/checkpoints/edit-toy/drafter" \
   > /dev/null 2> "$work/err"; then
  echo "FAIL: a drafter trained on another target was evaluated"
  exit 1
fi
grep -q "trained on another target" "$work/err" ||
  { echo "FAIL: unexpected refusal:"; cat "$work/err"; exit 1; }
echo PASS
