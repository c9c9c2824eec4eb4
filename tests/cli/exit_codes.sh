#!/usr/bin/env bash
# Exit codes of bad arguments (docs/cli.md "Exit codes"): every subcommand exits 2 with one
# message line on stderr for any bad argument, including the values CLI11 itself rejects (a
# number out of an option's range, one that does not fit its type, a malformed number, an
# unknown option, a missing required argument); --help exits 0. No bad argument may start any
# work.
# Usage: exit_codes.sh <path-to-fp4train> <source-dir>
set -u
BIN="$1"
fail=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf '1 2\n3 4\n' >"$tmp/m.txt"

# bad <name> <expected stderr fragment> <args...>: exit 2, exactly one stderr line holding the
# fragment, nothing on stdout.
bad() {
  local name="$1" want="$2"; shift 2
  timeout 60 "$BIN" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 2 ]; then
    echo "FAIL [$name]: exit $rc, want 2; stderr: $(head -c 300 "$tmp/err")"; fail=1; return
  fi
  if ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL [$name]: stderr lacks '$want': $(cat "$tmp/err")"; fail=1; return
  fi
  if [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
    echo "FAIL [$name]: stderr is not one line: $(cat "$tmp/err")"; fail=1; return
  fi
  if [ -s "$tmp/out" ]; then echo "FAIL [$name]: wrote to stdout: $(head -c 200 "$tmp/out")"; fail=1; return; fi
  echo "ok   [$name] ($(cat "$tmp/err"))"
}

# help <args...>: exit 0 with usage text on stdout.
help() {
  timeout 60 "$BIN" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 0 ] || ! grep -qi "usage" "$tmp/out"; then
    echo "FAIL [help: $*]: exit $rc; stderr: $(head -c 300 "$tmp/err")"; fail=1; return
  fi
  echo "ok   [help: $*]"
}

help --help
for cmd in train eval sample export quant gemm compare report compact profile info configs recipes; do help "$cmd" --help; done

# --steps -5 (range check), a number beyond the option's type, a malformed number.
bad "train --steps -5"             "--steps"        train --steps -5
bad "train --steps 100000000000"   "--steps"        train --steps 100000000000
bad "train --steps 1.5"            "not a whole number" train --steps 1.5
bad "train --steps 2.5e0"          "not a whole number" train --steps 2.5e0
bad "train --steps 1e30"           "out of range"   train --steps 1e30
bad "train --steps 2e9"            "not in range 1 to 1073741824" train --steps 2e9
# A whole number in scientific notation is the number: --steps 1e9 passes the parse, and the
# run stops at the next check (the missing config), not at --steps.
bad "train --steps 1e9 accepted"   "no-such.toml"   train --steps 1e9 --config "$tmp/no-such.toml"
bad "train --peak-gflops abc"      "--peak-gflops"  train --peak-gflops abc
bad "train --recipe ''"            "empty recipe"   train --recipe ""
bad "profile --recipe ' '"         "empty recipe"   profile --recipe " "
bad "info --recipe ''"             "empty recipe"   info --config configs/tiny.toml --recipe ""
bad "eval --recipe ''"             "empty recipe"   eval --recipe ""
bad "train unknown option"         "--bogus"        train --bogus
bad "compare --steps -5"           "--steps"        compare --out "$tmp/c" --steps -5
bad "compare --seeds 1e9"          "--seeds"        compare --out "$tmp/c" --seeds 1e9
bad "compare --seeds abc"          "--seeds"        compare --out "$tmp/c" --seeds abc
bad "compare without --out"        "--out"          compare
bad "export without --out"         "--out"          export --checkpoint x
bad "eval --grad-windows 0"        "--grad-windows" eval --checkpoint x --grad-out g --grad-windows 0
bad "quant --block 100000000000"   "--block"        quant "$tmp/m.txt" --block 100000000000
bad "quant --block -5"             "--block"        quant "$tmp/m.txt" --block -5
bad "quant --target abc"           "--target"       quant "$tmp/m.txt" --target abc
bad "quant --reference 1.2.3"      "--reference"    quant "$tmp/m.txt" --reference 1.2.3
bad "quant --seed -5"              "--seed"         quant "$tmp/m.txt" --seed -5
bad "gemm --block 100000000000"    "--block"        gemm "$tmp/m.txt" "$tmp/m.txt" --block 100000000000
bad "gemm --a-block 100000000000"  "--a-block"      gemm "$tmp/m.txt" "$tmp/m.txt" --a-block 100000000000
bad "gemm --target x"              "--target"       gemm "$tmp/m.txt" "$tmp/m.txt" --target x
bad "gemm missing B"               "B"              gemm "$tmp/m.txt"
bad "eval --windows -5"            "--windows"      eval --checkpoint "$tmp/none" --windows -5
bad "eval --windows 100000000000"  "--windows"      eval --checkpoint "$tmp/none" --windows 100000000000
bad "eval --calib-batches 2.5"     "--calib-batches" eval --checkpoint "$tmp/none" --calib-batches 2.5
bad "eval --init-seed -1"          "--init-seed"    eval --checkpoint "$tmp/none" --init-seed -1
bad "sample --temperature abc"     "--temperature"  sample --checkpoint "$tmp/none" --temperature abc
bad "sample --tokens -5"           "--tokens"       sample --checkpoint "$tmp/none" --tokens -5
bad "info without --config"        "--config"       info
bad "info --bogus"                 "--bogus"        info --config configs/tiny.toml --bogus
bad "unknown command"              "unknown command" frobnicate

