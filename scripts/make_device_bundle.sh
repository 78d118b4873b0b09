#!/usr/bin/env bash
# Copies what scripts/device_check.sh needs from this Debian machine into
# .device/ (git-ignored): abseil (headers + shared libraries), nlohmann-json
# and googletest/googlemock (headers + static libraries). Carry .device to
# the GPU machine with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=/usr/lib/x86_64-linux-gnu
rm -rf .device
mkdir -p .device/include .device/lib
cp -r /usr/include/absl /usr/include/nlohmann /usr/include/gtest /usr/include/gmock .device/include/
for f in "$LIB"/libabsl_*.so; do
  soname=$(basename "$f").20220623
  cp -L "$f" ".device/lib/$soname"
  ln -sf "$soname" ".device/lib/$(basename "$f")"
done
cp "$LIB"/libgtest*.a "$LIB"/libgmock*.a .device/lib/
du -sh .device
