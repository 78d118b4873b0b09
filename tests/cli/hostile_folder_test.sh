#!/usr/bin/env bash
# A hostile model folder stops every entry point with an error message and a
# plain failure status: never a signal, a hang or a huge allocation (CTest
# cli.hostile_folder, label "cli"). Each case copies the bundled
# tiny checkpoint and breaks one file. Every command runs under a time limit
# and a 4 GiB address-space limit; exit status 124 (timeout) or >= 128 (a
# signal) fails the case.
#
#   hostile_folder_test.sh DEDIT_CLI DEDIT_GENERATE DEDIT_TARGET DEDIT_DRAFTER \
#     DEDIT_ROUTER CHECKPOINTS_DIR
set -uo pipefail

cli=$1 generate=$2 target=$3 drafter=$4 router=$5 checkpoints=$6
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dedit_hostile.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_refusal NAME STDERR_SUBSTRING COMMAND...: COMMAND (stdin empty
# JSON list) must exit with a status in 1..123 and say STDERR_SUBSTRING.
expect_refusal() {
  local name=$1 needle=$2
  shift 2
  (ulimit -v $((4 << 20)); echo '["x"]' | timeout 60 "$@") \
    >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local err
  err=$(tail -c 2000 "$tmp/err")
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    fail "$name: exit status $rc (want a plain error): $err"
  elif [[ "$err" != *"$needle"* ]]; then
    fail "$name: stderr lacks '$needle': $err"
  else
    echo "ok: $name ($rc): $(tail -n 1 "$tmp/err" | cut -c 1-160)"
  fi
}

# fresh NAME: a copy of the tiny target, drafter in NAME/drafter.
fresh() {
  rm -rf "$tmp/$1"
  mkdir -p "$tmp/$1"
  cp -r "$checkpoints/target" "$tmp/$1/target"
  cp -r "$checkpoints/drafter" "$tmp/$1/drafter"
  echo "$tmp/$1"
}

python3 - "$tmp" "$checkpoints" <<'PY'
import json, sys
tmp, ck = sys.argv[1], sys.argv[2]
tok = json.load(open(ck + "/target/tokenizer.json"))
def write(name, text):
    open(tmp + "/" + name, "w").write(text)
bad = dict(tok)
bad["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "a+\\C"}, "behavior": "Isolated"},
    {"type": "Split", "pattern": {"Regex": "\\p{L}"}, "behavior": "Isolated"}]}
write("tokenizer_backslash_c.json", json.dumps(bad))
deep = dict(tok)
deep["normalizer"] = "@"
write("tokenizer_deep.json", json.dumps(deep).replace(
    '"@"', '{"type":"Sequence","normalizers":[' * 20000 + '{"type":"NFC"}' + "]}" * 20000))
drafter = json.load(open(ck + "/drafter/config.json"))
drafter["num_hidden_layers"] = drafter["num_target_layers"] = 2**31 - 1
del drafter["dflash_config"]["target_layer_ids"]
write("drafter_huge_layers.json", json.dumps(drafter))
target = json.load(open(ck + "/target/config.json"))
target["eos_token_id"] = 2**32 + 1
write("target_eos_wraps.json", json.dumps(target))
PY

# --- dedit-cli tokenize
expect_refusal cli_backslash_c "pre_tokenizer.pretokenizers[0].pattern" \
  "$cli" tokenize --tokenizer "$tmp/tokenizer_backslash_c.json"
expect_refusal cli_deep_sequences "nested deeper than 64" \
  "$cli" tokenize --tokenizer "$tmp/tokenizer_deep.json"
mkfifo "$tmp/fifo.json"
expect_refusal cli_fifo_tokenizer "not a regular file" \
  "$cli" tokenize --tokenizer "$tmp/fifo.json"

# --- dedit-generate
d=$(fresh generate_fifo_tokenizer)
rm "$d/target/tokenizer.json" && mkfifo "$d/target/tokenizer.json"
expect_refusal generate_fifo_tokenizer "not a regular file" \
  "$generate" --target "$d/target" --prompt_ids 1,2 --max_tokens 2
d=$(fresh generate_fifo_config)
rm "$d/target/config.json" && mkfifo "$d/target/config.json"
expect_refusal generate_fifo_config "not a regular file" \
  "$generate" --target "$d/target" --prompt_ids 1,2 --max_tokens 2
d=$(fresh generate_fifo_weights)
rm "$d/target/model.safetensors" && mkfifo "$d/target/model.safetensors"
expect_refusal generate_fifo_weights "not a regular file" \
  "$generate" --target "$d/target" --prompt_ids 1,2 --max_tokens 2
d=$(fresh generate_huge_drafter)
cp "$tmp/drafter_huge_layers.json" "$d/drafter/config.json"
expect_refusal generate_huge_drafter "num_hidden_layers" \
  "$generate" --target "$d/target" --drafter "$d/drafter" --prompt_ids 1,2 \
  --max_tokens 2
d=$(fresh generate_eos_wraps)
cp "$tmp/target_eos_wraps.json" "$d/target/config.json"
expect_refusal generate_eos_wraps "eos_token_id" \
  "$generate" --target "$d/target" --prompt_ids 1,2 --max_tokens 2
d=$(fresh generate_deep_tokenizer)
cp "$tmp/tokenizer_deep.json" "$d/target/tokenizer.json"
expect_refusal generate_deep_tokenizer "nested deeper than 64" \
  "$generate" --target "$d/target" --prompt "hi" --max_tokens 2

# --- the services refuse to start
d=$(fresh target_service)
cp "$tmp/target_eos_wraps.json" "$d/target/config.json"
expect_refusal target_service "eos_token_id" \
  "$target" --target_dir "$d/target" --port 0 --metrics_port 0
d=$(fresh target_service_drafter)
cp "$tmp/drafter_huge_layers.json" "$d/drafter/config.json"
expect_refusal target_service_drafter "num_hidden_layers" \
  "$target" --target_dir "$d/target" --drafter_dir "$d/drafter" --port 0 \
  --metrics_port 0
d=$(fresh drafter_service)
rm "$d/drafter/config.json" && mkfifo "$d/drafter/config.json"
expect_refusal drafter_service "not a regular file" \
  "$drafter" --target_dir "$d/target" --drafter_dir "$d/drafter" --port 0 \
  --metrics_port 0
expect_refusal router_service "nested deeper than 64" \
  "$router" --tokenizer "$tmp/tokenizer_deep.json" --port 0 --metrics_port 0

if [ "$failures" -ne 0 ]; then
  echo "$failures hostile-folder case(s) failed" >&2
  exit 1
fi
echo "all hostile-folder cases refused cleanly"
