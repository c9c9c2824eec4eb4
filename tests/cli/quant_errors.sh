#!/usr/bin/env bash
# CLI checks of `fp4train quant`: valid JSON on good input, a non-zero exit with a message
# naming the problem on bad input. Usage: quant_errors.sh <path-to-fp4train> <source-dir>
set -u
BIN="$1"
fail=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

ok() {  # ok <name> <stdin> <args...>: must exit 0 and print JSON that python3 parses
  local name="$1" input="$2"; shift 2
  if ! printf '%b' "$input" | "$BIN" quant "$@" >"$tmp/out" 2>"$tmp/err"; then
    echo "FAIL [$name]: exit $? ; stderr: $(cat "$tmp/err")"; fail=1; return
  fi
  if ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/out"; then
    echo "FAIL [$name]: output is not valid JSON"; fail=1; return
  fi
  echo "ok   [$name]"
}

bad() {  # bad <name> <stdin> <expected message fragment> <args...>: must exit non-zero
  local name="$1" input="$2" want="$3"; shift 3
  printf '%b' "$input" | "$BIN" quant "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq 0 ]; then echo "FAIL [$name]: exit 0"; fail=1; return; fi
  if ! grep -qi -- "$want" "$tmp/err"; then
    echo "FAIL [$name]: stderr lacks '$want': $(cat "$tmp/err")"; fail=1; return
  fi
  echo "ok   [$name] (exit $rc: $(head -c 200 "$tmp/err"))"
}

ok  "good input"            '1 2 3 40\n-0.5 0.25 7 8\n'  --block 4
ok  "good input, 2d, sr8"   '1 2 3\n4 5 6\n7 8 9\n'      --block 2 --2d --rounding sr8 --seed 7
ok  "rna (ties away)"      '1 2 3\n4 5 6\n7 8 9\n'      --block 2 --rounding rna
ok  "e4m3, reference"       '1 2 3 40\n'                 --scale-format e4m3 --reference 4
ok  "ue8m0, target 2048"    '1e-3 2e5\n'                 --scale-format ue8m0 --target 2048
ok  "ue5m3-ptx"             '1e-3 2e5\n'                 --scale-format ue5m3-ptx --reference 1
ok  "blank lines skipped"   '\n1 2\n\n3 4\n'

# Content checks on one hand-computed case (see test_numerics HandComputed):
# T = 448, g = 448 → ge = 6; block amax 3 → scale 3 (UE5M3 code 0x84 = 132); x̂ = [3, 1, −.25, .75].
printf '3 1.25 -0.3 0.7\n' | "$BIN" quant --block 4 --reference 448 >"$tmp/hc" 2>"$tmp/err" || {
  echo "FAIL [hand-computed]: $(cat "$tmp/err")"; fail=1; }
python3 - "$tmp/hc" <<'PY' || fail=1
import json, sys
j = json.load(open(sys.argv[1]))
assert j["rows"] == 1 and j["cols"] == 4, j
assert j["ge"] == 6.0, j["ge"]
b = j["blocks"][0]
assert (b["row"], b["col"], b["amax"], b["scale_code"], b["scale"]) == (0, 0, 3.0, 132, 3.0), b
e = j["elements"][0]
assert e["codes"] == [7, 4, 9, 3], e
assert e["values"] == [3.0, 1.0, -0.25, 0.75], e
print("ok   [hand-computed content]")
PY

# Same input from a file argument
printf '1 2\n3 4\n' >"$tmp/in.txt"
if "$BIN" quant "$tmp/in.txt" --block 2 | python3 -c 'import json,sys; json.load(sys.stdin)'; then
  echo "ok   [file argument]"
else
  echo "FAIL [file argument]"; fail=1
fi

# --save writes the packed QTensor (fused SIMD quantizer): its codes, scale codes and decode
# scale must be those the JSON reports (odd element count: the last byte is half filled).
printf '1 2 3 40 5\n-0.5 0.25 7 8 9\n-6 0 1e-3 2 3\n' |
  "$BIN" quant --block 4 --rounding sr8 --seed 3 --save "$tmp/q.safetensors" >"$tmp/sv" 2>"$tmp/err" || {
  echo "FAIL [save]: $(cat "$tmp/err")"; fail=1; }
