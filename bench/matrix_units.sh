#!/usr/bin/env bash
# The measurements that decide the BF16 GEMM paths on a CPU with matrix units (Intel AMX), in
# one run: docs/performance.md "Measuring a CPU with matrix units" says what each stage
# decides. Every stage also runs on a CPU without them (its figures are that CPU's; where oneDNN
# has no BF16 brgemm at all, the blocked parts are skipped and the header says why).
# Usage: bash bench/matrix_units.sh [--out DIR] [--stages LIST] [--bin-dir DIR]
#        bash bench/matrix_units.sh --summary DIR    only the summary of an earlier run's logs
#   --out DIR      where each stage's log goes, a new or empty directory (default
#                  build/matrix_units/<UTC time>)
#   --stages LIST  comma-separated, in the order to run (default every stage but identity):
#     verbose     which oneDNN implementation and weight layout the blocked path gets, and
#                 whether oneDNN reorders its panels (ONEDNN_VERBOSE, one shape)
#     tests       the blocked path's tests in test_gemm, test_gemm_block_scaled and
#                 test_linear_bf16_gemm (packer and transpose against their twins, bounds,
#                 thread-count invariance; the packer against oneDNN's reorder is skipped where
#                 the layout is not one it writes)
#     gemm        BM_Bf16BlockedVsNative, 5 repetitions, medians
#     rates       the GEMM rates at 4096 x 1024 x 1024 against sgemm, default path then blocked
#     step        bench/step_time.sh on configs/tiny.toml, both paths of bf16 and ue5m3-b16
#     throughput  bench/throughput.sh on configs/small.toml, the same entries
#     scan        bench_scan_vs_attention --reps 11 --threads 1,2
#     identity    tests/identity/identity.sh check (about 15 minutes on 2 cores)
#   --bin-dir DIR  the build directory holding fp4train, the benchmarks and tests (default build)
# Ends with a summary of the step, throughput and scan figures against the project's targets
# (those of a CPU with AMX; elsewhere read them as a comparison), also in DIR/summary.txt.
# Takes about 40 minutes on 2 cores without identity. Exit 2 on a usage error or a missing
# binary; a stage that fails is reported and the rest still run (exit 1 at the end).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="" stages="verbose,tests,gemm,rates,step,throughput,scan" bdir="$root/build" summary_only=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --out | --stages | --bin-dir | --summary)
      [[ $# -ge 2 && -n $2 ]] || { echo "matrix_units.sh: $1 needs a value (see --help)" >&2; exit 2; }
      case $1 in
        --out) out=$2 ;;
        --stages) stages=$2 ;;
        --bin-dir) bdir=$(cd "$2" && pwd) || exit 2 ;;
        --summary) summary_only=$2 ;;
      esac
      shift 2 ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "matrix_units.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# The summary of the logs in $1 (step.log, throughput.log, scan.log, whichever exist) against
