#!/usr/bin/env bash
# End-to-end test of `dedit-cli tokenize` (run by CTest as tokenizer.cli).
#
#   cli_test.sh DEDIT_CLI TESTDATA_DIR QWEN3_DIR
set -uo pipefail

cli=${1:?dedit-cli path}
testdata=${2:?testdata dir}
qwen3=${3:?qwen3 tokenizer dir}
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_output NAME EXPECTED_STDOUT STDIN ARGS...
expect_output() {
  local name=$1 expected=$2 input=$3
  shift 3
  local actual
  actual=$(printf '%s' "$input" | "$cli" "$@")
  local rc=$?
  [ "$rc" -eq 0 ] || fail "$name: exit status $rc"
  [ "$actual" == "$expected" ] || fail "$name: got '$actual', want '$expected'"
}

# expect_status NAME STATUS STDIN ARGS...
expect_status() {
  local name=$1 want=$2 input=$3
  shift 3
  printf '%s' "$input" | "$cli" "$@" >/dev/null 2>/tmp/dedit_cli_test.err
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "$name: exit status $rc, want $want ($(cat /tmp/dedit_cli_test.err))"
}

qwen="$qwen3/tokenizer.json"
expect_output encode_hello '[[9707,11,847,5562,374,18838],[]]' \
  '["Hello, my dog is cute", ""]' tokenize --tokenizer "$qwen"
expect_output encode_special '[[151644,872,198,108386,151645]]' \
  '["<|im_start|>user\n你好<|im_end|>"]' tokenize --tokenizer="$qwen"
expect_output decode_hello '["Hello, my dog is cute","<|im_end|>"]' \
  '[[9707,11,847,5562,374,18838],[151645]]' tokenize --tokenizer "$qwen" --decode
expect_output decode_skip_special '["hi"]' \
  '[[151644,6023,151645]]' tokenize --tokenizer "$qwen" --decode --skip-special-tokens
expect_output decode_partial_utf8 '["�"]' '[[378]]' \
  tokenize --tokenizer "$qwen" --decode
expect_output encode_split_special '[[27,91,318,6213,91,29]]' '["<|im_end|>"]' \
  tokenize --tokenizer "$qwen" --split-special-tokens
expect_output tiny_fixture '[[290,264]]' '["Hello world"]' \
  tokenize --tokenizer "$testdata/tiny_pairs.json"

expect_status no_command 2 '' 
expect_status unknown_command 2 '' generate-nonsense
expect_status unknown_flag 2 '[]' tokenize --tokenizer "$qwen" --bogus
expect_status missing_tokenizer_flag 2 '[]' tokenize
expect_status missing_tokenizer_value 2 '[]' tokenize --tokenizer
expect_status help 0 '' --help
expect_status tokenize_help 0 '' tokenize --help
expect_status missing_file 1 '[]' tokenize --tokenizer /nonexistent/tokenizer.json
expect_status bad_json 1 '["unterminated' tokenize --tokenizer "$qwen"
expect_status not_array 1 '{"a": 1}' tokenize --tokenizer "$qwen"
expect_status not_string 1 '["ok", 5]' tokenize --tokenizer "$qwen"
expect_status bad_id 1 '[[1, -5]]' tokenize --tokenizer "$qwen" --decode
expect_status unknown_id 1 '[[999999]]' tokenize --tokenizer "$qwen" --decode
expect_status invalid_utf8 1 $'["\xff"]' tokenize --tokenizer "$qwen"

if [ "$failures" -ne 0 ]; then
  echo "$failures CLI check(s) failed" >&2
  exit 1
fi
echo "all CLI checks passed"
