#!/usr/bin/env bash
# `fp4train rollout` under mpirun (docs/fidelity.md "Paired rollouts", "Processes"): the
# (checkpoint, order) pairs are spread over the ranks (pair k on rank k mod P), each rank trains
# its rollouts alone, and the traces are gathered, so rollout.json is bit-identical for 1, 2 and
# 3 processes (3 does not divide the 4 pairs) but for the machine line. The run has 2
# micro-batches per step (the gradient tree inside one rank's rollout), a diverging stress
# pair is gathered with its message, and rank 0 alone writes (also for --from).
# Usage: mpi_rollout.sh <fp4train binary> <source dir>. Skips (exit 77) without mpirun or MPI.
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
require_mpi
export OMP_NUM_THREADS=1  # up to 3 ranks on a 2-core machine

micro_setup "$work" docs=30 steps=12 warmup_steps=2 interval=100 windows=4 telemetry_interval=0
sed -i 's/^batch_size = 4$/batch_size = 4\nmicro_batch_size = 2/' "$work/micro.toml"
"$bin" train --config "$work/micro.toml" --recipe fp32 --out "$work/ref" --save-every 2 \
  --keep-checkpoints 100 --quiet > "$work/train.log" 2>&1 || { cat "$work/train.log"; fail "reference run"; }
args=(rollout --run "$work/ref" --recipe ue5m3-b16,nvfp4-te --steps 4,8 --length 3 --orders 2
      --resamples 100 --quiet)
boom=(rollout --run "$work/ref" --recipe nvfp4-all --steps 2,4,6 --length 4 --orders 1 --lr-scale 1e6
      --resamples 100 --quiet)
"$bin" "${args[@]}" --out "$work/np1" > "$work/np1.log" 2>&1 || { cat "$work/np1.log"; fail "1 process"; }
"$bin" "${boom[@]}" --out "$work/boom1" > "$work/boom1.log" 2>&1 || { cat "$work/boom1.log"; fail "1 process, stress"; }
for np in 2 3; do
  "${mpi[@]}" -np $np "$bin" "${args[@]}" --out "$work/np$np" > "$work/np$np.log" 2>&1 \
    || { cat "$work/np$np.log"; fail "mpirun -np $np"; }
  [ "$(grep -c '^rollout: 2 recipes' "$work/np$np.log")" = 1 ] || { cat "$work/np$np.log"; fail "-np $np: not one summary line (rank 0 alone reports)"; }
done
"${mpi[@]}" -np 2 "$bin" "${boom[@]}" --out "$work/boom2" > "$work/boom2.log" 2>&1 \
  || { cat "$work/boom2.log"; fail "mpirun -np 2, stress"; }
python3 - "$work" <<'PY' || fail "rollout.json differs between process counts"
import json, sys
work = sys.argv[1]
a = [json.load(open(f"{work}/np{p}/rollout.json")) for p in (1, 2, 3)]
assert a[1]["machine"].endswith("2 processes") and a[2]["machine"].endswith("3 processes"), a[1]["machine"]
for x in a:
    x.pop("machine")
ue = a[0]["traces"][1]
assert all(ue[c][o]["divergence"] > 0 and len(ue[c][o]["grad_norm"]) == 3 for c in range(2) for o in range(2))
for i in (1, 2):
    assert a[i] == a[0], "-np %d differs from 1 process" % (i + 1)
b1, b2 = (json.load(open(f"{work}/boom{p}/rollout.json")) for p in (1, 2))
b1.pop("machine"); b2.pop("machine")
msgs = [t[0]["diverged"] for r in b1["traces"] for t in r]
assert any("non-finite" in m for m in msgs), msgs
assert b1 == b2, "the diverging stress differs between 1 and 2 processes"
print("rollout: 1, 2 and 3 processes give the same rollout.json; diverged:", sorted(set(msgs)))
PY
strip() { sed -E 's/; [^;]*, [0-9]+ threads[^.]*\. How/; . How/' "$1"; }  # the machine line
cmp -s <(strip "$work/np1/rollout.md") <(strip "$work/np2/rollout.md") || fail "rollout.md differs between 1 and 2 processes"
# --from under mpirun: rank 0 alone rebuilds (every rank writing the same files raced).
"${mpi[@]}" -np 2 "$bin" rollout --from "$work/np2/rollout.json" --resamples 100 --out "$work/from" > "$work/from.log" 2>&1 \
  || { cat "$work/from.log"; fail "rollout --from under mpirun"; }
cmp -s "$work/np2/rollout.md" "$work/from/rollout.md" || fail "--from under mpirun: rollout.md differs"
echo "mpi_rollout: all checks passed"
