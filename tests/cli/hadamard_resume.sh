#!/usr/bin/env bash
# A tiny run with a 64-point Hadamard transform re-drawn every step on the dgrad and wgrad
# operands (fp4.hadamard_size, hadamard_gemms, hadamard_signs; docs/numerics.md "Random
# Hadamard transform") resumes bit for bit: its signs are a function of (seed, layer, step) and
# its held references of the transformed operands (D = 3) travel in the checkpoint. The resolved
# recipe.toml carries the keys; a model whose N is not a multiple of the size is refused.
# Usage: hadamard_resume.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=20 steps=9 warmup_steps=2 interval=9 windows=2
# d_model 64, MLP 128: every linear's N is a multiple of 64; tokens per step 4 x 32 = 128.
sed -i 's/^d_model = 32/d_model = 64/; s/^mlp_hidden = 64/mlp_hidden = 128/' "$work/micro.toml"
sets=(--set fp4.hadamard_size=64 --set fp4.hadamard_signs=per-step
      --set 'fp4.hadamard_gemms=["dgrad","wgrad"]' --set fp4.amax_interval=3)
args=(--config "$work/micro.toml" --recipe nvfp4-te --data "$work/text" "${sets[@]}")

"$bin" train "${args[@]}" --out "$work/ref" --quiet > "$work/ref.log" 2>&1 \
  || { cat "$work/ref.log"; fail "reference run"; }
grep -q 'hadamard_size = 64' "$work/ref/recipe.toml" || fail "recipe.toml lacks hadamard_size"
grep -q 'hadamard_gemms = \["dgrad", "wgrad"\]' "$work/ref/recipe.toml" || fail "recipe.toml lacks hadamard_gemms"
grep -q 'hadamard_signs = "per-step"' "$work/ref/recipe.toml" || fail "recipe.toml lacks hadamard_signs"

# The same run cut after its step-6 checkpoint (later checkpoints and the summary removed), then
# resumed to step 9.
"$bin" train "${args[@]}" --out "$work/run" --save-every 3 --quiet > "$work/run1.log" 2>&1 \
  || { cat "$work/run1.log"; fail "checkpointed run"; }
rm -f "$work/run/summary.json" "$work/run/checkpoints/step_00000009.safetensors"
ls "$work/run/checkpoints" | grep -q 'step_00000006.safetensors' || fail "no step-6 checkpoint: $(ls "$work/run/checkpoints")"
"$bin" train --resume "$work/run" --data "$work/text" > "$work/run2.log" 2>&1 \
  || { cat "$work/run2.log"; fail "resume exited non-zero"; }
grep -q "^resumed at step 6" "$work/run2.log" || { cat "$work/run2.log"; fail "not resumed at step 6"; }

python3 - "$work/ref" "$work/run" <<'PY' || fail "resumed run differs from the uninterrupted one"
import json, struct, sys
ref, run = sys.argv[1], sys.argv[2]
a = [json.loads(l) for l in open(ref + "/metrics.jsonl")]
b = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert [x["step"] for x in b] == list(range(1, 10)), [x["step"] for x in b]
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "val_nll", "val_nll_quant", "telemetry"):
        assert x.get(k) == y.get(k), (x["step"], k, x.get(k), y.get(k))
def tensors(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
x = tensors(ref + "/checkpoints/step_00000009.safetensors")
y = tensors(run + "/checkpoints/step_00000009.safetensors")
for k in ("params", "adam_m", "adam_v", "losses"):
    assert x[k] == y[k], k
print("hadamard resume: 9 steps identical, final parameters identical; final loss", b[-1]["loss"])
PY

# The dgrad transform runs along N: d_model 32 (N = 32) with 64 points is refused, naming the key.
micro_setup "$work/small" docs=20 steps=2 warmup_steps=1 interval=2 windows=2
expect_error "fp4.hadamard_size = 64" train --config "$work/small/micro.toml" --recipe nvfp4-te \
  --data "$work/small/text" --out "$work/small/run" "${sets[@]}"
echo "hadamard_resume: all checks passed"
