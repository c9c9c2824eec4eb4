#!/usr/bin/env bash
# bench/matrix_units.sh (docs/performance.md "Measuring a CPU with matrix units"): its usage
# errors exit 2 naming the bad argument, and its two quick stages run against this build and
# leave their logs: the machine header with the BF16 paths' implementations, oneDNN's verbose
# summary with the reorder count, and the blocked path's tests (passed, or skipped where the
# CPU has no BF16 brgemm).
# Usage: matrix_units.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
bdir=$(cd "$(dirname "$bin")" && pwd)
mu="$src/bench/matrix_units.sh"

# Usage errors: exit 2 and a message naming what was wrong.
out=$(bash "$mu" --stages verbose,nonesuch --bin-dir "$bdir" --out "$work/x" 2>&1); rc=$?
[ $rc = 2 ] || fail "unknown stage: exit $rc, expected 2"
grep -q "unknown stage 'nonesuch'" <<< "$out" || fail "unknown stage not named: $out"
[ ! -e "$work/x" ] || fail "a usage error still created the output directory"
out=$(bash "$mu" --frobnicate 2>&1); rc=$?
[ $rc = 2 ] && grep -q "unknown argument '--frobnicate'" <<< "$out" || fail "unknown option: exit $rc, $out"
out=$(bash "$mu" --bin-dir "$work" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "no fp4train in $work" <<< "$out" || fail "missing binaries: exit $rc, $out"
bash "$mu" --help | grep -q -- '--stages LIST' || fail "--help does not list --stages"

# The quick stages.
out=$(bash "$mu" --stages verbose,tests --bin-dir "$bdir" --out "$work/run" 2>&1) ||
  fail "quick stages failed: $out"
# The default path's compute line; the blocked path's, or fp4train's refusal where oneDNN has no
# BF16 brgemm (AVX2 only, or under the caps), and then no blocked whole-step entry.
m="$work/run/machine.txt"
grep -Eq '^default path: compute: .*BF16 GEMM (native|widened)' "$m" || fail "no default path: $(cat "$m")"
if grep -q '^blocked path: compute: .*BF16 GEMM blocked' "$m"; then
  grep -q '^whole-step entries: .*bf16@FP4_BF16_GEMM=blocked' "$m" || fail "blocked entries missing"
else
  grep -q '^blocked path: .*error: FP4_BF16_GEMM=blocked' "$m" || fail "no blocked path line: $(cat "$m")"
  ! grep -q '@FP4_BF16_GEMM=blocked' "$m" || fail "blocked entries where the path is refused"
fi
grep -q '^reorders executed: [0-9][0-9]*$' "$work/run/verbose.log" || fail "no reorder count"
grep -Eq '^\[ +(OK|SKIPPED) +\] GemmBf16Blocked\.OwnPackingMatchesOneDnnReorder' \
  "$work/run/tests.log" || fail "the packer test did not run: $(cat "$work/run/tests.log")"
! grep -q FAILED "$work/run/tests.log" || fail "a blocked-path test failed"
echo "matrix_units.sh: ok"
