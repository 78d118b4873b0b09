#!/usr/bin/env bash
# Fails, listing the files, when a C++ source differs from what clang-format
# makes of it. Fix with: git ls-files '*.cc' '*.h' | xargs clang-format-14 -i
set -euo pipefail
clang_format=$1
root=$2
if [ -z "$clang_format" ] || [ ! -x "$(command -v "$clang_format")" ]; then
  echo "FAIL: clang-format not found (scripts/install-deps.sh installs it)"
  exit 1
fi
cd "$root"
mapfile -t files < <(git ls-files '*.cc' '*.h' 2>/dev/null || find . -name '*.cc' -o -name '*.h')
bad=()
for f in "${files[@]}"; do
  if ! "$clang_format" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "FAIL: ${#bad[@]} of ${#files[@]} files are not clang-formatted:"
  printf '  %s\n' "${bad[@]}"
  "$clang_format" --dry-run "${bad[0]}" 2>&1 | head -20
  exit 1
fi
echo "ok: ${#files[@]} files clang-formatted"
