#!/usr/bin/env bash
# CLI checks of `fp4train gemm A B`: a hand-checkable product, JSON output, and a non-zero
# exit with a message naming the problem on bad input.
# Usage: gemm_cli.sh <path-to-fp4train> <source-dir>
set -u
BIN="$1"
fail=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Hand-checkable case. Every row holds a ±6 in each block of 4, and --target 1 with references
# 6 gives ge = (1·6)/6 = 1, so every block scale is 6·(1·fl(1/6)) = 1 (RNE) and every value
# (all on the E2M1 grid) is quantized exactly: C = A·Bᵀ exactly, α = 1, nothing to round.
#   A = [6 1 0.5 -2; 0 3 6 1.5],  B = [1 0 0 6; 6 -6 4 0.5]  (B is [N, K])
#   C[0,0] = 6 - 12 = -6;  C[0,1] = 36 - 6 + 2 - 1 = 31;  C[1,0] = 9;  C[1,1] = -18 + 24 + 0.75 = 6.75
printf '6 1 0.5 -2\n0 3 6 1.5\n' >"$tmp/A.txt"
printf '1 0 0 6\n6 -6 4 0.5\n' >"$tmp/B.txt"
want=$'-6 31\n9 6.75'
for mode in probe-matched decoded decoded-bf16; do
  got="$("$BIN" gemm "$tmp/A.txt" "$tmp/B.txt" --block 4 --target 1 --reference-a 6 --reference-b 6 \
         --mode "$mode" 2>"$tmp/err")" || { echo "FAIL [hand, $mode]: $(cat "$tmp/err")"; fail=1; }
  if [ "$got" == "$want" ]; then echo "ok   [hand-checked product, $mode]"; else
    echo "FAIL [hand, $mode]: got '$got', want '$want'"; fail=1; fi
done
# Default mode is probe-matched; B in 2-D tiles and per-operand formats give the same exact C.
got="$("$BIN" gemm "$tmp/A.txt" "$tmp/B.txt" --block 4 --b-2d --a-scale-format e4m3 \
       --b-scale-format ue8m0 --target 1 --reference-a 6 --reference-b 6 2>"$tmp/err")"
if [ "$got" == "$want" ]; then echo "ok   [per-operand options, b-2d]"; else
  echo "FAIL [per-operand options]: got '$got' ($(cat "$tmp/err"))"; fail=1; fi

# The 1/1024 snap is visible: A = B = [6], block 1, --target 1 and g = 6144 give ge = 6/6144 =
# 2^-10, c_b = 6·(2^-10·fl(1/6)) = 2^-10, d_b = c_b·gd = 1, q = 6. Probe-matched: the unscaled
# product (6·2^-10)^2 = 36·2^-20 is below half the 1/1024 grid and snaps to 0 before α = 2^20;
# decoded: 6·6 = 36.
printf '6\n' >"$tmp/a1.txt"
printf '6\n' >"$tmp/b1.txt"
got_p="$("$BIN" gemm "$tmp/a1.txt" "$tmp/b1.txt" --block 1 --target 1 --reference-a 6144 --reference-b 6144)"
got_d="$("$BIN" gemm "$tmp/a1.txt" "$tmp/b1.txt" --block 1 --target 1 --reference-a 6144 --reference-b 6144 --mode decoded)"
if [ "$got_p" == "0" ] && [ "$got_d" == "36" ]; then echo "ok   [1/1024 snap: probe-matched 0, decoded 36]"; else
  echo "FAIL [snap]: probe-matched '$got_p' (want 0), decoded '$got_d' (want 36)"; fail=1; fi
# decoded-bf16: operands q·c_b = 6·2^-10 each, P = 36·2^-20 exact (no snap), times
# gd_a·gd_b = 2^10·2^10: 36.
got_b="$("$BIN" gemm "$tmp/a1.txt" "$tmp/b1.txt" --block 1 --target 1 --reference-a 6144 --reference-b 6144 --mode decoded-bf16)"
if [ "$got_b" == "36" ]; then echo "ok   [decoded-bf16: 36, no snap]"; else
  echo "FAIL [decoded-bf16]: got '$got_b' (want 36)"; fail=1; fi
