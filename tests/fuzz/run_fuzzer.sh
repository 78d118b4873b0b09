#!/usr/bin/env bash
# Runs the fuzz targets of tests/fuzz (see CMakeLists.txt there).
#
#   run_fuzzer.sh smoke   BINARY FUZZ_DIR NAME WORK_DIR [libFuzzer flags...]
#       A deterministic run: fixed seed, fixed -runs (given by CTest), from
#       the committed seed corpus into an emptied WORK_DIR, so the source
#       tree is never written to.
#   run_fuzzer.sh regress BINARY FUZZ_DIR NAME
#       Runs every stored reproducer of NAME once.
#   run_fuzzer.sh valgrind VALGRIND FUZZ_DIR REPLAY_REGEX REPLAY_LOAD REPLAY_ENCODE
#       Replays the regex and tokenizer seeds and reproducers under valgrind.
#   run_fuzzer.sh open    BINARY FUZZ_DIR NAME CORPUS_DIR [libFuzzer flags...]
#       Open-ended fuzzing (make fuzz), keeping what it finds in CORPUS_DIR.
#
# Every run caps memory (-rss_limit_mb, -malloc_limit_mb) and time per input
# (-timeout): a hostile input must fail fast and small, so exceeding these is
# a finding, like a crash.
set -euo pipefail

mode=$1
shift
limits=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10)

case "$mode" in
  smoke)
    binary=$1 fuzz_dir=$2 name=$3 work=$4
    shift 4
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts"
    exec "$binary" -seed=1 "${limits[@]}" -dict="$fuzz_dir/$name.dict" \
      -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$@" \
      "$work/corpus" "$fuzz_dir/corpus/$name"
    ;;
  regress)
    binary=$1 fuzz_dir=$2 name=$3
    shopt -s nullglob
    inputs=("$fuzz_dir/regressions/$name"/* "$fuzz_dir/corpus/$name"/*)
    if [ ${#inputs[@]} -eq 0 ]; then
      echo "no stored inputs for $name" >&2
      exit 1
    fi
    exec "$binary" "${limits[@]}" "${inputs[@]}"
    ;;
  valgrind)
    valgrind=$1 fuzz_dir=$2
    shift 2
    status=0
    run() {  # NAME BINARY [valgrind flags...]
      local name=$1 binary=$2
      shift 2
      shopt -s nullglob
      local inputs=("$fuzz_dir/regressions/$name"/* "$fuzz_dir/corpus/$name"/*)
      echo "== $name: ${#inputs[@]} inputs under valgrind $*"
      "$valgrind" --quiet --error-exitcode=99 --track-origins=yes "$@" \
        "$binary" "${inputs[@]}" || status=$?
    }
    # The interpreter, strictly; then the JIT (the path production takes),
    # with its SIMD read-ahead reports suppressed (pcre2_jit.supp).
    DEDIT_FUZZ_REGEX_NO_JIT=1 run regex "$1"
    supp=--suppressions="$fuzz_dir/pcre2_jit.supp"
    run regex "$1" "$supp"
    run tokenizer_load "$2" "$supp"
    run tokenizer_encode "$3" "$supp"
    exit $status
    ;;
  open)
    binary=$1 fuzz_dir=$2 name=$3 corpus=$4
    shift 4
    mkdir -p "$corpus" "$corpus.artifacts"
    exec "$binary" "${limits[@]}" -dict="$fuzz_dir/$name.dict" \
      -artifact_prefix="$corpus.artifacts/" "$@" "$corpus" \
      "$fuzz_dir/corpus/$name" "$fuzz_dir/regressions/$name"
    ;;
  *)
    echo "usage: run_fuzzer.sh smoke|regress|valgrind|open ..." >&2
    exit 2
    ;;
esac
