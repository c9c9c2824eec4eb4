#!/usr/bin/env bash
# Build the libFuzzer targets (build-fuzz/, FP4_FUZZ=ON, clang) and fuzz each for a fixed
# time over its seed corpus (docs/robustness.md "Fuzzing"). The CI stage of .ci/run.
# Usage: bash tests/fuzz/run.sh [SECONDS per target (default 20)] [TARGET...]
# A finding (crash, sanitizer report, leak, timeout, failed round-trip property) fails the
# script; its input is written to build-fuzz/findings/<target>-crash-* (add it to
# tests/fuzz/corpus/<target>/ once fixed: the default build's CTest replays every corpus
# file). New inputs go to build-fuzz/work/<target>/, never into the corpus. Installs clang
# and its runtime (clang, libclang-rt-14-dev) with apt-get if missing, as scripts/setup does.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
secs="${1:-20}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(recipe config checkpoint qtensor token_shard metrics matrix jsonl)

if ! command -v clang++ >/dev/null 2>&1 || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  SUDO=()
  [[ "$(id -u)" == 0 ]] || SUDO=(sudo)
  echo "fuzz: installing clang and libclang-rt-14-dev"
  "${SUDO[@]}" apt-get update
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y clang libclang-rt-14-dev
fi

jobs="$(nproc 2>/dev/null || echo 2)"
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
t0=$SECONDS
cmake -S . -B build-fuzz -DFP4_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  "${launcher[@]}" >/dev/null
cmake --build build-fuzz -j"$jobs"
echo "fuzz: build took $((SECONDS - t0)) s"

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p build-fuzz/findings
# One target per core at a time (CI: 2 cores, so the stage takes about 4 × SECONDS).
run_one() {
  local t=$1 log="build-fuzz/work/$1.log" opts=()
  # The CLI-written checkpoint seed is 65 KB; mutants stay small (the others are a few KB).
  [[ "$t" == checkpoint ]] && opts=(-max_len=8192)
  mkdir -p "build-fuzz/work/$t"
  if ./build-fuzz/fuzz_"$t" "build-fuzz/work/$t" "tests/fuzz/corpus/$t" "${opts[@]}" \
      -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/findings/$t-" >"$log" 2>&1; then
    echo "fuzz: $t: $(grep -E '^#[0-9]+' "$log" | tail -1 | sed -E 's/^#([0-9]+)[[:space:]]+[A-Z]+[[:space:]]+(cov: [0-9]+ ft: [0-9]+).*/\1 runs, \2/')"
  else
    echo "fuzz: $t: FINDING (log: $log)" >&2
    grep -E 'ERROR|SUMMARY|property failed|Test unit written' "$log" | head -5 >&2 || true
    return 1
  fi
}
t1=$SECONDS
failed=()
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  rm -f "build-fuzz/work/$t.failed"
  { run_one "$t" || touch "build-fuzz/work/$t.failed"; } &
done
wait
for t in "${targets[@]}"; do
  if [[ -f "build-fuzz/work/$t.failed" ]]; then failed+=("$t"); fi
done
echo "fuzz: fuzzing took $((SECONDS - t1)) s"
if ((${#failed[@]})); then
  echo "fuzz: findings in: ${failed[*]} (inputs in build-fuzz/findings/)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs} s each, no finding"
