#!/usr/bin/env bash
# Fails, listing them, when a function (lambdas included) in a tracked C++
# source outside tests/ is longer than MAX lines (default 150), headers
# included. A declarative table (metric registration, a flag list) may be
# longer when `NOLINT(readability-function-size)` stands within the three
# lines above its first line. Function extents come from universal-ctags.
#   check_function_size.sh CTAGS ROOT [MAX]
set -euo pipefail
ctags=$1
root=$2
max=${3:-150}
if [ -z "$ctags" ] || ! "$ctags" --version 2>/dev/null | grep -q "Universal Ctags"; then
  echo "FAIL: universal-ctags not found (scripts/install-deps.sh installs it)"
  exit 1
fi
cd "$root"
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v '^tests/')
report=$("$ctags" -x --_xformat="%{end} %{line} %{input} %{name}" \
  --kinds-C++=f --fields=+ne --language-force=C++ "${files[@]}" 2>/dev/null |
  awk -v max="$max" '{ n = $1 - $2 + 1; if (n > max) print n, $3, $2, $4 }')
bad=0
while read -r n file line name; do
  [ -z "$n" ] && continue
  from=$((line > 3 ? line - 3 : 1))
  if sed -n "${from},${line}p" "$file" | grep -q 'NOLINT(readability-function-size)'; then
    echo "ok (marked table): $file:$line $name, $n lines"
    continue
  fi
  echo "FAIL: $file:$line $name is $n lines (at most $max)"
  bad=$((bad + 1))
done <<<"$report"
if [ "$bad" -gt 0 ]; then
  echo "FAIL: $bad functions over $max lines"
  exit 1
fi
echo "ok: ${#files[@]} files, no function over $max lines"
