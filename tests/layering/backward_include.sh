#!/usr/bin/env bash
# The build itself refuses a backward include between rooms (CMakeLists.txt `fp4_room`):
# builds two probe objects with the include directories of the nn room. The one including a
# header of a room below (recipe) must compile; the one including a header of a room above
# (train) must fail, because that header is not on nn's include path.
# Usage: backward_include.sh BUILD_DIR
set -u
build=${1:?build dir}
log=$(mktemp); trap 'rm -f "$log"' EXIT
if ! cmake --build "$build" --target fp4_layering_probe_below > "$log" 2>&1; then
  cat "$log"; echo "FAIL: nn including a recipe header (below it) did not compile"; exit 1
fi
if cmake --build "$build" --target fp4_layering_probe_above > "$log" 2>&1; then
  echo "FAIL: nn including fp4/train/train.h (a room above it) compiled: the rooms do not enforce the layering"
  exit 1
fi
if ! grep -q 'fp4/train/train.h: No such file' "$log"; then
  cat "$log"; echo "FAIL: the backward include failed, but not because the header was out of reach"; exit 1
fi
echo "backward_include: nn sees recipe's headers, not train's ('fp4/train/train.h: No such file')"
