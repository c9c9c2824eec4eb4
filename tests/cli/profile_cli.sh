#!/usr/bin/env bash
# `fp4train profile` and the MFU of `fp4train train`: bad input refused; the breakdown's first
# line, its components adding up to the step, MFU consistent with the FLOP count and the
# given rate; the GEMM-rate cache written where FP4_CACHE_DIR says.
# Usage: profile_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
export FP4_CACHE_DIR="$work/fp4cache"
py=python3

micro_setup "$work" steps=10 telemetry_interval=50

# --- bad input -------------------------------------------------------------------------
expect_error "--steps" profile --config "$work/micro.toml" --steps 0
expect_error "--peak-gflops" profile --config "$work/micro.toml" --peak-gflops -3
expect_error "unknown recipe 'nope'" profile --config "$work/micro.toml" --recipe nope
expect_error "does not exist" profile --config "$work/micro.toml" --data "$work/missing"
expect_error "missing.toml" profile --config "$work/missing.toml"

# --- a profile with a given rate ---------------------------------------------------------
out=$("$bin" profile --config "$work/micro.toml" --recipe ue5m3-b16 --steps 3 --warmup 1 \
      --peak-gflops 50 --json "$work/p.json") || fail "profile failed"
echo "$out" | head -1 | grep -Eq '^step: [0-9]+\.[0-9] ms$' || fail "first line: $(echo "$out" | head -1)"
for c in gemm.fprop gemm.dgrad gemm.wgrad quant.rows quant.wgrad-transpose attention rmsnorm loss optimizer; do
  grep -q "^$c " <<<"$out" || fail "component $c missing from: $out"
done
grep -q "MFU .* of 50.0 GFLOP/s FP32 GEMM rate (--peak-gflops)" <<<"$out" || fail "MFU line: $out"
grep -q "peak resident" <<<"$out" || fail "memory line missing from: $out"
[ ! -e "$FP4_CACHE_DIR/gemm_peak.tsv" ] || fail "--peak-gflops must not measure or cache"
$py - "$work/p.json" <<'PY' || fail "profile JSON inconsistent"
import json, sys
j = json.load(open(sys.argv[1]))
comp = j["components"]
frac = sum(c["fraction"] for c in comp.values())
assert abs(frac - 1) < 1e-9, frac
ms = sum(c["ms_per_step"] for c in comp.values())
assert abs(ms - j["mean_step_ms"]) < 0.02 * j["mean_step_ms"], (ms, j["mean_step_ms"])
assert len(j["step_ms"]) == 3 and j["steps"] == 3 and j["warmup"] == 1
# micro model: V 512, C 32, L 2, F 64, T 32; N = L(4C^2 + 2CF + 2C) + C + VC
C, L, F, V, T = 32, 2, 64, 512, 32
N = L * (4 * C * C + 2 * C * F + 2 * C) + C + V * C
assert j["model_flops_per_token"] == 6 * N + 12 * L * C * T, j["model_flops_per_token"]
mfu = j["model_flops_per_token"] * j["tokens_per_s"] / 50e9
assert abs(j["mfu"] - mfu) < 1e-12 * max(1, mfu), (j["mfu"], mfu)
m = j["memory"]
assert m["params"] == m["grads"] and m["adamw"] == 2 * m["params"] > 0
assert j["peak_rss_bytes"] > m["params"]
PY

# --- without a rate: measured once, cached, then read -------------------------------------
"$bin" profile --config "$work/micro.toml" --recipe fp32 --steps 1 --warmup 0 >"$work/o1" || fail "profile (measure) failed"
grep -q "measured now, cached in $FP4_CACHE_DIR/gemm_peak.tsv" "$work/o1" || fail "first profile did not cache: $(cat "$work/o1")"
[ "$(wc -l < "$FP4_CACHE_DIR/gemm_peak.tsv")" -eq 1 ] || fail "cache should have one line"
"$bin" train --config "$work/micro.toml" --recipe fp32 --steps 3 --out "$work/run" >"$work/t1" || fail "train failed"
grep -q "FP32 GEMM rate for MFU: .* (best measured on this machine, cached in" "$work/t1" || fail "train did not read the cache: $(head -3 "$work/t1")"
grep -q "tok/s (MFU [0-9]*%)" "$work/t1" || fail "progress line lacks MFU"
$py - "$work/run/summary.json" <<'PY' || fail "summary MFU inconsistent"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["mfu"] > 0 and s["peak_gflops"] > 0
assert abs(s["mfu"] - s["model_flops_per_token"] * s["tokens_per_s"] / (s["peak_gflops"] * 1e9)) < 1e-12
PY
# --- a slow quantizer path: one warning naming it, in the JSON and in summary.json ---------
# (docs/performance.md "Block sizes and the quantizer's fast path"). ue4m3 scales have no SIMD
# kernel; block 8 has one (no warning); the test hook pretends a slow path for train.
out=$("$bin" profile --config "$work/micro.toml" --recipe ue5m3-b16 --set fp4.scale_format=ue4m3 \
      --steps 1 --warmup 0 --peak-gflops 50 --json "$work/slow.json") || fail "profile (ue4m3) failed"
[ "$(echo "$out" | grep -c '^warning: slow quantizer path')" -eq 1 ] || fail "one slow-path warning expected: $out"
grep -q "scalar reference quantizer (scale format ue4m3 has no SIMD kernel): fprop x, fprop w, dgrad dy, dgrad w, wgrad dy, wgrad x; quantization measured [0-9.]* ms of the [0-9.]* ms step" <<<"$out" \
  || fail "slow-path warning: $out"
$py -c 'import json,sys; assert "ue4m3" in json.load(open(sys.argv[1]))["slow_path"]' "$work/slow.json" || fail "profile JSON lacks slow_path"
out=$("$bin" profile --config "$work/micro.toml" --recipe ue5m3-b16 --set fp4.block=8 --steps 1 \
      --warmup 0 --peak-gflops 50 --json "$work/b8.json") || fail "profile (block 8) failed"
grep -q "slow quantizer path" <<<"$out" && fail "block 8 takes the SIMD kernels: $out"
$py -c 'import json,sys; assert "slow_path" not in json.load(open(sys.argv[1]))' "$work/b8.json" || fail "block 8 JSON has slow_path"
FP4_TEST_FORCE_SLOW_PATH=1 "$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --steps 2 \
  --peak-gflops 50 --out "$work/slowrun" >"$work/t2" 2>"$work/e2" || fail "train (forced slow path) failed"
[ "$(grep -c '^warning: slow quantizer path' "$work/e2")" -eq 1 ] || fail "train: one warning expected: $(cat "$work/e2")"
$py -c 'import json,sys; assert "forced by a test hook" in json.load(open(sys.argv[1]))["slow_path"]' \
  "$work/slowrun/summary.json" || fail "summary.json lacks slow_path"
"$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --steps 2 --peak-gflops 50 \
  --out "$work/fastrun" >/dev/null 2>"$work/e3" || fail "train failed"
grep -q "slow quantizer path" "$work/e3" && fail "train warned without a slow path: $(cat "$work/e3")"
$py -c 'import json,sys; assert "slow_path" not in json.load(open(sys.argv[1]))' "$work/fastrun/summary.json" || fail "fast run has slow_path"
echo "profile_cli: ok"
