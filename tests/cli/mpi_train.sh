#!/usr/bin/env bash
# Data-parallel training over MPI is bit-identical for any process count (docs/recipes.md
# "Micro-batches and data parallelism"): a micro model with batch_size 8 in micro-batches of 2
# (4 per step) trained by 1 process (no mpirun) and by `mpirun -np 2` and `-np 4`, for ue5m3-b16
# (D = 50, SR on dY), nvfp4-te (D = 1 per call, RHT, BF16 blocks) and fp32: the same losses,
# grad norms, held-out NLLs and telemetry in metrics.jsonl and the same final checkpoint tensors
# (params, AdamW moments, losses) and held references. Then:
#   * amax_ranks = "max" (the reference implementation's rule) depends on P by design: after
#     step 1 under -np 2 it changes held references; block 0's activation references (taken
#     before any quantization) are >= the P-invariant ones, the weights' equal.
#   * a SIGKILL of one rank ends the whole run within seconds (no hang), and the run resumes
#     from its last checkpoint under mpirun with another process count (4), and with one
#     process, bit-exact with the uninterrupted run.
# A single process with micro_batch_size = batch_size is not bit-identical to these by design
# (the gradient tree and the per-micro-batch amax change the FP32 operations); test_grad_accum
# checks that case against its derived tolerance.
# Skips (exit 77) where mpirun is missing or fp4train was built without MPI.
# Usage: mpi_train.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
require_mpi
export OMP_NUM_THREADS=1  # 4 ranks on a 2-core machine

steps=6
micro_setup "$work" docs=30 batch_size=8 steps=$steps interval=3 windows=8 telemetry_interval=3
python3 - "$work/micro.toml" <<'PY' || fail "could not write the micro-batched config"
import sys
p = sys.argv[1]
t = open(p).read()
assert "batch_size = 8\n" in t
open(p, "w").write(t.replace("batch_size = 8\n", "batch_size = 8\nmicro_batch_size = 2\n"))
PY
# The token cache is prepared once, before the parallel runs.
"$bin" train --config "$work/micro.toml" --recipe fp32 --set train.steps=1 --set train.warmup_steps=0 \
  --out "$work/warm" --quiet > "$work/warm.log" 2>&1 || { cat "$work/warm.log"; fail "warm-up run"; }

