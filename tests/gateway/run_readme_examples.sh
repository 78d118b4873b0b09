#!/usr/bin/env bash
# Runs README.md's OpenAI examples against a running dedit-openai, so the
# documented commands cannot drift from what the server does.
#
#   run_readme_examples.sh README.md http://127.0.0.1:PORT SDK_DIR
#
# The examples are the fenced blocks between "<!-- openai-examples -->" and
# "<!-- /openai-examples -->": each ```sh block runs in bash (curl fails on
# an HTTP error) and must print JSON or an SSE stream ending in [DONE]; each
# ```js block runs as an ES module next to the installed SDK and must exit
# 0. http://localhost:8000 is replaced with the server under test.
set -euo pipefail

readme=${1:?usage: run_readme_examples.sh README BASE_URL SDK_DIR}
base=${2:?}
sdk=${3:?}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$readme" "$work" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"<!-- openai-examples -->(.*?)<!-- /openai-examples -->", text, re.S)
if not m:
    sys.exit("no <!-- openai-examples --> section in README")
blocks = re.findall(r"```(sh|js)\n(.*?)```", m.group(1), re.S)
if not any(k == "sh" for k, _ in blocks) or not any(k == "js" for k, _ in blocks):
    sys.exit("the section needs at least one sh and one js block")
for i, (kind, code) in enumerate(blocks):
    open(f"{sys.argv[2]}/{i:02d}.{kind}", "w").write(code)
PY

status=0
for f in "$work"/*; do
  sed -i "s#http://localhost:8000#$base#g" "$f"
  case "$f" in
    *.sh)
      out=$(bash -c 'set -euo pipefail; curl() { command curl --fail-with-body "$@"; }; source "$1"' _ "$f") || {
        echo "README example failed:"; cat "$f"; echo "$out"; status=1; continue; }
      if grep -q '^data: ' <<<"$out"; then
        if [ "$(grep '^data: ' <<<"$out" | tail -1)" != "data: [DONE]" ]; then
          echo "README stream example did not end with [DONE]:"; cat "$f"; echo "$out"; status=1
        fi
      elif ! python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin if l.strip()]' <<<"$out"; then
        echo "README example printed no JSON:"; cat "$f"; echo "$out"; status=1
      fi ;;
    *.js)
      cp "$f" "$sdk/readme_example.mjs"
      if ! out=$(node "$sdk/readme_example.mjs" 2>&1); then
        echo "README SDK example failed:"; cat "$f"; echo "$out"; status=1
      fi ;;
  esac
  echo "== $(basename "$f"): ok" 
done
exit $status
