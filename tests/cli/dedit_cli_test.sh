#!/usr/bin/env bash
# dedit-cli's command line (CTest cli.dedit_cli, label "cli"): exit status
# 0/1/2 per the documented contract, per-command --help, dashed and
# underscored flag names, and a tokenize round trip through the bundled
# tokenizer. Needs no network and no running services.
#
#   dedit_cli_test.sh DEDIT_CLI TOKENIZER_JSON
set -uo pipefail

cli=${1:?dedit-cli path}
tok=${2:?tokenizer.json path}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dedit_cli_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run STDIN ARGS...: runs the CLI; sets rc, out (stdout), err (stderr).
run() {
  local input=$1
  shift
  printf '%s' "$input" | "$cli" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  out=$(cat "$tmp/out")
  err=$(cat "$tmp/err")
}

# expect_status NAME STATUS STDERR_SUBSTRING STDIN ARGS...
expect_status() {
  local name=$1 want=$2 needle=$3 input=$4
  shift 4
  run "$input" "$@"
  [ "$rc" -eq "$want" ] || fail "$name: exit status $rc, want $want ($err)"
  [[ "$err" == *"$needle"* ]] || fail "$name: stderr lacks '$needle': $err"
}

# expect_output NAME EXPECTED_STDOUT STDIN ARGS...
expect_output() {
  local name=$1 expected=$2 input=$3
  shift 3
  run "$input" "$@"
  [ "$rc" -eq 0 ] || fail "$name: exit status $rc ($err)"
  [ "$out" == "$expected" ] || fail "$name: got '$out', want '$expected'"
}

# --- usage errors: exit 2, the reason on stderr -----------------------------
expect_status no_command 2 "usage: dedit-cli <command>" ''
expect_status unknown_command 2 "unknown command 'frobnicate'" '' frobnicate
expect_status unknown_flag 2 "unknown flag '--bogus'" '[]' \
  tokenize --tokenizer "$tok" --bogus
expect_status unknown_dashed_flag 2 "unknown flag '--no-such-flag'" '[]' \
  tokenize --tokenizer "$tok" --no-such-flag
expect_status other_commands_flag 2 "unknown flag '--router'" '[]' \
  tokenize --tokenizer "$tok" --router 127.0.0.1:1
expect_status missing_value 2 "--tokenizer needs a value" '[]' \
  tokenize --tokenizer
expect_status empty_assignment 2 "no value after '='" '[]' tokenize --tokenizer=
expect_status missing_required 2 "--tokenizer is required" '[]' tokenize
expect_status stray_argument 2 "unexpected argument 'extra'" '[]' \
  tokenize --tokenizer "$tok" extra
expect_status bad_bool 2 "decode" '[]' tokenize --tokenizer "$tok" --decode=maybe
expect_status usage_lists_flags 2 "--skip_special_tokens" '[]' tokenize --bogus
expect_status generate_no_prompt 2 "--prompt or --prompt_ids is required" '' \
  generate --router 127.0.0.1:1
expect_status generate_bad_int 2 "max_tokens" '' \
  generate --prompt hi --max-tokens lots
expect_status generate_bad_ids 2 "bad --prompt_ids" '' \
  generate --prompt-ids 1,two,3
expect_status generate_list_twice 2 "--stop given twice" '' \
  generate --prompt hi --stop a --stop b

# --- help: exit 0, on stdout ------------------------------------------------
run '' --help
[ "$rc" -eq 0 ] || fail "help: exit status $rc"
for c in tokenize generate; do
  [[ "$out" == *"$c"* ]] || fail "help lacks the $c command: $out"
done
run '' tokenize --help
[ "$rc" -eq 0 ] || fail "tokenize --help: exit status $rc"
for f in --tokenizer --decode --skip_special_tokens --split_special_tokens; do
  [[ "$out" == *"$f"* ]] || fail "tokenize --help lacks $f: $out"
done
[[ "$out" != *"--router"* ]] || fail "tokenize --help lists generate's flags"
run '' generate -h
[ "$rc" -eq 0 ] || fail "generate -h: exit status $rc"
for f in --router --prompt --prompt_ids --chat --max_tokens --window \
  --passes --no_speculation --stop --ignore_eos --timeout_s; do
  [[ "$out" == *"$f"* ]] || fail "generate -h lacks $f: $out"
done

# --- runtime errors: exit 1 -------------------------------------------------
expect_status missing_file 1 "dedit-cli tokenize:" '[]' \
  tokenize --tokenizer "$tmp/none.json"
expect_status bad_json 1 "input" '["open' tokenize --tokenizer "$tok"
expect_status unknown_id 1 "vocabulary" '[[99999999]]' \
  tokenize --tokenizer "$tok" --decode
expect_status router_down 1 "UNAVAILABLE" '' \
  generate --router 127.0.0.1:1 --prompt-ids 1,2,3 --timeout-s 10

# --- tokenize round trip with the bundled tokenizer --------------------------
texts='["def add(a, b):\n    return a + b\n","Hello, world!","",'\
'"<|im_start|>user\nhi<|im_end|>"]'
run "$texts" tokenize --tokenizer "$tok"
[ "$rc" -eq 0 ] || fail "encode: exit status $rc ($err)"
ids=$out
[[ "$ids" == "[["*"]]" ]] || fail "encode: not id arrays: $ids"
expect_output round_trip "$texts" "$ids" tokenize --tokenizer "$tok" --decode

# Every spelling of a flag means the same.
expect_output equals_form "$ids" "$texts" tokenize "--tokenizer=$tok"
expect_output single_dash "$ids" "$texts" tokenize -tokenizer "$tok"
expect_output decode_true "$texts" "$ids" \
  tokenize --tokenizer "$tok" --decode=true
expect_output nodecode "$ids" "$texts" tokenize --tokenizer "$tok" --nodecode

# Special tokens: dropped on decode with either spelling; split on encode.
run '["<|im_start|>user\nhi<|im_end|>"]' tokenize --tokenizer "$tok"
chat_ids=$out
expect_output skip_dashed '["user\nhi"]' "$chat_ids" \
  tokenize --tokenizer "$tok" --decode --skip-special-tokens
expect_output skip_underscored '["user\nhi"]' "$chat_ids" \
  tokenize --tokenizer "$tok" --decode --skip_special_tokens
run '["<|im_end|>"]' tokenize --tokenizer "$tok"
whole=$out
for spelling in --split-special-tokens --split_special_tokens; do
  run '["<|im_end|>"]' tokenize --tokenizer "$tok" "$spelling"
  [ "$rc" -eq 0 ] || fail "$spelling: exit status $rc ($err)"
  [ "$out" != "$whole" ] || fail "$spelling changed nothing: $out"
done

if [ "$failures" -ne 0 ]; then
  echo "$failures dedit-cli check(s) failed" >&2
  exit 1
fi
echo "all dedit-cli checks passed"
