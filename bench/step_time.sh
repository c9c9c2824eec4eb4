#!/usr/bin/env bash
# Whole training-step time per recipe, measured back to back: every recipe trains --steps
# steps (default 12) in the order given, then again in reverse order (ABBA), so a slow drift
# of a shared machine affects all recipes alike. Prints, per recipe, the median step_ms of
# steps 3..N of both runs (step 1 and 2 warm up caches and oneDNN, and step 1 records
# telemetry) and its ratio to the first recipe's median.
# Usage: bash bench/step_time.sh [--config C] [--steps N] [--bin PATH] [recipe ...]
#   default recipes: the eight of docs/numerics.md, fp32 first (the baseline).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
config="$root/configs/tiny.toml"; steps=12; bin="$root/build/fp4train"
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --config) config=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "step_time.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(fp32 bf16 ue5m3-b16 ue5m3-b32 ue5m3-te nvfp4-te nvfp4-all mxfp4)
[[ $steps -ge 4 ]] || { echo "step_time.sh: --steps must be at least 4" >&2; exit 2; }
[[ -x $bin ]] || { echo "step_time.sh: no fp4train at $bin (bash scripts/build)" >&2; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
order=("${recipes[@]}")
for ((i = ${#recipes[@]} - 1; i >= 0; i--)); do order+=("${recipes[i]}"); done
k=0
for r in "${order[@]}"; do
  k=$((k + 1))
  "$bin" train --config "$config" --recipe "$r" --steps "$steps" --quiet --out "$work/$k-$r" >/dev/null
  echo "step_time.sh: $k/${#order[@]} $r done" >&2
done
python3 - "$work" "${recipes[@]}" <<'PY'
import glob, json, statistics, sys
work, recipes = sys.argv[1], sys.argv[2:]
med = {}
for r in recipes:
    ms = []
    for d in glob.glob(f"{work}/*-{r}"):
        if d.rsplit("/", 1)[1].split("-", 1)[1] != r:
            continue
        for line in open(f"{d}/metrics.jsonl"):
            rec = json.loads(line)
            if rec["step"] >= 3:
                ms.append(rec["step_ms"])
    med[r] = statistics.median(ms)
base = recipes[0]
print(f"{'recipe':<14} {'median step (ms)':>17} {'ratio to ' + base:>16}")
for r in recipes:
    print(f"{r:<14} {med[r]:>17.1f} {med[r] / med[base]:>16.2f}")
PY
