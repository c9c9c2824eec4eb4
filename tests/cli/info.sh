#!/usr/bin/env bash
# `fp4train info`: the Nemotron-H 8B config described without building it (instantly, in a
# few MiB): its JSON (parameter count, FLOPs, memory by part, every linear's mode under
# nvfp4-te), the text output's parameter line, --set, and bad input refused with exit 2.
# Usage: info.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
py=python3
cfg8b="$src/configs/nemotron-h-8b.toml"

# --- bad input: one line on stderr, exit 2 -------------------------------------------------
bad() {  # bad <stderr fragment> <args...>
  local want=$1; shift
  "$bin" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "exit $rc (want 2) for: $* ($(cat "$work/err"))"
  grep -qF -- "$want" "$work/err" || fail "stderr for '$*' lacks '$want': $(cat "$work/err")"
  [ "$(wc -l <"$work/err")" -eq 1 ] || fail "stderr not one line for '$*': $(cat "$work/err")"
  [ ! -s "$work/out" ] || fail "stdout not empty for '$*'"
}
bad "missing.toml" info --config "$work/missing.toml"
bad "unknown recipe 'nope'" info --config "$cfg8b" --recipe nope
bad "model.pattern" info --config "$cfg8b" --set 'model.pattern=M-X'
bad "--config" info
bad "configs/recipes/missing.toml" info --config "$cfg8b" --recipe configs/recipes/missing.toml

# --- paths as in the source tree, from another working directory: --config and a --recipe
# .toml path are both found through the source tree (the binary's FP4_SOURCE_DIR).
(cd "$work" && "$bin" info --config configs/tiny.toml --recipe configs/recipes/nvfp4-te.toml) \
  >"$work/rel.txt" 2>&1 || fail "info with source-tree paths from $work failed: $(cat "$work/rel.txt")"
grep -q "recipe nvfp4-te" "$work/rel.txt" || fail "info did not load configs/recipes/nvfp4-te.toml: $(head -2 "$work/rel.txt")"

# --- JSON of the 8B under nvfp4-te ---------------------------------------------------------
# ulimit -v: the 8B model's buffers (hundreds of GiB) are never allocated. Not in the
# sanitizer build (scripts/test --sanitize): AddressSanitizer reserves terabytes of shadow
# address space at start, which no such limit allows.
vlimit=4000000
if command -v ldd >/dev/null 2>&1 && ldd "$bin" 2>/dev/null | grep libasan >/dev/null; then vlimit=unlimited; fi
( ulimit -v "$vlimit"; timeout 20 "$bin" info --config "$cfg8b" --recipe nvfp4-te --json ) \
  >"$work/8b.json" 2>"$work/err" || fail "info --json failed: $(cat "$work/err")"
$py - "$work/8b.json" <<'PY' || fail "8B JSON wrong"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["parameters"] == 8084075520, j["parameters"]
assert isinstance(j["parameters"], int)
assert j["blocks"] == 52 and len(j["pattern"]) == 52 and j["pattern"].count("M") == 24
assert j["pattern"].count("*") == 4 and j["pattern"].count("-") == 24
lin = j["linears"]
assert len(lin) == 113, len(lin)
assert lin[-1]["name"] == "lm_head" and lin[-1]["mode"] == "fp32" and lin[-1]["shape"] == [131072, 4096]
assert all(l["mode"] in ("fp4", "bf16", "fp32") for l in lin)
body = lin[:-1]
assert sum(l["mode"] == "fp4" for l in body) == 96
bf16 = {l["name"] for l in body if l["mode"] == "bf16"}
want = {f"layers.{b}.mixer.{k}" for b in (44, 46, 48, 50) for k in ("in_proj", "out_proj")}
want |= {f"layers.{b}.mixer.{k}" for b in (45, 47, 49, 51) for k in ("up_proj", "down_proj")}
assert bf16 == want, sorted(bf16 ^ want)
assert j["mode_counts"] == {"fp4": 96, "bf16": 16, "fp32": 0}, j["mode_counts"]
assert lin[0]["name"] == "layers.0.mixer.in_proj" and lin[0]["shape"] == [18560, 4096]
# FLOPs: 6 (N - V d) + 4 attention blocks 12 H hd T + 24 Mamba blocks 12 d_inner N.
V, d, T = 131072, 4096, 8192
fpt = 6 * (8084075520 - V * d) + 4 * 12 * 32 * 128 * T + 24 * 12 * 8192 * 128
assert abs(j["flops_per_token"] - fpt) <= 1e-9 * fpt, (j["flops_per_token"], fpt)
assert abs(j["flops_per_step"] - fpt * 768 * 8192) <= 1e-9 * j["flops_per_step"]
m = j["memory_bytes"]
for k in ("params", "grads", "adamw", "activations", "logits", "backward_scratch",
          "linear_scratch", "linear_workspace", "total"):
    assert isinstance(m[k], int) and m[k] >= 0, k
assert m["params"] == m["grads"] == 4 * 8084075520 and m["adamw"] == 8 * 8084075520
assert m["logits"] == 4 * 768 * 8192 * V
assert m["total"] == sum(v for k, v in m.items() if k != "total")
PY

# --- text: the parameter line and the override listing ---------------------------------------
out=$("$bin" info --config "$cfg8b") || fail "info failed"
grep -qx 'parameters: 8,084,075,520 (8.08 B)' <<<"$out" || fail "parameter line: $(echo "$out" | grep parameters)"
grep -q '^modes: 112 FP4-eligible linears: 112 fp4, 0 bf16, 0 fp32; + lm_head fp32; FP4 GEMM decoded-bf16$' <<<"$out" \
  || fail "modes line: $(echo "$out" | grep modes)"
grep -q 'estimate' <<<"$out" || fail "the per-linear copies are not marked as an estimate"
# the FP4 GEMM as resolved: decoded where decoded-bf16 cannot carry the recipe; none without FP4
out=$("$bin" info --config "$cfg8b" --recipe quartet2) || fail "info quartet2 failed"
grep -q '; + lm_head fp32; FP4 GEMM decoded$' <<<"$out" || fail "quartet2 modes line: $(echo "$out" | grep modes)"
out=$("$bin" info --config "$cfg8b" --recipe fp32) || fail "info fp32 failed"
grep -q '; + lm_head fp32$' <<<"$out" || fail "fp32 modes line: $(echo "$out" | grep modes)"
out=$("$bin" info --config "$cfg8b" --recipe ue5m3-b16-t2048) || fail "info t2048 failed"
grep -q '^override\[0\] .*-> 4 linears: layers.45.mixer.down_proj, layers.47.mixer.down_proj, layers.49.mixer.down_proj, layers.51.mixer.down_proj$' <<<"$out" \
  || fail "override line: $(echo "$out" | grep '^override')"
[ "$(echo "$out" | grep -c 'changed by override\[0\]')" -eq 4 ] || fail "override marks"

# --- --set: a config and a recipe key ----------------------------------------------------------
"$bin" info --config "$cfg8b" --set train.batch_size=1 --set high_precision.final_blocks_fraction=0 \
  --recipe nvfp4-te --json >"$work/s.json" || fail "info --set failed"
$py - "$work/s.json" <<'PY' || fail "--set JSON wrong"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["tokens_per_step"] == 8192 and j["mode_counts"]["bf16"] == 0, j["mode_counts"]
PY
echo "info: ok"