# decoded-bf16 refuses UE8M0 tensor-scaled operands with a target outside [2^-24, 2^48] (q·c_b
# would overflow FP32 where the decoded mode stays finite) and spelled scale formats.
if "$BIN" gemm "$tmp/A.txt" "$tmp/B.txt" --mode decoded-bf16 --scale-format ue8m0 --target 1e19 \
     >/dev/null 2>"$tmp/err"; then echo "FAIL [decoded-bf16 ue8m0 T=1e19 accepted]"; fail=1
elif grep -q "2^48" "$tmp/err"; then echo "ok   [decoded-bf16 refuses ue8m0 at T = 1e19]"; else
  echo "FAIL [decoded-bf16 ue8m0 message]: $(cat "$tmp/err")"; fail=1; fi
if "$BIN" gemm "$tmp/A.txt" "$tmp/B.txt" --mode decoded-bf16 --scale-format ue4m3 \
     >/dev/null 2>"$tmp/err"; then echo "FAIL [decoded-bf16 ue4m3 accepted]"; fail=1
elif grep -q "ue4m3" "$tmp/err"; then echo "ok   [decoded-bf16 refuses a spelled scale format]"; else
  echo "FAIL [decoded-bf16 ue4m3 message]: $(cat "$tmp/err")"; fail=1; fi

# α is the contract's g_a·g_b / ((T_a·6)(T_b·6)) in FP32, in that order (docs/gemm.md): A = [3, 1 ×15],
# B = [7, 1 ×15], defaults (ue5m3, block 16, T = 448, g = amax) quantize to A exactly and B to
# [7, 7/6 ×15], so the exact product is 21 + 15·7/6 = 38.5, and the probe-matched result is
# 448²·66 · fl(21/7225344) = 38.5 exactly (fl(gd_a·gd_b) would give 38.500003814697266).
printf '3 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1\n' >"$tmp/a38.txt"
printf '7 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1\n' >"$tmp/b38.txt"
got="$("$BIN" gemm "$tmp/a38.txt" "$tmp/b38.txt" 2>"$tmp/err")"
if [ "$got" == "38.5" ]; then echo "ok   [alpha from g and T: 38.5]"; else
  echo "FAIL [alpha]: got '$got', want '38.5' ($(cat "$tmp/err"))"; fail=1; fi

# JSON output with the inputs' tensor scales.
if "$BIN" gemm "$tmp/A.txt" "$tmp/B.txt" --json >"$tmp/j.json" 2>"$tmp/err"; then
  python3 - "$tmp/j.json" <<'PY' || fail=1
import json, sys
j = json.load(open(sys.argv[1]))
assert j["mode"] == "probe-matched" and (j["M"], j["N"], j["K"]) == (2, 2, 4), j
assert j["a"]["g"] == 6.0 and j["b"]["g"] == 6.0, (j["a"], j["b"])
assert j["a"]["gd"] > 0 and j["alpha"] > 0 and j["chunk"] == 64 and j["snap"] == 1 / 1024
c = j["c"]
assert len(c) == 2 and all(len(r) == 2 for r in c), c
for got, want in zip(sum(c, []), [-6, 31, 9, 6.75]):
    assert abs(got - want) <= 1e-6 * abs(want), (got, want)
print("ok   [json]")
PY
else
  echo "FAIL [json]: $(cat "$tmp/err")"; fail=1
fi

bad() {  # bad <name> <A file> <B file> <expected message fragment> <args...>: must exit 2
  local name="$1" fa="$2" fb="$3" want="$4"; shift 4
  "$BIN" gemm "$fa" "$fb" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq 0 ]; then echo "FAIL [$name]: exit 0"; fail=1; return; fi
  if [ "$rc" -ne 2 ]; then echo "FAIL [$name]: exit $rc, want 2: $(cat "$tmp/err")"; fail=1; return; fi
  if ! grep -qi -- "$want" "$tmp/err"; then
    echo "FAIL [$name]: stderr lacks '$want': $(cat "$tmp/err")"; fail=1; return
  fi
  echo "ok   [$name] ($(head -c 160 "$tmp/err"))"
}

