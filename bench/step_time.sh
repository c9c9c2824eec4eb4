#!/usr/bin/env bash
# Whole training-step time per recipe, measured back to back: every recipe trains --steps
# steps (default 12) in the order given, then again in reverse order (ABBA), so a slow drift
# of a shared machine affects all recipes alike. Prints, per recipe, the median step_ms of
# steps 3..N of both runs (step 1 and 2 warm up caches and oneDNN, and step 1 records
# telemetry) and its ratio to the first recipe's median.
# Usage: bash bench/step_time.sh [--config C] [--steps N] [--bin PATH] [recipe ...]
#   recipe: a name in configs/recipes or a recipe .toml path (labelled as typed), optionally
#     followed by @VAR=VALUE to run it with that environment variable set, e.g.
#     bf16@FP4_BF16_GEMM=blocked (bench/recipe_entries.sh)
#   default recipes: the eight of docs/numerics.md, fp32 first (the baseline).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/recipe_entries.sh"
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
check_recipe_entries step_time.sh "${recipes[@]}"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
order=("${recipes[@]}")
for ((i = ${#recipes[@]} - 1; i >= 0; i--)); do order+=("${recipes[i]}"); done
k=0
for r in "${order[@]}"; do
  k=$((k + 1))
  # Run k of recipe r (a name or a .toml path, with @VAR=VALUE: that variable set) goes to
  # $work/k; runs.tsv maps k back to r.
  split_recipe_entry "$r"
  run_entry "$bin" train --config "$config" --recipe "$entry_recipe" --steps "$steps" --quiet \
    --out "$work/$k" >/dev/null
  printf '%s\t%s\n' "$k" "$r" >> "$work/runs.tsv"
  echo "step_time.sh: $k/${#order[@]} $r done" >&2
done
python3 - "$work" "${recipes[@]}" <<'PY'
import json, statistics, sys
work, recipes = sys.argv[1], sys.argv[2:]
ms = {r: [] for r in recipes}
for line in open(f"{work}/runs.tsv"):
    k, r = line.rstrip("\n").split("\t", 1)
    for rec in map(json.loads, open(f"{work}/{k}/metrics.jsonl")):
        if rec["step"] >= 3:
            ms[r].append(rec["step_ms"])
med = {r: statistics.median(v) for r, v in ms.items()}
base = recipes[0]
w, rw = max(14, *(len(r) for r in recipes)), max(16, len('ratio to ' + base))
print(f"{'recipe':<{w}} {'median step (ms)':>17} {'ratio to ' + base:>{rw}}")
for r in recipes:
    print(f"{r:<{w}} {med[r]:>17.1f} {med[r] / med[base]:>{rw}.2f}")
PY