# A bad FP4_MAX_CPU_ISA (fp4/base/cpu_isa.h) is a bad argument too; --help still works.
export FP4_MAX_CPU_ISA=bogus
bad "FP4_MAX_CPU_ISA=bogus"        "FP4_MAX_CPU_ISA=bogus is not a SIMD level" train --steps 1
help train --help
unset FP4_MAX_CPU_ISA

# So is a bad FP4_BF16_GEMM (fp4/gemm/gemm.h; docs/gemm.md "The blocked path
# (`FP4_BF16_GEMM=blocked`)").
export FP4_BF16_GEMM=bogus
bad "FP4_BF16_GEMM=bogus"          "FP4_BF16_GEMM='bogus': expected native, blocked or widened" train --steps 1
help train --help
# blocked where oneDNN offers brgemm (the compute line names it), else refused up front
export FP4_BF16_GEMM=blocked
out=$(timeout 60 "$BIN" --version 2>"$tmp/err"); rc=$?
if [ "$rc" -eq 0 ] && grep -q 'BF16 GEMM blocked: oneDNN BF16 brgemm matmul' <<<"$out"; then
  echo "ok   [FP4_BF16_GEMM=blocked: $(grep -o 'BF16 GEMM blocked[^;]*' <<<"$out")]"
elif [ "$rc" -eq 2 ] && grep -q 'FP4_BF16_GEMM=blocked: oneDNN offers no brgemm' "$tmp/err"; then
  echo "ok   [FP4_BF16_GEMM=blocked refused here: $(cat "$tmp/err")]"
else
  echo "FAIL [FP4_BF16_GEMM=blocked]: exit $rc, stdout: $out, stderr: $(cat "$tmp/err")"; fail=1
fi
# under FP4_MAX_CPU_ISA=AVX2 the variable must not lift the cap on oneDNN: widened runs at
# ISA avx2, and blocked is refused (oneDNN has no brgemm there)
export FP4_MAX_CPU_ISA=AVX2 FP4_BF16_GEMM=widened
out=$(timeout 60 "$BIN" --version 2>"$tmp/err"); rc=$?
if [ "$rc" -eq 0 ] && grep -q 'FP32 GEMM oneDNN [0-9.]* sgemm, ISA avx2;' <<<"$out"; then
  echo "ok   [FP4_MAX_CPU_ISA=AVX2 FP4_BF16_GEMM=widened: oneDNN capped]"
else
  echo "FAIL [FP4_MAX_CPU_ISA=AVX2 FP4_BF16_GEMM=widened]: exit $rc, stdout: $out"; fail=1
fi
export FP4_BF16_GEMM=blocked
bad "FP4_MAX_CPU_ISA=AVX2 FP4_BF16_GEMM=blocked" "FP4_BF16_GEMM=blocked: oneDNN offers no brgemm" train --steps 1
unset FP4_BF16_GEMM FP4_MAX_CPU_ISA

# --version (docs/cli.md "The `fp4train` program"): exit 0, the version and the compute paths,
# nothing on stderr.
out=$(timeout 60 "$BIN" --version 2>"$tmp/err"); rc=$?
if [ "$rc" -ne 0 ] || ! grep -q '^fp4train [0-9]*\.[0-9]*\.[0-9]*$' <<<"$out" ||
   ! grep -q '^compute: .*FP32 GEMM' <<<"$out" || [ -s "$tmp/err" ]; then
  echo "FAIL [--version]: exit $rc, stdout: $out, stderr: $(cat "$tmp/err")"; fail=1
else
  echo "ok   [--version]"
fi

exit $fail