# the targets of docs/performance.md "Measuring a CPU with matrix units".
summarize() {
  python3 - "$1" <<'PY'
import os, re, sys
out = sys.argv[1]

def table(name):  # {entry: ratio to fp32}: the first table of a step_time.sh / throughput.sh log
    path = os.path.join(out, name + ".log")
    if not os.path.exists(path):
        return None
    rows, on = {}, False
    for line in open(path):
        f = line.split()
        if f[:1] == ["recipe"]:
            if on:
                break  # throughput.sh's component table
            on = True
            continue
        if on and len(f) >= 3:
            try:
                rows[f[0]] = float(f[2])
            except ValueError:
                break
    return rows

def verdict(v, limit):
    return "met" if v <= limit else "not met"

lines = []
for cfg, log, targets in (("small", "throughput", (("bf16", 0.35), ("ue5m3-b16", 0.5),
                                                   ("ue5m3-b16-paper", 0.8))),
                          ("tiny", "step", (("ue5m3-b16-paper", 1.0),))):
    rows = table(log)
    if rows is None:
        continue
    for r, limit in targets:
        if r in rows:
            lines.append(f"{cfg:<6} {r + ' / fp32':<30} {rows[r]:>5.2f}  target <= {limit:<4} "
                         f"{verdict(rows[r], limit)}")
    for r in ("bf16", "ue5m3-b16"):
        b = r + "@FP4_BF16_GEMM=blocked"
        if r in rows and b in rows:
            q = rows[b] / rows[r]  # within 3% (this host's loops differ by more): neither faster
            # the default path: native with AMX or on AMD, else widened (the header says which)
            word = "blocked faster" if q < 0.97 else "default faster" if q > 1.03 else "within 3%"
            lines.append(f"{cfg:<6} {r + ' blocked / default':<30} {q:>5.2f}  {word}")
path = os.path.join(out, "scan.log")
if os.path.exists(path):
    threads, wall = "?", False
    for line in open(path):
        m = re.match(r"threads=(\d+)", line)
        if m:
            threads = m.group(1)
        if line.strip() in ("wall-clock", "process CPU time"):
            wall = line.strip() == "wall-clock"
        m = re.search(r"median of per-repetition ratios ([0-9.]+)", line)
        if m and wall:
            v = float(m.group(1))
            lines.append(f"scan   {'scan / attention, ' + threads + ' thread(s)':<30} {v:>5.2f}  "
                         f"target <= 1.0  {verdict(v, 1.0)}")
if lines:
    print('summary (targets: docs/performance.md "Measuring a CPU with matrix units")')
    print("\n".join(lines))
else:
    print("summary: no step, throughput or scan figures in " + out)
PY
}
if [[ -n $summary_only ]]; then
  [[ -d $summary_only ]] || { echo "matrix_units.sh: --summary: no directory '$summary_only'" >&2; exit 2; }
  summarize "$summary_only"
  exit $?
fi

all="verbose tests gemm rates step throughput scan identity"
IFS=, read -ra want <<< "$stages"
[[ ${#want[@]} -gt 0 ]] || { echo "matrix_units.sh: --stages names no stage" >&2; exit 2; }
need=(fp4train)  # the binaries the chosen stages run (fp4train: the header)
for s in "${want[@]}"; do
  case $s in
    verbose | gemm | rates) need+=(bench_gemm) ;;
    tests) need+=(test_gemm test_gemm_block_scaled test_linear_bf16_gemm) ;;
    scan) need+=(bench_scan_vs_attention) ;;
    step | throughput | identity) ;;
    *) echo "matrix_units.sh: unknown stage '$s' (one of: $all)" >&2; exit 2 ;;
  esac
done
for b in "${need[@]}"; do
  [[ -x $bdir/$b ]] || { echo "matrix_units.sh: no $b in $bdir (bash scripts/build)" >&2; exit 2; }
done
out=${out:-$root/build/matrix_units/$(date -u +%Y%m%dT%H%M%SZ)}
if [[ -n $(ls -A "$out" 2>/dev/null) ]]; then  # the summary would read old logs there
  echo "matrix_units.sh: --out $out is not empty" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
# Where oneDNN offers no BF16 brgemm (AVX2 only, or under the ISA caps) fp4train refuses the
# blocked path: its benchmark runs and whole-step entries are left out.
blocked=1
FP4_BF16_GEMM=blocked "$bdir/fp4train" --version > /dev/null 2>&1 || blocked=0
entries=(fp32 bf16 ue5m3-b16 ue5m3-b16-paper)
[[ $blocked == 0 ]] || entries=(fp32 bf16 bf16@FP4_BF16_GEMM=blocked ue5m3-b16
                                ue5m3-b16@FP4_BF16_GEMM=blocked ue5m3-b16-paper)
rates='(BM_Bf16VsSgemm|BM_BlockScaledVsDecoded|BM_Bf16BlockedVsNative)/M:4096/N:1024/K:1024'
gb=(--benchmark_repetitions=5 --benchmark_report_aggregates_only=true)
no_blocked="skipped: oneDNN offers no BF16 brgemm here (the header's blocked path line)"

