#!/usr/bin/env bash
# The rooms of the source tree (docs/design.md "The house: rooms, and the direction of
# includes"). The build enforces the direction of includes between rooms' .cpp files (each
# room's library sees only its own headers and those of the rooms it links: CMakeLists.txt
# `fp4_room`); this script checks what the compiler cannot see:
#   - src/<room>/ and include/fp4/<room>/ mirror each other, and every room is one of the
#     build's (build/rooms/<room>.rooms, written by CMake; cli has no public headers);
#   - a public header, and every file of src/<room>/ (private headers included), includes only
#     headers of its own room and of the rooms below it, in "..." or <...> form (a header that
#     no file of its room compiles would otherwise slip through);
#   - no include reaches another directory with "../".
# Usage: layering.sh FP4TRAIN_BIN SOURCE_DIR   (the build directory is FP4TRAIN_BIN's)
set -u
bin=${1:?fp4train binary}; src=${2:?source dir}
rooms_dir=$(dirname "$bin")/rooms
fail=0
[ -d "$rooms_dir" ] || { echo "layering: $rooms_dir missing (configure with CMake first)"; exit 1; }
rooms=$(cd "$rooms_dir" && ls *.rooms | sed 's/\.rooms$//')
allowed() { cat "$rooms_dir/$1.rooms"; }
for d in "$src"/src/*/; do
  r=$(basename "$d")
  [ "$r" = cli ] && continue
  [ -f "$rooms_dir/$r.rooms" ] || { echo "layering: src/$r is not a room of the build (CMakeLists.txt fp4_room)"; fail=1; }
done
for r in $rooms; do
  [ -d "$src/src/$r" ] || { echo "layering: room $r has no src/$r/"; fail=1; }
  [ -d "$src/include/fp4/$r" ] || { echo "layering: room $r has no include/fp4/$r/"; fail=1; }
done
# includes_of FILE: the fp4/... headers FILE includes, in "..." or <...> form.
includes_of() {
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]\(fp4\/[^">]*\)[">].*/\1/p' "$1"
}
for f in $(cd "$src/include" && find fp4 -type f | sort); do
  r=$(echo "$f" | cut -d/ -f2)
  if [ ! -f "$rooms_dir/$r.rooms" ]; then
    echo "layering: include/$f is not in a room's directory include/fp4/<room>/"; fail=1; continue
  fi
  while IFS= read -r inc; do
    ir=$(echo "$inc" | cut -d/ -f2)
    if ! [[ " $(allowed "$r") " == *" $ir "* ]]; then
      echo "layering: include/$f (room $r) includes $inc (room $ir), not below it"; fail=1
    fi
  done < <(includes_of "$src/include/$f")
done
# A room's own sources and private headers (src/<room>/): a private header that no source of
# the room compiles would slip past the compiler too. cli may include every room.
for r in $rooms; do
  for f in $(cd "$src" && find "src/$r" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.inc' \) | sort); do
    while IFS= read -r inc; do
      ir=$(echo "$inc" | cut -d/ -f2)
      if ! [[ " $(allowed "$r") " == *" $ir "* ]]; then
        echo "layering: $f (room $r) includes $inc (room $ir), not below it"; fail=1
      fi
    done < <(includes_of "$src/$f")
  done
done
n=0
while IFS= read -r f; do
  n=$((n + 1))
  while IFS= read -r inc; do
    echo "layering: $f includes \"$inc\": reach other rooms through include/fp4/<room>/ headers"
    fail=1
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\.\.\/[^"]*\)".*/\1/p' "$src/$f")
done < <(cd "$src" && find src include -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.inc' \) | sort)
[ "$fail" = 0 ] && echo "layering: $n files in $(echo $rooms | wc -w) rooms + cli; headers include one way, no '../'"
exit $fail