compare() {  # compare <run a> <run b> <label>: metrics (all but timings) and final tensors
  python3 - "$1" "$2" "$3" "$steps" <<'PY'
import json, struct, sys
a, b, label, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def metrics(d):
    out = []
    for line in open(d + "/metrics.jsonl"):
        j = json.loads(line)
        for k in ("tokens_per_s", "step_ms", "mfu"):
            j.pop(k, None)
        out.append(j)
    return out
ma, mb = metrics(a), metrics(b)
assert len(ma) == n and ma == mb, (label, "metrics.jsonl differs", ma[:1], mb[:1])
def ckpt(d):
    raw = open(d + "/checkpoints/step_%08d.safetensors" % n, "rb").read()
    h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    off = 8 + struct.unpack("<Q", raw[:8])[0]
    t = {k: raw[off + v["data_offsets"][0]: off + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
    return t, json.loads(h["__metadata__"]["references"])
(ta, ra), (tb, rb) = ckpt(a), ckpt(b)
for k in ("params", "adam_m", "adam_v", "losses"):
    assert k in ta and ta[k] == tb[k], (label, k)
assert ra == rb, (label, "held references differ")
print("%s: %d metrics lines, checkpoint tensors and %d held references identical" % (label, len(ma), len(ra)))
PY
}

for recipe in ue5m3-b16 nvfp4-te fp32; do
  "$bin" train --config "$work/micro.toml" --recipe $recipe --out "$work/p1-$recipe" --quiet \
    > "$work/p1-$recipe.log" 2>&1 || { cat "$work/p1-$recipe.log"; fail "$recipe: one process"; }
  for np in 2 4; do
    "${mpi[@]}" -np $np "$bin" train --config "$work/micro.toml" --recipe $recipe \
      --out "$work/p$np-$recipe" --quiet > "$work/p$np-$recipe.log" 2>&1 \
      || { cat "$work/p$np-$recipe.log"; fail "$recipe: mpirun -np $np"; }
    compare "$work/p1-$recipe" "$work/p$np-$recipe" "$recipe, 1 vs $np processes" \
      || fail "$recipe: mpirun -np $np differs from one process"
  done
done
# Progress and files come from rank 0 alone: one header line, one summary.
"${mpi[@]}" -np 2 "$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --out "$work/talk" \
  > "$work/talk.log" 2>&1 || { cat "$work/talk.log"; fail "talkative run"; }
[ "$(grep -c '^model: ' "$work/talk.log")" = 1 ] || { cat "$work/talk.log"; fail "expected one 'model:' line (rank 0 only)"; }
grep -q "4 micro-batches of 2 sequences, 2 on each of 2 processes" "$work/talk.log" \
  || { cat "$work/talk.log"; fail "the header does not describe the micro-batches over the processes"; }

# A micro-batch count that the process count does not divide.
"${mpi[@]}" -np 3 "$bin" train --config "$work/micro.toml" --recipe fp32 --out "$work/np3" \
  > "$work/np3.log" 2>&1 && fail "-np 3 with 4 micro-batches was accepted"
grep -q "cannot be spread evenly over 3 processes" "$work/np3.log" || { cat "$work/np3.log"; fail "no clear -np 3 error"; }

# Commands that do not spread over processes refuse to run under mpirun.
"${mpi[@]}" -np 2 "$bin" compare --config "$work/micro.toml" --seeds 1 --out "$work/cmp" \
  > "$work/cmp.log" 2>&1 && fail "compare under mpirun -np 2 was accepted"
grep -q "'compare' runs in one process" "$work/cmp.log" || { cat "$work/cmp.log"; fail "no clear compare-under-mpirun error"; }
[ -e "$work/cmp" ] && fail "compare under mpirun wrote $work/cmp"

# amax_ranks = "max": each rank's first micro-batch, MAX-reduced; it changes the references
# (P-dependent by design), block 0's q/k/v input references can only grow, weights' stay.
for rule in invariant max; do
  "${mpi[@]}" -np 2 "$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --set train.steps=1 \
    --set train.warmup_steps=0 --set fp4.amax_ranks=$rule --out "$work/rule-$rule" --quiet \
    > "$work/rule-$rule.log" 2>&1 || { cat "$work/rule-$rule.log"; fail "amax_ranks = $rule"; }
done
python3 - "$work/rule-invariant" "$work/rule-max" <<'PY' || fail "amax_ranks = max is not the max over ranks"
import json, struct, sys
def refs(d):
    raw = open(d + "/checkpoints/step_00000001.safetensors", "rb").read()
    h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    return {(r["linear"], r["role"]): r["held"] for r in json.loads(h["__metadata__"]["references"])}
inv, mx = refs(sys.argv[1]), refs(sys.argv[2])
assert inv.keys() == mx.keys() and inv
# Block 0's q/k/v activations X (role 0) are the normed embeddings, before any quantization: under
# "max" their reference is max(amax of micro-batch 0, of micro-batch 2), at least rank 0's.
first = [k for k in inv if k[1] == 0 and k[0] in ("layers.0.mixer.q_proj", "layers.0.mixer.k_proj", "layers.0.mixer.v_proj")]
assert first and all(mx[k] >= inv[k] for k in first), [(k, inv[k], mx[k]) for k in first]
w = [k for k in inv if k[1] == 1]  # role W: replicated weights, the same under both rules
assert w and all(mx[k] == inv[k] for k in w)
differ = sum(mx[k] != inv[k] for k in inv)
assert differ > 0, "amax_ranks = max changed no reference"
print("amax_ranks: block-0 X references max >= invariant (%d), weights equal (%d), %d of %d differ"
      % (len(first), len(w), differ, len(inv)))
PY

# SIGKILL of one rank: the run ends (no hang), then resumes with one process, bit-exact.
long=30
"$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --set train.steps=$long \
  --out "$work/kill-ref" --quiet > "$work/kill-ref.log" 2>&1 || { cat "$work/kill-ref.log"; fail "kill reference"; }
"${mpi[@]}" -np 2 "$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --set train.steps=$long \
  --save-every 2 --out "$work/kill" > "$work/kill.log" 2>&1 &
pid=$!
for _ in $(seq 1 12000); do
  ls "$work/kill/checkpoints" 2>/dev/null | grep -q step_00000004 && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
# A rank process: matches the command line, is not mpirun itself (the highest pid: rank 1).
victim=$(pgrep -f -- "train --config $work/micro.toml .*--out $work/kill\$" | grep -vx "$pid" | tail -1)
[ -n "$victim" ] || fail "no rank process to kill (did the run end already? make it longer)"
kill -9 "$victim"
t0=$(date +%s)
for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "mpirun still running 60 s after one rank was killed (hang)"
wait "$pid"; rc=$?; pid=
t1=$(date +%s)
[ "$rc" != 0 ] || fail "mpirun exited 0 after a rank was killed"
echo "kill: mpirun ended $((t1 - t0)) s after SIGKILL of rank process $victim (status $rc)"
[ -f "$work/kill/summary.json" ] && fail "a killed run must not have summary.json"
cp -r "$work/kill" "$work/kill1"
"${mpi[@]}" -np 4 "$bin" train --resume "$work/kill" --data "$work/text" > "$work/resume.log" 2>&1 \
  || { cat "$work/resume.log"; fail "resume under mpirun -np 4"; }
grep -q "^resumed at step" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume"; }
steps=$long compare "$work/kill-ref" "$work/kill" "killed under -np 2, resumed under -np 4" \
  || fail "the resumed run differs from the uninterrupted one"
"$bin" train --resume "$work/kill1" --data "$work/text" > "$work/resume1.log" 2>&1 \
  || { cat "$work/resume1.log"; fail "resume with one process"; }
steps=$long compare "$work/kill-ref" "$work/kill1" "killed under -np 2, resumed with 1 process" \
  || fail "the resumed run (1 process) differs from the uninterrupted one"

# SIGUSR1 to mpirun (forwarded to every rank; SIGINT/SIGTERM make mpirun kill the job): all
# ranks stop after the same step, rank 0 writes its checkpoint first, and the run resumes
# bit-exactly.
"${mpi[@]}" -np 2 "$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --set train.steps=$long \
  --log-every 1 --out "$work/usr1" > "$work/usr1.log" 2> "$work/usr1.err" &
pid=$!
for _ in $(seq 1 12000); do
  [ "$(wc -l 2>/dev/null < "$work/usr1/metrics.jsonl" || echo 0)" -ge 3 ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
kill -USR1 "$pid" 2>/dev/null || fail "the run ended before SIGUSR1 (make it longer)"
for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "mpirun still running 60 s after SIGUSR1"
wait "$pid"; rc=$?; pid=
[ "$rc" != 0 ] || fail "a stopped run exited 0"
[ -f "$work/usr1/summary.json" ] && fail "a stopped run must not have summary.json"
[ "$(grep -c '^stopped by SIGUSR1 after step' "$work/usr1.err")" = 1 ] \
  || { cat "$work/usr1.err"; fail "expected one 'stopped by SIGUSR1 after step K' (rank 0)"; }
"${mpi[@]}" -np 2 "$bin" train --resume "$work/usr1" --data "$work/text" > "$work/usr1-resume.log" 2>&1 \
  || { cat "$work/usr1-resume.log"; fail "resume after SIGUSR1"; }
steps=$long compare "$work/kill-ref" "$work/usr1" "stopped by SIGUSR1 under -np 2, resumed" \
  || fail "the run stopped by SIGUSR1 and resumed differs from the uninterrupted one"

# A divergence that every rank meets (NaN everywhere): error.txt names it (not a failure).
"${mpi[@]}" -np 2 "$bin" train --config "$work/micro.toml" --recipe fp32 --set train.lr=1e9 \
  --set train.warmup_steps=0 --out "$work/nan" > "$work/nan.log" 2>&1
rc=$?
[ "$rc" = 2 ] || { cat "$work/nan.log"; fail "a diverged run under mpirun exited $rc, expected 2"; }
grep -q "^non-finite" "$work/nan/error.txt" 2>/dev/null \
  || { cat "$work/nan/error.txt" "$work/nan.log"; fail "error.txt does not name the divergence"; }
ls "$work/nan" | grep -q "\.tmp$" && fail "a temporary file was left in $work/nan"
echo "mpi_train: all checks passed"
