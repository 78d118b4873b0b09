#!/usr/bin/env bash
# Installs the official OpenAI Node SDK (exact version) into DEST, unless it
# is already there. Run by the CTest fixture gateway.install_openai_sdk
# before the gateway tests; reruns of `make test` reuse the install.
#
#   install_openai_sdk.sh <build>/tests/gateway/openai-sdk
#
# Pinned to major 4, which runs on Debian 12's Node 18.
set -euo pipefail

dest=${1:?usage: install_openai_sdk.sh DEST_DIR}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
version="4.104.0"

installed() {
  [ -f "$dest/node_modules/openai/package.json" ] &&
    node -e 'process.exit(require(process.argv[1]).version === process.argv[2] ? 0 : 1)' \
      "$dest/node_modules/openai/package.json" "$version" 2>/dev/null
}

if installed; then
  echo "install_openai_sdk: cached openai@$version in $dest"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "install_openai_sdk: npm is required to install openai@$version" >&2
  exit 1
fi
# A private npm cache keeps the build tree self-contained (and works when
# $HOME is read-only); --prefix installs into DEST/node_modules.
npm_config_cache="$dest/npm-cache" npm_config_update_notifier=false \
  npm install --silent --no-audit --no-fund --no-save --prefix "$dest" \
  "openai@$version" >/dev/null
installed || { echo "install_openai_sdk: install failed" >&2; exit 1; }
echo "install_openai_sdk: installed openai@$version into $dest"
