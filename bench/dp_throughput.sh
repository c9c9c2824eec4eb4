#!/usr/bin/env bash
# Data parallelism and micro-batching, measured as ratios in one run (docs/parallel.md): step
# time (fp4train profile) at the same global batch for
#   A  1 process  x 2 threads, micro-batches of M/2 (2 per step)
#   B  2 processes x 1 thread,  micro-batches of M/2 (1 per process)
#   C  1 process  x 2 threads, one forward of the whole batch M
#   D  1 process  x 2 threads, micro-batches of M/4 (4 per step)
# in ABCD DCBA order (drift cancels), repeated ROUNDS times; prints each configuration's
# median step time, tokens/s and communication share, and the ratios B/A (processes against
# threads), A/C and D/C (the cost of micro-batching). A, B, C, D all train the same model on
# the same global batch; B is bit-identical to A.
# Usage: bench/dp_throughput.sh [config (configs/small.toml)] [recipe (ue5m3-b16)] [steps (2)] [rounds (1)]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/build/fp4train"
config=${1:-configs/small.toml}
recipe=${2:-ue5m3-b16}
steps=${3:-2}
rounds=${4:-1}
command -v mpirun > /dev/null || { echo "mpirun not found (scripts/setup installs Open MPI)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
batch=$(sed -n 's/^batch_size *= *\([0-9]*\).*/\1/p' "$root/$config" | head -1)
[ -n "$batch" ] && [ $((batch % 4)) = 0 ] || { echo "train.batch_size of $config must be a multiple of 4"; exit 1; }
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
run() {  # run LABEL N
  local label=$1 n=$2 args=(profile --config "$root/$config" --recipe "$recipe" --steps "$steps" --warmup 1)
  case $label in
    A) OMP_NUM_THREADS=2 "$bin" "${args[@]}" --set train.micro_batch_size=$((batch / 2)) --json "$out/A.$n.json" ;;
    B) OMP_NUM_THREADS=1 "${mpi[@]}" -np 2 "$bin" "${args[@]}" --set train.micro_batch_size=$((batch / 2)) --json "$out/B.$n.json" ;;
    C) OMP_NUM_THREADS=2 "$bin" "${args[@]}" --json "$out/C.$n.json" ;;
    D) OMP_NUM_THREADS=2 "$bin" "${args[@]}" --set train.micro_batch_size=$((batch / 4)) --json "$out/D.$n.json" ;;
  esac > "$out/$label.$n.log" 2>&1 || { cat "$out/$label.$n.log"; exit 1; }
}
n=0
for _ in $(seq 1 "$rounds"); do
  for l in A B C D D C B A; do n=$((n + 1)); echo "run $n: $l" >&2; run $l $n; done
done
python3 - "$out" "$config" "$recipe" <<'PY'
import glob, json, statistics, sys
out, config, recipe = sys.argv[1:4]
runs = {l: [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{l}.*.json"))] for l in "ABCD"}
desc = {"A": "1 process x 2 threads, 2 micro-batches", "B": "2 processes x 1 thread, 1 micro-batch each",
        "C": "1 process x 2 threads, one forward", "D": "1 process x 2 threads, 4 micro-batches"}
med = {l: statistics.median(j["median_step_ms"] for j in runs[l]) for l in "ABCD"}
tps = {l: runs[l][0]["tokens_per_step"] / med[l] * 1e3 for l in "ABCD"}
def share(l, comp):
    v = [j["components"].get(comp, {}).get("fraction", 0) for j in runs[l]]
    return statistics.median(v)
print(f"{config}, recipe {recipe}, {runs['A'][0]['tokens_per_step']} tokens/step, "
      f"{len(runs['A'])} runs per configuration (medians), {runs['A'][0]['compute']['cpu']}")
print("| config | step ms | tokens/s | comm % of step |")
print("|---|---|---|---|")
for l in "ABCD":
    print(f"| {l}: {desc[l]} | {med[l]:.0f} | {tps[l]:.0f} | {100 * share(l, 'comm'):.1f} |")
print(f"B/A tokens/s (2 processes x 1 thread vs 1 x 2 threads): {tps['B'] / tps['A']:.3f}")
print(f"A/C step time (2 micro-batches vs one forward): {med['A'] / med['C']:.3f}")
print(f"D/C step time (4 micro-batches vs one forward): {med['D'] / med['C']:.3f}")
PY
