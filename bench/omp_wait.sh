#!/usr/bin/env bash
# Step time under OpenMP wait policies, on a quiet machine and with one core kept busy by
# another process (`yes > /dev/null`), the case of a shared machine. For each policy and load
# the tiny config trains --steps steps (default 8) with --recipe (default ue5m3-b16); the
# runs go in one order, then in reverse (ABBA), and the table gives the median step_ms of
# steps 3..N of both runs and its ratio to fp4train's default (passive) on the quiet machine.
# Also checks that every policy gave the same losses, bit for bit.
# Usage: bash bench/omp_wait.sh [--steps N] [--recipe R] [--threads T] [--bin PATH]
#   policies: libgomp's own default (GOMP_SPINCOUNT=300000), OMP_WAIT_POLICY=active,
#   GOMP_SPINCOUNT=30000 and 3000 (bounded spins), passive (fp4train's default), and
#   OMP_NUM_THREADS=1 (no waiting at all).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=8; recipe=ue5m3-b16; threads=$(nproc); bin="$root/build/fp4train"
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --recipe) recipe=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "omp_wait.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $steps -ge 4 ]] || { echo "omp_wait.sh: --steps must be at least 4" >&2; exit 2; }
[[ -x $bin ]] || { echo "omp_wait.sh: no fp4train at $bin (bash scripts/build)" >&2; exit 2; }
work=$(mktemp -d); busy=""
cleanup() { [[ -n $busy ]] && kill "$busy" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
names=(libgomp-default active spin30000 spin3000 passive one-thread)
envs=("GOMP_SPINCOUNT=300000" "OMP_WAIT_POLICY=active" "GOMP_SPINCOUNT=30000"
      "GOMP_SPINCOUNT=3000" "OMP_WAIT_POLICY=passive" "OMP_NUM_THREADS=1")
order=()
for load in quiet busy; do for i in "${!names[@]}"; do order+=("$load:$i"); done; done
for ((i = ${#order[@]} - 1; i >= 0; i--)); do order+=("${order[i]}"); done
k=0
for item in "${order[@]}"; do
  k=$((k + 1)); load=${item%%:*}; i=${item##*:}
  if [[ $load == busy && -z $busy ]]; then yes > /dev/null & busy=$!; fi
  if [[ $load == quiet && -n $busy ]]; then kill "$busy"; wait "$busy" 2>/dev/null || true; busy=""; fi
  env OMP_NUM_THREADS="$threads" ${envs[i]} "$bin" train --config "$root/configs/tiny.toml" \
    --recipe "$recipe" --steps "$steps" --quiet --out "$work/$k-$load-${names[i]}" >/dev/null
  echo "omp_wait.sh: $k/${#order[@]} $load ${names[i]} done" >&2
done
python3 - "$work" "${names[@]}" <<'PY'
import glob, json, os, statistics, sys
work, names = sys.argv[1], sys.argv[2:]
med, losses = {}, {}
for d in sorted(glob.glob(f"{work}/*")):
    _, load, name = os.path.basename(d).split("-", 2)
    recs = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
    med.setdefault((load, name), []).extend(r["step_ms"] for r in recs if r["step"] >= 3)
    losses.setdefault(tuple(r["loss"] for r in recs), []).append(os.path.basename(d))
base = statistics.median(med[("quiet", "passive")])
print(f"{'policy':<16} {'quiet: median ms':>17} {'ratio':>7} {'busy core: median ms':>21} {'ratio':>7}")
for n in names:
    q, b = statistics.median(med[("quiet", n)]), statistics.median(med[("busy", n)])
    print(f"{n:<16} {q:>17.1f} {q / base:>7.2f} {b:>21.1f} {b / base:>7.2f}")
print("ratios: to passive on the quiet machine (fp4train's default)")
print("losses bit-identical under every policy and load:", "yes" if len(losses) == 1 else f"NO ({len(losses)} distinct)")
sys.exit(0 if len(losses) == 1 else 1)
PY
