#!/usr/bin/env bash
# A row-scaled activation run (docs/numerics.md "Per-row reference"): a micro run of nvfp4-te
# (current scaling, RHT on wgrad) with `--set fp4.row_scaled_activation=true` trains, writes
# the key into its recipe.toml, warns of the composed wgrad path, differs from plain nvfp4-te,
# and, stopped by SIGTERM and resumed, logs the same losses, grad norms and held-out NLLs bit
# for bit as the uninterrupted run with the same final checkpoint tensors. The key is refused
# with a held reference (ue5m3-b16, D = 50), and `eval --policy calibrated` refuses it.
# Usage: row_scaled_resume.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

steps=24
micro_setup "$work" docs=30 steps=$steps interval=12 windows=4 telemetry_interval=8
args=(--config "$work/micro.toml" --recipe nvfp4-te --set fp4.row_scaled_activation=true
      --data "$work/text")

expect_error "fp4.row_scaled_activation" train --config "$work/micro.toml" --recipe ue5m3-b16 \
  --set fp4.row_scaled_activation=true --data "$work/text" --out "$work/bad"
expect_error "amax_interval" train --config "$work/micro.toml" --recipe ue5m3-b16 \
  --set fp4.row_scaled_activation=true --data "$work/text" --out "$work/bad"

"$bin" train "${args[@]}" --out "$work/ref" > "$work/ref.log" 2> "$work/ref.err" \
  || { cat "$work/ref.log" "$work/ref.err"; fail "reference run"; }
grep -qx "row_scaled_activation = true" "$work/ref/recipe.toml" \
  || fail "recipe.toml lacks the key: $(cat "$work/ref/recipe.toml")"
grep -q "per-row reference of the transposed operand" "$work/ref.log" "$work/ref.err" \
  || { cat "$work/ref.log" "$work/ref.err"; fail "no slow-path warning for the row-scaled wgrad"; }
"$bin" train --config "$work/micro.toml" --recipe nvfp4-te --data "$work/text" \
  --out "$work/plain" --quiet > "$work/plain.log" 2>&1 || { cat "$work/plain.log"; fail "plain run"; }
grep -q "row_scaled_activation" "$work/plain/recipe.toml" && fail "plain recipe.toml names the key"
python3 - "$work/ref" "$work/plain" <<'PY' || fail "the key changed nothing"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1] + "/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open(sys.argv[2] + "/metrics.jsonl")]
assert a != b, "row-scaled and per-tensor runs log the same losses"
PY

# The interrupted run: SIGTERM once 3 steps are logged, then resumed to the end.
"$bin" train "${args[@]}" --out "$work/run" --log-every 1 > "$work/run.log" 2> "$work/run.err" &
pid=$!
for _ in $(seq 1 12000); do  # up to ~2 minutes on a loaded machine
  [ "$(wc -l 2>/dev/null < "$work/run/metrics.jsonl" || echo 0)" -ge 3 ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
kill -TERM "$pid" 2>/dev/null || fail "the run ended before it could be signalled (make it longer)"
wait "$pid"; rc=$?; pid=
[ "$rc" = 143 ] || { cat "$work/run.err"; fail "exit status $rc after SIGTERM, expected 143"; }
"$bin" train --resume "$work/run" --data "$work/text" > "$work/resume.log" 2>&1 \
  || { cat "$work/resume.log"; fail "resume failed"; }
grep -q "^resumed at step" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume"; }

python3 - "$work/ref" "$work/run" "$steps" <<'PY' || fail "resumed row-scaled run differs"
import json, struct, sys
ref, run, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
a = {j["step"]: j for j in map(json.loads, open(ref + "/metrics.jsonl"))}
b = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert b[-1]["step"] == n
common = 0
for y in b:
    x = a.get(y["step"])
    if x is None:
        continue
    common += 1
    for k in ("tokens", "loss", "lr", "grad_norm", "val_nll", "val_nll_quant", "telemetry"):
        assert x.get(k) == y.get(k), (y["step"], k, x.get(k), y.get(k))
assert common == len(a), (common, len(a))
def tensors(p):
    raw = open(p, "rb").read()
    m = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + m])
    return {k: raw[8 + m + v["data_offsets"][0]: 8 + m + v["data_offsets"][1]]
            for k, v in h.items() if k != "__metadata__"}
f = "/checkpoints/step_%08d.safetensors" % n
x, y = tensors(ref + f), tensors(run + f)
for k in ("params", "adam_m", "adam_v", "losses"):
    assert k in x and x[k] == y[k], k
print("row_scaled_resume: %d logged steps and the final checkpoint identical" % common)
PY

expect_error "fp4.row_scaled_activation" eval --checkpoint "$work/ref" --policy calibrated --data "$work/text"
"$bin" eval --checkpoint "$work/ref" --data "$work/text" > "$work/eval.log" 2>&1 || { cat "$work/eval.log"; fail "eval with the default policies"; }
grep -q "are left out" "$work/eval.log" || fail "no note on the left-out policies"
echo "row_scaled_resume: all checks passed"