printf '1 2 3\n4 5\n' >"$tmp/ragged.txt"
printf '1 2 3\n' >"$tmp/k3.txt"
printf '1 2 x3 4\n' >"$tmp/nonnum.txt"
printf '1 nan 3 4\n' >"$tmp/nan.txt"
printf '1 2 inf 4\n' >"$tmp/inf.txt"
: >"$tmp/empty.txt"
printf '\n  \n' >"$tmp/blank.txt"
bad "ragged rows"       "$tmp/ragged.txt" "$tmp/B.txt" "ragged"
bad "mismatched K"      "$tmp/A.txt" "$tmp/k3.txt"     "K mismatch"
bad "non-numeric"       "$tmp/nonnum.txt" "$tmp/B.txt" "line 1, column 5"
bad "NaN"               "$tmp/nan.txt" "$tmp/B.txt"    "NaN"
bad "Inf"               "$tmp/A.txt" "$tmp/inf.txt"    "Inf"
bad "empty file"        "$tmp/empty.txt" "$tmp/B.txt"  "empty"
bad "only blank lines"  "$tmp/A.txt" "$tmp/blank.txt"  "empty"
bad "missing file"      "$tmp/nope.txt" "$tmp/B.txt"   "cannot open"
bad "directory"         "$tmp/A.txt" "$tmp"            "directory"
bad "bad mode"          "$tmp/A.txt" "$tmp/B.txt"      "probe-matched"  --mode probe
bad "bad scale format"  "$tmp/A.txt" "$tmp/B.txt"      "scale-format"   --b-scale-format fp8
bad "block 0"           "$tmp/A.txt" "$tmp/B.txt"      "block"          --block 0
bad "a-block -3"        "$tmp/A.txt" "$tmp/B.txt"      "a-block"        --a-block -3
bad "target 0"          "$tmp/A.txt" "$tmp/B.txt"      "target"         --b-target 0
bad "negative reference" "$tmp/A.txt" "$tmp/B.txt"     "reference-a"    --reference-a -1
bad "bad rounding"      "$tmp/A.txt" "$tmp/B.txt"      "sr8"            --rounding sr
bad "chunk 8"           "$tmp/A.txt" "$tmp/B.txt"      "--chunk: expected 16, 32, 64 or 128" --chunk 8
bad "snap 1000"         "$tmp/A.txt" "$tmp/B.txt"      "--snap: expected 0 (none) or a power of two" --snap 1000
bad "accumulate rn"     "$tmp/A.txt" "$tmp/B.txt"      "--accumulate: expected" --accumulate rn
bad "decoded + snap"    "$tmp/A.txt" "$tmp/B.txt"      "decoded modes run no such accumulator" --mode decoded --snap 0

# The accumulator's snap (--snap d), by hand. MX rule (ue8m0, TE's round-up): a = 6·2^-8 has
# block scale 2^ceil(log2(2^-8)) = 2^-8 and code 6; b = 0.0625 has scale 2^ceil(log2(0.0625/6))
# = 2^-6 and code 4; α = 1. The product is 24·2^-14 = 1.5/1024: snapped to 1/1024 (RNE: 1.5 → 2)
# it is 2/1024; no snap keeps 1.5/1024; 1/256 gives RNE(0.375) = 0; 1/2048 holds 3/2048 exactly.
echo 0.0234375 >"$tmp/a1.txt"
echo 0.0625 >"$tmp/b1.txt"
for case in "1024 0.001953125" "0 0.00146484375" "256 0" "2048 0.00146484375"; do
  set -- $case
  got="$("$BIN" gemm "$tmp/a1.txt" "$tmp/b1.txt" --scale-format ue8m0 --scale-rule mx-te --block 32 \
         --snap "$1" 2>"$tmp/err")"
  if [ "$got" == "$2" ]; then echo "ok   [--snap $1]"; else
    echo "FAIL [--snap $1]: got '$got', want '$2' ($(cat "$tmp/err"))"; fail=1; fi
done

exit $fail
