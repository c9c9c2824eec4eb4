#!/usr/bin/env bash
# bench/matrix_units.sh (docs/performance.md "Measuring a CPU with matrix units"): its usage
# errors exit 2 naming the bad argument, and its two quick stages run against this build and
# leave their logs: the machine header with the BF16 paths' implementations, oneDNN's verbose
# summary with the reorder count, and the blocked path's tests (passed, or skipped where the
# CPU has no BF16 brgemm); and its summary of logs against the targets (--summary).
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
for a in --out --stages --summary; do  # an option without its value
  out=$(bash "$mu" $a 2>&1); rc=$?
  [ $rc = 2 ] && grep -q -- "$a needs a value" <<< "$out" || fail "$a without a value: exit $rc, $out"
done
mkdir "$work/full" && touch "$work/full/step.log"
out=$(bash "$mu" --stages tests --bin-dir "$bdir" --out "$work/full" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "is not empty" <<< "$out" || fail "a non-empty --out: exit $rc, $out"
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
# verbose: the reorder count where the blocked path runs, else the reason it was skipped
if grep -q '^blocked path: compute:' "$m"; then
  grep -q '^reorders executed: [0-9][0-9]*$' "$work/run/verbose.log" || fail "no reorder count"
else
  grep -q '^skipped: oneDNN offers no BF16 brgemm' "$work/run/verbose.log" || fail "verbose not skipped"
fi
# tests: the three binaries' blocked cases, run or skipped, none failed
for t in test_gemm test_gemm_block_scaled test_linear_bf16_gemm; do
  grep -q "^== $t" "$work/run/tests.log" || fail "$t not run"
done
grep -Eq '^\[ +(OK|SKIPPED) +\] GemmBf16Blocked\.OwnPackingMatchesOneDnnReorder' \
  "$work/run/tests.log" || fail "the packer test did not run: $(cat "$work/run/tests.log")"
grep -Eq '^\[ +(OK|SKIPPED) +\] Paths/GemmBf16\.BitIdenticalForOneTwoAndThreeThreads/Blocked' \
  "$work/run/tests.log" || fail "the blocked path's thread-count test did not run"
! grep -q FAILED "$work/run/tests.log" || fail "a blocked-path test failed"
# The summary against the targets, from logs in the formats step_time.sh, throughput.sh and
# bench_scan_vs_attention print (the CPU-time ratio and the component table must be ignored).
mkdir "$work/logs"
cat > "$work/logs/throughput.log" <<'LOG'
config small.toml: 4096 tokens/step, 201.4 M model FLOPs/token, 2 threads; FP32 GEMM rate 177.6 GFLOP/s (best measured)

recipe                           median step (ms)  ratio to fp32  tokens/s    MFU   peak RSS
fp32                                       4000.0          1.000       920 104.4%     2339 MiB
bf16                                       1360.0          0.340      1351 153.2%     2968 MiB
bf16@FP4_BF16_GEMM=blocked                  680.0          0.170      1378 156.3%     3000 MiB
ue5m3-b16                                  2400.0          0.600      1087 123.3%     2644 MiB
ue5m3-b16@FP4_BF16_GEMM=blocked            2360.0          0.590      1204 136.5%     2661 MiB

ms/step (median)              fp32        bf16
gemm.wgrad                  1282.9       847.6
LOG
cat > "$work/logs/step.log" <<'LOG'
recipe                           median step (ms)    ratio to fp32
fp32                                        900.0             1.00
ue5m3-b16-paper                             900.0             1.00
LOG
cat > "$work/logs/scan.log" <<'LOG'
threads=1 reps=11 (medians over 22 runs each, ms per block)
 wall-clock
  scan / attention (fwd+bwd): median of per-repetition ratios 0.990 (min 0.9, max 1.1); ratio of medians 0.99
 process CPU time
  scan / attention (fwd+bwd): median of per-repetition ratios 1.500 (min 1.4, max 1.6); ratio of medians 1.5
LOG
sum=$(bash "$mu" --summary "$work/logs") || fail "--summary failed: $sum"
expect_line() { grep -Eq "$1" <<< "$sum" || fail "summary lacks /$1/: $sum"; }
expect_line '^small +bf16 / fp32 +0\.34 +target <= 0\.35 +met$'
expect_line '^small +bf16 blocked / default +0\.50 +blocked faster$'
expect_line '^small +ue5m3-b16 / fp32 +0\.60 +target <= 0\.5 +not met$'
expect_line '^small +ue5m3-b16 blocked / default +0\.98 +within 3%$'
expect_line '^tiny +ue5m3-b16-paper / fp32 +1\.00 +target <= 1\.0 +met$'  # at the limit
expect_line '^scan +scan / attention, 1 thread\(s\) +0\.99 +target <= 1\.0 +met$'
[ "$(grep -c '^scan' <<< "$sum")" = 1 ] || fail "the CPU-time scan ratio was summarised: $sum"
! grep -q 'ue5m3-b16-paper / fp32' <<< "$(grep '^small' <<< "$sum")" || fail "a missing entry summarised"
mkdir "$work/empty"
bash "$mu" --summary "$work/empty" | grep -q '^summary: no step, throughput or scan figures' ||
  fail "--summary of a directory without logs says nothing"
out=$(bash "$mu" --summary "$work/none" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "no directory" <<< "$out" || fail "--summary of a missing directory: exit $rc, $out"
echo "matrix_units.sh: ok"
