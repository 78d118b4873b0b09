#!/usr/bin/env bash
# The GPU check's build on this CPU machine: scripts/device_check.sh
# compiles the engine, its tests, dedit-generate and dedit-engine-bench
# with plain g++ from the libraries' CMake source lists, as it does on the
# device machine against CUDA libtorch. Here it builds against Debian's
# libtorch and runs the engine tests on the CPU, so that the script is
# known to build before a session spends device time on it.
#   gpu_build_dry_run.sh SOURCE_DIR OUT_DIR
set -euo pipefail
ROOT=$1
OUT=$2
cd "$ROOT"
scripts/make_device_bundle.sh > /dev/null
rm -rf "$OUT"
mkdir -p "$OUT"
LIBDIR=/usr/lib/$(gcc -print-multiarch)
DEV=cpu SKIP_BENCH=1 ABI=1 TORCH_INC=/usr/include TORCH_LIBDIR="$LIBDIR" \
  scripts/device_check.sh "$OUT" > "$OUT/run.txt" 2>&1 || true
if grep -E "BUILD_FAIL|LINK_FAIL" "$OUT/run.txt"; then
  grep -B3 -A12 "error" "$OUT/run.txt" | head -80
  exit 1
fi
if ! grep -q "\[  PASSED  \]" "$OUT/run.txt" ||
   grep -q "\[  FAILED  \]" "$OUT/run.txt"; then
  tail -60 "$OUT/run.txt"
  exit 1
fi
grep -E "compile:|\[  PASSED  \]" "$OUT/run.txt"
