#!/usr/bin/env bash
# The rooms of the source tree and the one direction of includes (README "Architecture"):
#   cli -> train -> eval -> nn -> recipe -> gemm -> numerics;  data is used by train and eval;
#   dist (MPI data parallelism) is used by train and cli and itself uses only fp4/error.h
#   (numerics) and fp4/profile.h (recipe).
# Every #include "fp4/..." of a file in a room must name a header of that room or of a room
# below it. Fails listing each offending include. Usage: layering.sh FP4TRAIN_BIN SOURCE_DIR
set -u
src=${2:?source dir}
# Which room each public header belongs to.
room_of() {
  case "$1" in
    fp4/bf16.h|fp4/block_quant.h|fp4/format.h|fp4/hadamard.h|fp4/pack_fast.h|fp4/philox.h|\
    fp4/qtensor.h|fp4/quant_fast.h|fp4/safetensors.h|fp4/telemetry.h|fp4/cpu_isa.h|fp4/error.h|\
    fp4/machine_load.h)
      echo numerics ;;
    fp4/gemm.h|fp4/probe_gemm.h|fp4/signal_mask.h) echo gemm ;;
    fp4/recipe.h|fp4/config.h|fp4/settings.h|fp4/profile.h) echo recipe ;;
    fp4/nn/*) echo nn ;;
    fp4/data.h) echo data ;;
    fp4/eval.h|fp4/report.h|fp4/tasks.h) echo eval ;;
    fp4/train.h|fp4/checkpoint.h|fp4/info.h|fp4/metrics_log.h) echo train ;;
    fp4/dist.h) echo dist ;;
    *) echo unknown ;;
  esac
}
# Rooms a room may include (itself and everything below it).
allowed() {
  case "$1" in
    numerics) echo "numerics" ;;
    gemm) echo "numerics gemm" ;;
    recipe) echo "numerics gemm recipe" ;;
    nn) echo "numerics gemm recipe nn" ;;
    data) echo "numerics data" ;;
    dist) echo "numerics recipe dist" ;;
    eval) echo "numerics gemm recipe nn data eval" ;;
    train) echo "numerics gemm recipe nn data eval dist train" ;;
    cli) echo "numerics gemm recipe nn data eval dist train" ;;
  esac
}
fail=0
check_file() {  # file room
  local f=$1 room=$2 inc r
  while IFS= read -r inc; do
    r=$(room_of "$inc")
    if [ "$r" = unknown ]; then
      echo "layering: $f includes $inc, a header of no room (add it to tests/cli/layering.sh)"
      fail=1
    elif ! [[ " $(allowed "$room") " == *" $r "* ]]; then
      echo "layering: $f (room $room) includes $inc (room $r), a room above it"
      fail=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\(fp4\/[^"]*\)".*/\1/p' "$f")
  # A relative include may only name a file of the same room (no "../").
  while IFS= read -r inc; do
    echo "layering: $f includes \"$inc\": reach other rooms through include/fp4/ headers"
    fail=1
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\.\.\/[^"]*\)".*/\1/p' "$f")
}
n=0
for room in numerics gemm recipe nn data dist eval train cli; do
  for f in "$src"/src/"$room"/*.cpp "$src"/src/"$room"/*.h "$src"/src/"$room"/*.inc; do
    [ -e "$f" ] || continue
    check_file "$f" "$room"; n=$((n + 1))
  done
done
for f in $(cd "$src/include" && find fp4 -name '*.h' | sort); do
  check_file "$src/include/$f" "$(room_of "$f")"; n=$((n + 1))
done
# Every source directory is a known room.
for d in "$src"/src/*/; do
  case "$(basename "$d")" in
    numerics|gemm|recipe|nn|data|dist|eval|train|cli) ;;
    *) echo "layering: src/$(basename "$d") is not a room of tests/cli/layering.sh"; fail=1 ;;
  esac
done
[ "$fail" = 0 ] && echo "layering: $n files, includes run one way"
exit $fail