python3 - "$tmp/sv" "$tmp/q.safetensors" <<'PY' || fail=1
import json, struct, sys
j = json.load(open(sys.argv[1]))
raw = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
m = h["__metadata__"]
assert (m["rows"], m["cols"], m["block"], m["layout"]) == ("3", "5", "4", "1d-row"), m
assert m["fact.source"] == "fp4train quant" and m["fact.seed"] == "3", m
a, b = h["codes"]["data_offsets"]; packed = data[a:b]
codes = [c for row in j["elements"] for c in row["codes"]]
assert len(packed) == (len(codes) + 1) // 2, len(packed)
got = [(packed[i // 2] >> (4 * (i % 2))) & 15 for i in range(len(codes))]
assert got == codes, (got, codes)
assert packed[-1] >> 4 == 0, "half-filled last byte"
a, b = h["scales"]["data_offsets"]
assert list(data[a:b]) == [blk["scale_code"] for blk in j["blocks"]]
a, b = h["decode_scale"]["data_offsets"]
assert struct.unpack("<f", data[a:b])[0] == j["gd"], j["gd"]
assert j["saved"] == sys.argv[2]
print("ok   [save: packed file matches the JSON]")
PY
# MXFP4 --save (docs/formats.md "`mx-te` and `mx-ocp` (MXFP4)"): UE8M0 scale codes, no tensor
# scale (decode_scale 1), the rule in the metadata. Hand-computed: block [7 1 0.3 -2] has amax 7
# → mx-te scale 2 (code 128), mx-ocp 1 (code 127); block [0 0 0 0] → scale 1 (code 127).
for rule in mx-te mx-ocp; do
  printf '7 1 0.3 -2 0 0 0 0\n' |
    "$BIN" quant --block 4 --scale-format ue8m0 --scale-rule $rule --save "$tmp/mx.safetensors" \
      >"$tmp/mx.json" 2>"$tmp/err" || { echo "FAIL [save $rule]: $(cat "$tmp/err")"; fail=1; continue; }
  python3 - "$tmp/mx.json" "$tmp/mx.safetensors" "$rule" <<'PY' || fail=1
import json, struct, sys
j = json.load(open(sys.argv[1])); rule = sys.argv[3]
raw = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
m = h["__metadata__"]
assert (m["scale_format"], m["scale_rule"], m["block"]) == ("ue8m0", rule, "4"), m
a, b = h["scales"]["data_offsets"]
assert list(data[a:b]) == ([128, 127] if rule == "mx-te" else [127, 127]), list(data[a:b])
assert list(data[a:b]) == [blk["scale_code"] for blk in j["blocks"]]
a, b = h["decode_scale"]["data_offsets"]
assert struct.unpack("<f", data[a:b])[0] == 1.0
a, b = h["codes"]["data_offsets"]; packed = data[a:b]
codes = j["elements"][0]["codes"]
assert [(packed[i // 2] >> (4 * (i % 2))) & 15 for i in range(8)] == codes, codes
print("ok   [save " + rule + ": MXFP4 file matches the JSON]")
PY
done
# mx-te cannot represent |x| from about 2.98e38 (x̂ would be Inf): an error naming the element;
# mx-ocp saturates and prints finite values.
bad "mx-te overflow"     '1 3e38\n'  "= 3.00000001e+38 dequantizes to +Inf" \
    --block 2 --scale-format ue8m0 --scale-rule mx-te
ok  "mx-ocp near FLT_MAX" '1 3e38\n' --block 2 --scale-format ue8m0 --scale-rule mx-ocp
ok  "mx-te just below"    '1 2.9e38\n' --block 2 --scale-format ue8m0 --scale-rule mx-te
bad "save, int4 elements"  '1 2\n'   "packed QTensor"  --element-format int4 --save "$tmp/x.safetensors"
bad "save, bad path"       '1 2\n'   "cannot write"    --save "$tmp/no/such/dir/x.safetensors"

bad "non-numeric token"  '1 2\n3 abc\n'  "line 2, column 3"
bad "ragged rows"        '1 2 3\n4 5\n'  "ragged"
bad "nan"                '1 nan\n'       "nan"
bad "inf"                '-inf 1\n'      "inf"
bad "block -1"           '1 2\n'         "block"        --block -1
bad "block 0"            '1 2\n'         "block"        --block 0
bad "empty input"        ''              "empty"
bad "only blank lines"   '\n  \n'        "empty"
bad "target 0"           '1 2\n'         "target"       --target 0
bad "negative reference" '1 2\n'         "reference"    --reference -1
bad "bad scale format"   '1 2\n'         "ue5m3-ptx"    --scale-format fp8
bad "bad rounding"       '1 2\n'         "sr8"          --rounding sr
bad "missing file"       ''              "cannot open"  "$tmp/does-not-exist"
bad "bad four-over-six"  '1 2\n'         "mae, mse"     --four-over-six MAE
bad "four-over-six, mx"  '1 2\n'         "tensor scale" --four-over-six mae --scale-format ue8m0 --scale-rule mx-te

# Four Over Six (docs/numerics.md "Four Over Six"; test_four_over_six HandComputedBlocks):
# E4M3, T = 256, g = 1536 → ge = 1; block {6, 5, 1, 1, 1, 1}: MAE keeps map-to-6 (scale 1),
# MSE picks map-to-4 (scale 1.5, 5 → 4.5, 1 → .75); --save packs those scales.
for m in mae mse; do
  printf '6 5 1 1 1 1\n' | "$BIN" quant --block 16 --scale-format e4m3 --target 256 \
    --reference 1536 --four-over-six $m --save "$tmp/fos-$m.safetensors" >"$tmp/fos-$m" 2>"$tmp/err" || {
    echo "FAIL [four-over-six $m]: $(cat "$tmp/err")"; fail=1; }
done
python3 - "$tmp/fos-mae" "$tmp/fos-mse" "$tmp/fos-mse.safetensors" <<'PY' || fail=1
import json, struct, sys
mae, mse = (json.load(open(f)) for f in sys.argv[1:3])
assert mae["spec"]["four_over_six"] == "mae" and mse["spec"]["four_over_six"] == "mse"
assert mae["blocks"][0]["scale"] == 1.0, mae["blocks"]
assert mse["blocks"][0]["scale"] == 1.5, mse["blocks"]
assert mse["elements"][0]["values"] == [6.0, 4.5, 0.75, 0.75, 0.75, 0.75], mse["elements"]
raw = open(sys.argv[3], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
assert h["__metadata__"]["fact.four_over_six"] == "mse", h["__metadata__"]
a, b = h["scales"]["data_offsets"]
assert list(raw[8 + n + a:8 + n + b]) == [mse["blocks"][0]["scale_code"]]
print("ok   [four-over-six content and --save]")
PY

exit $fail
