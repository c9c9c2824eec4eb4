#!/usr/bin/env bash
# The quartet2 recipe (Quartet II: docs/recipes.md "Quartet II's quantizers") trains a micro
# Llama-style model and a micro hybrid (Mamba-2 in_proj of 100 outputs and 2 x 32 = 64 tokens
# per micro-batch: both inner dims zero-padded to the 128-point transform), with two
# micro-batches per step (the per-call signs differ between them). Each run is the same bit for
# bit with 1 and 2 threads, and, stopped by SIGTERM and resumed, logs the same losses, grad
# norms and held-out NLLs as the uninterrupted run with the same final checkpoint tensors.
# Recipes that would make Quartet II's kernels ignore a key are refused.
# Usage: quartet2_resume.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

steps=16
micro_setup "$work" docs=30 steps=$steps interval=8 windows=4 telemetry_interval=8
sed -i 's/^batch_size = 4$/batch_size = 4\nmicro_batch_size = 2/' "$work/micro.toml"
grep -q "^micro_batch_size = 2" "$work/micro.toml" || fail "could not set micro_batch_size"
python3 - "$work/micro.toml" "$work/hybrid.toml" <<'PY' || fail "could not write the hybrid config"
import sys
t = open(sys.argv[1]).read()
assert "n_layers = 2\n" in t
open(sys.argv[2], "w").write(t.replace("n_layers = 2\n", """pattern = "M*-"
n_kv_heads = 1
rope = false
mamba_num_heads = 4
mamba_head_dim = 8
mamba_n_groups = 1
mamba_state_size = 16
mamba_chunk_size = 16
"""))
PY

expect_error "fp4.backward_quantizer" train --config "$work/micro.toml" --recipe quartet2 \
  --set rounding.dy=sr8 --data "$work/text" --out "$work/bad"
expect_error "fp4.forward_quantizer" train --config "$work/micro.toml" --recipe quartet2 \
  --set fp4.weight_2d=true --data "$work/text" --out "$work/bad"
expect_error "hadamard_gemms" train --config "$work/micro.toml" --recipe quartet2 \
  --set 'fp4.hadamard_gemms=["wgrad"]' --data "$work/text" --out "$work/bad"

same_runs() {  # same_runs REF RUN LABEL: logged steps, summary and final checkpoint identical
  python3 - "$1" "$2" "$steps" "$3" <<'PY'
import json, struct, sys
ref, run, n, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
a = {j["step"]: j for j in map(json.loads, open(ref + "/metrics.jsonl"))}
b = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert b[-1]["step"] == n, (label, b[-1]["step"])
common = 0
for y in b:
    x = a.get(y["step"])
    if x is None:
        continue
    common += 1
    for k in ("tokens", "loss", "lr", "grad_norm", "val_nll", "val_nll_quant"):
        assert x.get(k) == y.get(k), (label, y["step"], k, x.get(k), y.get(k))
assert common == len(a) > 0, (label, common, len(a))
sa, sb = json.load(open(ref + "/summary.json")), json.load(open(run + "/summary.json"))
for k in ("first_loss", "final_window_loss", "heldout_nll", "heldout_nll_quant"):
    assert sa[k] == sb[k], (label, k, sa[k], sb[k])
def tensors(p):
    b = open(p, "rb").read()
    m = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + m])
    return {k: b[8 + m + v["data_offsets"][0]: 8 + m + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
f = "/checkpoints/step_%08d.safetensors" % n
x, y = tensors(ref + f), tensors(run + f)
for k in ("params", "adam_m", "adam_v"):
    assert x[k] == y[k], (label, k)
print("quartet2_resume: %s: %d logged steps identical, final-window loss %r"
      % (label, common, sa["final_window_loss"]))
PY
}

for model in micro hybrid; do
  args=(--config "$work/$model.toml" --recipe quartet2 --data "$work/text")
  OMP_NUM_THREADS=2 "$bin" train "${args[@]}" --out "$work/$model-ref" --quiet > "$work/ref.log" 2>&1 \
    || { cat "$work/ref.log"; fail "$model: reference run"; }
  grep -qx 'backward_quantizer = "ms-eden"' "$work/$model-ref/recipe.toml" \
    || fail "$model: recipe.toml lacks backward_quantizer: $(cat "$work/$model-ref/recipe.toml")"
  OMP_NUM_THREADS=1 "$bin" train "${args[@]}" --out "$work/$model-t1" --quiet > "$work/t1.log" 2>&1 \
    || { cat "$work/t1.log"; fail "$model: 1-thread run"; }
  same_runs "$work/$model-ref" "$work/$model-t1" "$model, 1 vs 2 threads" || fail "$model: thread count changed the bits"

  "$bin" train "${args[@]}" --out "$work/$model-run" --log-every 1 > "$work/run.log" 2> "$work/run.err" &
  pid=$!
  for _ in $(seq 1 12000); do  # up to ~2 minutes on a loaded machine
    [ "$(wc -l 2>/dev/null < "$work/$model-run/metrics.jsonl" || echo 0)" -ge 3 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  kill -TERM "$pid" 2>/dev/null || fail "$model: the run ended before it could be signalled"
  wait "$pid"; rc=$?; pid=
  [ "$rc" = 143 ] || { cat "$work/run.err"; fail "$model: exit status $rc after SIGTERM, expected 143"; }
  "$bin" train --resume "$work/$model-run" --data "$work/text" > "$work/resume.log" 2>&1 \
    || { cat "$work/resume.log"; fail "$model: resume failed"; }
  grep -q "^resumed at step" "$work/resume.log" || { cat "$work/resume.log"; fail "$model: did not resume"; }
  same_runs "$work/$model-ref" "$work/$model-run" "$model, resumed" || fail "$model: resumed run differs"
done
echo "quartet2_resume: all checks passed"
