#!/usr/bin/env bash
# Checkpoints and resume through the CLI: a micro run killed with SIGKILL mid-run, its newest
# checkpoint then truncated, resumed with `train --resume`, must log the same losses, grad
# norms and held-out NLLs bit for bit as an uninterrupted run; the damaged checkpoint is named;
# a completed run is reported, not retrained; options that would change the run are refused.
# Usage: resume.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=30 steps=120 interval=25 windows=4
args=(--config "$work/micro.toml" --recipe ue5m3-b16 --data "$work/text")

# The uninterrupted reference.
"$bin" train "${args[@]}" --out "$work/ref" --quiet > "$work/ref.log" 2>&1 \
  || { cat "$work/ref.log"; fail "reference run"; }

# The same run, killed once it has two checkpoints (every 5 steps, newest 3 kept).
"$bin" train "${args[@]}" --out "$work/run" --save-every 5 > "$work/run1.log" 2>&1 &
pid=$!
for _ in $(seq 1 12000); do  # up to ~2 minutes on a loaded machine
  [ "$(ls "$work/run/checkpoints" 2>/dev/null | grep -c '^step_.*\.safetensors$')" -ge 2 ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
kill -9 "$pid" 2>/dev/null || fail "the run ended before it could be killed (make it longer)"
wait "$pid" 2>/dev/null; pid=
[ -f "$work/run/summary.json" ] && fail "a killed run must not have summary.json"
newest=$(ls "$work/run/checkpoints" | grep '^step_.*\.safetensors$' | sort | tail -1)
[ -n "$newest" ] || fail "no checkpoint written"
echo "killed after $(wc -l < "$work/run/metrics.jsonl") metrics lines; checkpoints: $(ls "$work/run/checkpoints" | tr '\n' ' ')"
truncate -s -7 "$work/run/checkpoints/$newest"

# Options that would change the run are refused before anything happens.
expect_error "--steps cannot be combined" train --resume "$work/run" --steps 10
expect_error "--recipe cannot be combined" train --resume "$work/run" --recipe fp32
expect_error "already holds a run" train "${args[@]}" --out "$work/run"
expect_error "no such run directory" train --resume "$work/nothing"
mkdir -p "$work/fresh"
expect_error "no checkpoint to resume" train --resume "$work/fresh"

# Resume: the damaged newest checkpoint is skipped with its name, training goes on from the
# previous one to the configured 120 steps.
"$bin" train --resume "$work/run" --data "$work/text" > "$work/run2.log" 2> "$work/run2.err" \
  || { cat "$work/run2.log" "$work/run2.err"; fail "resume exited non-zero"; }
grep -q "skipping checkpoint $newest" "$work/run2.err" || { cat "$work/run2.err"; fail "the skipped checkpoint must be named"; }
grep -q "truncated" "$work/run2.err" || fail "the reason (truncated) must be given"
grep -q "^resumed at step" "$work/run2.log" || fail "no 'resumed at step' line"
[ -f "$work/run/summary.json" ] || fail "no summary.json after the resume"
[ -f "$work/run/tokenizer.model" ] || fail "tokenizer.model not copied into the run"
[ "$(ls "$work/run/checkpoints" | grep -c '^step_.*\.safetensors$')" -eq 3 ] || fail "keep-checkpoints 3: $(ls "$work/run/checkpoints")"
ls "$work/run/checkpoints" | grep -q 'step_00000120.safetensors' || fail "no final checkpoint"

python3 - "$work/ref" "$work/run" <<'PY' || fail "resumed run differs from the uninterrupted one"
import json, sys
ref, run = sys.argv[1], sys.argv[2]
a = [json.loads(l) for l in open(ref + "/metrics.jsonl")]
b = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert [x["step"] for x in b] == list(range(1, 121)), "steps 1..120 exactly once"
for x, y in zip(a, b):
    for k in ("step", "tokens", "loss", "lr", "grad_norm", "val_nll", "val_nll_quant", "telemetry"):
        assert x.get(k) == y.get(k), (x["step"], k, x.get(k), y.get(k))
sa, sb = json.load(open(ref + "/summary.json")), json.load(open(run + "/summary.json"))
for k in ("first_loss", "final_window_loss", "heldout_nll", "heldout_nll_quant", "steps", "tokens"):
    assert sa[k] == sb[k], (k, sa[k], sb[k])
assert sb["resumed_from_step"] > 0
print("resume: 120 steps identical (loss, grad norm, held-out NLL, telemetry), resumed from",
      sb["resumed_from_step"], "final-window loss", sb["final_window_loss"])
PY
cmp <(python3 -c "import json;print(json.load(open('$work/ref/summary.json'))['final_window_loss'])") \
    <(python3 -c "import json;print(json.load(open('$work/run/summary.json'))['final_window_loss'])") || fail "summary"

# The final parameters are identical too (checkpoint tensors, not just the metrics).
python3 - "$work/ref/checkpoints/step_00000120.safetensors" "$work/run/checkpoints/step_00000120.safetensors" <<'PY' || fail "final checkpoints differ"
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
x, y = tensors(sys.argv[1]), tensors(sys.argv[2])
for k in ("params", "adam_m", "adam_v", "losses"):
    assert x[k] == y[k], k
PY

# A completed run is reported, not retrained.
before=$(md5sum < "$work/run/metrics.jsonl")
out=$("$bin" train --resume "$work/run" 2>&1) || fail "resume of a completed run must succeed: $out"
grep -q "already completed" <<<"$out" || fail "completed run not reported: $out"
[ "$(md5sum < "$work/run/metrics.jsonl")" = "$before" ] || fail "a completed run was modified"
echo "resume: all checks passed"
