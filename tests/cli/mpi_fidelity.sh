#!/usr/bin/env bash
# `fp4train fidelity` under mpirun (docs/fidelity.md "Processes"): the batches of every
# checkpoint are spread over the ranks (batch k on rank k mod P) and gathered at the end, so
# fidelity.json is bit-identical for 1, 2 and 3 processes (3 does not divide the 4 batches),
# with per-linear roles, scale events and the inference-policy penalties included; rank 0 alone
# writes; `fidelity --from` runs under mpirun too.
# Usage: mpi_fidelity.sh <fp4train binary> <source dir>. Skips (exit 77) without mpirun or MPI.
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
require_mpi
export OMP_NUM_THREADS=1  # up to 3 ranks on a 2-core machine

micro_setup "$work" docs=30 steps=20 interval=10 windows=4
"$bin" train --config "$work/micro.toml" --recipe bf16 --data "$work/text" --out "$work/ref" \
  --save-every 2 --keep-checkpoints 100 --quiet > "$work/train.log" 2>&1 \
  || { cat "$work/train.log"; fail "reference run"; }
args=(fidelity --run "$work/ref" --recipe ue5m3-b16,fp32,nvfp4-te --steps 10,20 --batches 4 --draws 2
      --resamples 100 --linear-roles --data "$work/text" --quiet)
"$bin" "${args[@]}" --out "$work/np1" > "$work/np1.log" 2>&1 || { cat "$work/np1.log"; fail "1 process"; }
for np in 2 3; do
  "${mpi[@]}" -np $np "$bin" "${args[@]}" --out "$work/np$np" > "$work/np$np.log" 2>&1 \
    || { cat "$work/np$np.log"; fail "mpirun -np $np"; }
  [ "$(grep -c '^fidelity: 3 recipes' "$work/np$np.log")" = 1 ] || { cat "$work/np$np.log"; fail "-np $np: not one summary line (rank 0 alone reports)"; }
done
python3 - "$work"/np{1,2,3}/fidelity.json <<'PY' || fail "fidelity.json differs between process counts"
import json, sys
a = [json.load(open(f)) for f in sys.argv[1:4]]
for x in a:
    x.pop("seconds")
r = {x["name"]: x for x in a[0]["recipes"]}
assert r["ue5m3-b16"]["whole"]["rel_error"]["mean"] > 0 and r["ue5m3-b16"]["scale_events"]["x"]["zeroed_nonzeros"] > 0
assert "dX.local" in r["ue5m3-b16"]["roles"] and "loss_penalty_calibrated" in r["ue5m3-b16"]["whole"]
for i in (1, 2):
    assert a[i] == a[0], "-np %d differs from 1 process" % (i + 1)
print("fidelity: 1, 2 and 3 processes give the same fidelity.json")
PY
strip() { sed -E 's/; [0-9]+ s\./; s./' "$1"; }  # the run time, the one thing allowed to differ
cmp -s <(strip "$work/np1/fidelity.md") <(strip "$work/np2/fidelity.md") || fail "fidelity.md differs between 1 and 2 processes"
"${mpi[@]}" -np 2 "$bin" fidelity --from "$work/np2/fidelity.json" --out "$work/from" > "$work/from.log" 2>&1 \
  || { cat "$work/from.log"; fail "fidelity --from under mpirun"; }
cmp -s "$work/np2/fidelity.json" "$work/from/fidelity.json" || fail "--from under mpirun: fidelity.json differs"
echo "mpi_fidelity: all checks passed"
