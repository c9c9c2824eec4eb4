#!/usr/bin/env bash
# Resume of a hybrid (Nemotron-H) run is bit-exact: a micro "M*-" model (Mamba-2 with G = 2
# and a chunk that does not divide seq_len, GQA attention without RoPE, MLP) trained N steps
# uninterrupted vs. stopped by SIGTERM after some K < N steps (the step finishes and its
# checkpoint is written) and resumed with `train --resume` to N: the same losses, grad norms
# and held-out NLLs in metrics.jsonl, the same summary, and the same final checkpoint tensors
# (params, Adam moments, losses), for an FP4 recipe.
# Usage: resume_hybrid.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

steps=24
micro_setup "$work" docs=30 steps=$steps interval=12 windows=4 telemetry_interval=8
# The micro model as a hybrid: replace the Llama-style n_layers by a pattern and its keys.
python3 - "$work/micro.toml" <<'PY' || fail "could not write the hybrid config"
import sys
p = sys.argv[1]
t = open(p).read()
assert "n_layers = 2\n" in t
t = t.replace("n_layers = 2\n", """pattern = "M*-"
n_kv_heads = 1
rope = false
mamba_num_heads = 4
mamba_head_dim = 8
mamba_n_groups = 2
mamba_state_size = 8
mamba_chunk_size = 12
""")
open(p, "w").write(t)
PY
args=(--config "$work/micro.toml" --recipe ue5m3-b16 --data "$work/text")

"$bin" train "${args[@]}" --out "$work/ref" --quiet > "$work/ref.log" 2>&1 \
  || { cat "$work/ref.log"; fail "reference run"; }
grep -qx 'pattern = "M\*-"' "$work/ref/config.toml" \
  || fail "the reference run's config.toml lacks the hybrid pattern: $(cat "$work/ref/config.toml")"

# The interrupted run: SIGTERM once 3 steps are logged (the current step completes, its
# checkpoint is written, the process ends with status 143).
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
[ -f "$work/run/summary.json" ] && fail "a stopped run must not have summary.json"
k=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\) of .*/\1/p' "$work/run.err")
[ -n "$k" ] && [ "$k" -lt "$steps" ] || { cat "$work/run.err"; fail "no 'stopped by SIGTERM after step K' with K < $steps"; }

"$bin" train --resume "$work/run" --data "$work/text" > "$work/resume.log" 2>&1 \
  || { cat "$work/resume.log"; fail "resume failed"; }
grep -q "^resumed at step $k of $steps" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume at step $k"; }

python3 - "$work/ref" "$work/run" "$steps" <<'PY' || fail "resumed hybrid run differs from the uninterrupted one"
import json, sys
ref, run, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
a = {j["step"]: j for j in map(json.loads, open(ref + "/metrics.jsonl"))}
b = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert len(b) >= len(a) > 0, (len(a), len(b))
assert b[-1]["step"] == n and sorted(set(x["step"] for x in b)) == [x["step"] for x in b]
common = 0
for y in b:
    x = a.get(y["step"])
    if x is None:
        continue  # --log-every 1 before the stop logs steps the reference does not
    common += 1
    for k in ("tokens", "loss", "lr", "grad_norm", "val_nll", "val_nll_quant", "telemetry"):
        assert x.get(k) == y.get(k), (y["step"], k, x.get(k), y.get(k))
assert common == len(a), (common, len(a))
sa, sb = json.load(open(ref + "/summary.json")), json.load(open(run + "/summary.json"))
for k in ("first_loss", "final_window_loss", "heldout_nll", "heldout_nll_quant", "steps", "tokens"):
    assert sa[k] == sb[k], (k, sa[k], sb[k])
assert sb["resumed_from_step"] > 0
print("resume_hybrid: %d logged steps identical, resumed from %d, final-window loss %r"
      % (common, sb["resumed_from_step"], sb["final_window_loss"]))
PY

final=$(printf 'step_%08d.safetensors' "$steps")
python3 - "$work/ref/checkpoints/$final" "$work/run/checkpoints/$final" <<'PY' || fail "final checkpoints differ"
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
x, y = tensors(sys.argv[1]), tensors(sys.argv[2])
for k in ("params", "adam_m", "adam_v", "losses"):
    assert k in x and x[k] == y[k], k
print("resume_hybrid: final checkpoint tensors identical (%d param bytes)" % len(x["params"]))
PY
echo "resume_hybrid: all checks passed"
