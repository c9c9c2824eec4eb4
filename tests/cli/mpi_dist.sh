#!/usr/bin/env bash
# Data parallelism over MPI (fp4/dist/dist.h; docs/recipes.md "Micro-batches and data
# parallelism"): the gradient reduction gives the same bytes for P = 1, 2, 3, 4 processes, equal
# to the single-process tree sum / n (checked inside dist_check on every rank), and the other
# collectives work (tests/mpi/dist_check.cpp). Also fp4train itself starts and ends under
# mpirun. Exits 77 (CTest: skipped) with a "SKIP: ..." line when mpirun is missing or the build
# has no MPI (no dist_check binary).
# Usage: mpi_dist.sh FP4TRAIN_BIN SOURCE_DIR
set -u
bin=${1:?fp4train binary}
check="$(dirname "$bin")/dist_check"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev, then rebuild)"
  exit 77
fi
if [ ! -x "$check" ]; then
  echo "SKIP: $check missing: fp4train was built without MPI (CMake option FP4_MPI)"
  exit 77
fi
# A dist_check left over from an earlier MPI configuration of the same build directory.
if command -v ldd >/dev/null 2>&1 && ! ldd "$bin" | grep 'libmpi' > /dev/null; then
  echo "SKIP: $bin is not linked with MPI (built with FP4_MPI=OFF); $check is stale"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
mpi() {  # P, command...
  local p=$1
  shift
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$p" "$@"
}

# Micro-batch counts per process count: powers of two and non-power-of-two shares
# (n = 6 over 2 and 3, n = 12 over 3: several tree nodes per rank).
declare -A ns=([1]="4 6 8 12" [2]="4 6 8 12" [3]="6 12" [4]="4 8 12")
for p in 1 2 3 4; do
  # shellcheck disable=SC2086
  if ! mpi "$p" "$check" "$tmp/p$p.txt" ${ns[$p]} >"$tmp/log$p.txt" 2>&1; then
    echo "mpi_dist: dist_check with $p processes failed:"
    cat "$tmp/log$p.txt"
    fail=1
  fi
done
# Every (n, len) line of P > 1 must equal P = 1's line (same result bytes), and each P must
# have produced all of its lines.
for p in 2 3 4; do
  [ -s "$tmp/p$p.txt" ] || { echo "mpi_dist: no results from $p processes"; fail=1; continue; }
  want=$(( $(echo "${ns[$p]}" | wc -w) * 4 ))
  got=$(wc -l <"$tmp/p$p.txt")
  [ "$got" = "$want" ] || { echo "mpi_dist: $p processes wrote $got result lines, expected $want"; fail=1; }
  while read -r n len hash; do
    ref=$(awk -v n="$n" -v l="$len" '$1 == n && $2 == l { print $3 }' "$tmp/p1.txt")
    if [ "$ref" != "$hash" ]; then
      echo "mpi_dist: n=$n len=$len: $p processes give $hash, 1 process ${ref:-nothing}"
      fail=1
    fi
  done <"$tmp/p$p.txt"
done

# fp4train under mpirun: MPI initialised and finalised around a command, and rank 0 alone
# prints (the other ranks' stdout goes to /dev/null). Each rank's output to its own file:
# mpirun interleaves the ranks' streams.
# shellcheck disable=SC2016
if ! mpi 2 bash -c '"$0" --help >"$1/help.$OMPI_COMM_WORLD_RANK" 2>&1' "$bin" "$tmp"; then
  echo "mpi_dist: fp4train --help under mpirun -np 2 failed:"
  cat "$tmp"/help.* 2>/dev/null
  fail=1
else
  if ! grep -q '^Usage: ' "$tmp/help.0" 2>/dev/null; then
    echo "mpi_dist: fp4train --help under mpirun -np 2: rank 0 printed no usage:"
    cat "$tmp/help.0" 2>/dev/null
    fail=1
  fi
  if [ -s "$tmp/help.1" ]; then
    echo "mpi_dist: fp4train --help under mpirun -np 2: rank 1 printed (only rank 0 should):"
    cat "$tmp/help.1"
    fail=1
  fi
fi

[ "$fail" = 0 ] && echo "mpi_dist: P = 1, 2, 3, 4 give identical bytes; collectives ok"
exit $fail
