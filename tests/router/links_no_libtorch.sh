#!/usr/bin/env bash
# The router and dedit-cli run no model, so they must not link libtorch (the
# router image ships none): fails if ldd finds libtorch/libc10 in any binary
# given, or if a binary does not exist.
set -euo pipefail
status=0
for bin in "$@"; do
  if [ ! -x "$bin" ]; then
    echo "FAIL: $bin is not an executable"; status=1; continue
  fi
  deps=$(ldd "$bin")
  if grep -E 'lib(torch|c10)[^ ]*\.so' <<<"$deps"; then
    echo "FAIL: $(basename "$bin") links libtorch"; status=1
  else
    echo "ok: $(basename "$bin") links no libtorch ($(wc -l <<<"$deps") shared libraries)"
  fi
done
exit $status