# ---- the machine: CPU, matrix-unit flags, commit, oneDNN's ISA and implementations
{
  date -u +%FT%TZ
  lscpu | grep -E '^(Model name|Vendor ID|CPU family|Model|CPU\(s\)):'
  echo "flags: $(grep -m1 -o -wE 'avx2|avx512f|avx512_bf16|amx_tile|amx_bf16|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "default path: $("$bdir/fp4train" --version 2>&1 | tail -1)"
  echo "blocked path: $(FP4_BF16_GEMM=blocked "$bdir/fp4train" --version 2>&1 | tail -1)"
  echo "whole-step entries: ${entries[*]}"
  echo "OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
} | tee "$out/machine.txt"

# ---- the stages: each writes $out/<stage>.log
stage_verbose() {
  [[ $blocked == 1 ]] || { echo "$no_blocked"; return 0; }
  FP4_BF16_GEMM=blocked ONEDNN_VERBOSE=1 "$bdir/bench_gemm" \
    --benchmark_filter='BM_Bf16BlockedVsNative/M:256/N:256/K:4096' --benchmark_min_time=0.05 \
    > "$out/verbose.raw" 2>&1 || return 1
  # one line per distinct primitive (kind, implementation, layouts, shape), with its count
  grep '^onednn_verbose,exec' "$out/verbose.raw" | cut -d, -f4,5,7,10 | sort | uniq -c | sort -rn
  grep -q '^onednn_verbose,exec,cpu,matmul,brg' "$out/verbose.raw" ||
    { echo "no brgemm primitive executed"; return 1; }
  echo "reorders executed: $(grep -c '^onednn_verbose,exec,cpu,reorder' "$out/verbose.raw")"
}
stage_tests() {
  local t rc=0
  for t in test_gemm test_gemm_block_scaled test_linear_bf16_gemm; do
    echo "== $t"
    "$bdir/$t" --gtest_filter='*Blocked*:*blocked*:PackBf16Vnni.*:TransposeBf16.*' 2>&1 |
      grep -E '^\[ +(OK|SKIPPED|FAILED|PASSED) +\]'
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  done
  return $rc
}
stage_gemm() {
  [[ $blocked == 1 ]] || { echo "$no_blocked"; return 0; }
  "$bdir/bench_gemm" --benchmark_filter=BM_Bf16BlockedVsNative "${gb[@]}" 2>&1 |
    grep -E '_median|^Run on|CPU Caches|^---|^Benchmark'
  return "${PIPESTATUS[0]}"
}
stage_rates() {
  echo "== FP4_BF16_GEMM unset (the default path)"
  env -u FP4_BF16_GEMM "$bdir/bench_gemm" --benchmark_filter="$rates" "${gb[@]}" 2>&1 |
    grep -E '_median|^Benchmark' || return 1
  echo "== FP4_BF16_GEMM=blocked (BM_Bf16BlockedVsNative, which runs both paths, is above)"
  [[ $blocked == 1 ]] || { echo "$no_blocked"; return 0; }
  FP4_BF16_GEMM=blocked "$bdir/bench_gemm" \
    --benchmark_filter='(BM_Bf16VsSgemm|BM_BlockScaledVsDecoded)/M:4096/N:1024/K:1024' "${gb[@]}" 2>&1 |
    grep -E '_median|^Benchmark' || return 1
}
stage_step() {
  bash "$root/bench/step_time.sh" --bin "$bdir/fp4train" --steps 10 "${entries[@]}"
}
stage_throughput() {
  bash "$root/bench/throughput.sh" --bin "$bdir/fp4train" --steps 3 --warmup 2 "${entries[@]}"
}
stage_scan() {
  "$bdir/bench_scan_vs_attention" --reps 11 --threads 1,2
}
stage_identity() {
  bash "$root/tests/identity/identity.sh" check "$bdir/fp4train" "$root"
}

failed=()
for s in "${want[@]}"; do
  echo
  echo "==== $s ($(date -u +%TZ))"
  "stage_$s" 2>&1 | tee "$out/$s.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { failed+=("$s"); echo "matrix_units.sh: stage $s failed (log: $out/$s.log)"; }
done
echo
summarize "$out" | tee "$out/summary.txt"
echo "logs in $out"
[[ ${#failed[@]} -eq 0 ]] || { echo "failed stages: ${failed[*]}"; exit 1; }
