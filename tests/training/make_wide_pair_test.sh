#!/usr/bin/env bash
# scripts/make_wide_pair.sh: writes the three widened folders and its stamp,
# does nothing when rerun with the same factor, rewrites the pair for
# another factor, and refuses a bad factor.
#
#   make_wide_pair_test.sh BUILD_DIR
set -euo pipefail
BUILD="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT="$ROOT/scripts/make_wide_pair.sh"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

BUILD="$BUILD" "$SCRIPT" "$OUT/pair" 2 >"$OUT/log1"
for m in target drafter drafter-seeded; do
  [[ -f "$OUT/pair/$m/config.json" && -f "$OUT/pair/$m/model.safetensors" ]] ||
    fail "no $m written"
done
grep -q '"hidden_size": 256' "$OUT/pair/target/config.json" ||
  fail "target not widened x2"
# The widened seeded drafter keeps the source's dedit_config (its fitted
# trust in the seed, its lookup n-gram) unchanged.
python3 - "$ROOT/checkpoints/tiny/drafter-seeded/config.json" \
  "$OUT/pair/drafter-seeded/config.json" <<'PY' ||
import json, sys
src, wide = (json.load(open(p))["dedit_config"] for p in sys.argv[1:3])
assert src["seed_logit_bonus"] > 0 and src["lookup_seed_ngram"] > 0, src
assert wide == src, (wide, src)
PY
  fail "the seeded drafter's dedit_config not carried"
grep -q '^factor 2$' "$OUT/pair/wide_pair.stamp" || fail "no stamp"

before="$(stat -c %Y.%i "$OUT/pair/target/model.safetensors")"
BUILD="$BUILD" "$SCRIPT" "$OUT/pair" 2 >"$OUT/log2"
grep -q "already holds" "$OUT/log2" || fail "rerun did not skip: $(cat "$OUT/log2")"
[[ "$(stat -c %Y.%i "$OUT/pair/target/model.safetensors")" == "$before" ]] ||
  fail "rerun rewrote the target"

BUILD="$BUILD" "$SCRIPT" "$OUT/pair" 4 >"$OUT/log3"
grep -q '"hidden_size": 512' "$OUT/pair/target/config.json" ||
  fail "another factor did not rewrite the pair"
grep -q '^factor 4$' "$OUT/pair/wide_pair.stamp" || fail "stamp not updated"

if BUILD="$BUILD" "$SCRIPT" "$OUT/bad" 65 2>"$OUT/err"; then
  fail "factor 65 accepted"
fi
grep -q "1..64" "$OUT/err" || fail "no range in the error: $(cat "$OUT/err")"
echo "PASS"
