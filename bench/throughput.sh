#!/usr/bin/env bash
# The whole-step figures of docs/performance.md in one run: `fp4train profile` of each recipe at
# one config, in ABBA order (every recipe, then again in reverse) so that a slow drift of a
# shared machine affects all recipes alike. Prints per recipe the median step time over all
# timed steps of both rounds, its ratio to the first recipe, MFU against the FP32 GEMM rate (the
# best measured on this machine, remeasured by every profile run), the step-time ratio nvfp4-te
# / ue5m3-b16 when both ran, and the median ms/step of every component side by side.
# Usage: bash bench/throughput.sh [--config C] [--steps N] [--warmup W] [--rounds R]
#                                 [--bin PATH] [--json-dir DIR] [recipe ...]
#   recipe: a name in configs/recipes or a recipe .toml path, optionally followed by
#     @VAR=VALUE to run it with that environment variable set, e.g. bf16@FP4_BF16_GEMM=blocked
#     (bench/recipe_entries.sh)
#   defaults: configs/small.toml, 4 timed steps after 2 warm-up steps, 1 ABBA round,
#   recipes fp32 ue5m3-b16 nvfp4-te bf16 (the first is the baseline).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/recipe_entries.sh"
config="$root/configs/small.toml"; steps=4; warmup=2; rounds=1; bin="$root/build/fp4train"
jdir=""
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --config) config=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --json-dir) jdir=$2; shift 2 ;;
    *) echo "throughput.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(fp32 ue5m3-b16 nvfp4-te bf16)
[[ -x $bin ]] || { echo "throughput.sh: no fp4train at $bin (bash scripts/build)" >&2; exit 2; }
check_recipe_entries throughput.sh "${recipes[@]}"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
order=()
for ((r = 0; r < rounds; r++)); do
  order+=("${recipes[@]}")
  for ((i = ${#recipes[@]} - 1; i >= 0; i--)); do order+=("${recipes[i]}"); done
done
# Recipe i's runs are $work/<k>@<i>.json (recipes may be paths); python maps i back to the name.
k=0
for r in "${order[@]}"; do
  k=$((k + 1))
  for i in "${!recipes[@]}"; do [[ ${recipes[i]} == "$r" ]] && idx=$i; done
  split_recipe_entry "$r"
  run_entry "$bin" profile --config "$config" --recipe "$entry_recipe" --steps "$steps" \
    --warmup "$warmup" --json "$work/$k@$idx.json" >/dev/null
  echo "throughput.sh: $k/${#order[@]} $r: $(python3 -c "import json,sys; print('%.1f ms/step' % json.load(open(sys.argv[1]))['mean_step_ms'])" "$work/$k@$idx.json")" >&2
done
[[ -z $jdir ]] || { mkdir -p "$jdir"; cp "$work"/*.json "$jdir"/; }
python3 - "$work" "$config" "${recipes[@]}" <<'PY'
import glob, json, os, statistics, sys
work, config, recipes = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = {r: [] for r in recipes}
for f in glob.glob(f"{work}/*.json"):
    r = recipes[int(os.path.basename(f).split("@", 1)[1][:-5])]
    runs[r].append(json.load(open(f)))
med, comps = {}, {}
for r, js in runs.items():
    med[r] = statistics.median(ms for j in js for ms in j["step_ms"])
    names = {c for j in js for c in j["components"]}
    comps[r] = {c: statistics.median(j["components"].get(c, {"ms_per_step": 0})["ms_per_step"] for j in js)
                for c in names}
any_run = runs[recipes[0]][0]
peak = max(j["peak_gflops"] for js in runs.values() for j in js)
fpt, tps = any_run["model_flops_per_token"], any_run["tokens_per_step"]
print(f"config {os.path.basename(config)}: {tps} tokens/step, {fpt / 1e6:.1f} M model FLOPs/token, "
      f"{any_run['threads']} threads; FP32 GEMM rate {peak:.1f} GFLOP/s (best measured)")
base = recipes[0]
w, rw = max(12, *(len(r) for r in recipes)), max(14, len('ratio to ' + base))
print(f"\n{'recipe':<{w}} {'median step (ms)':>17} {'ratio to ' + base:>{rw}} {'tokens/s':>9} {'MFU':>6} {'peak RSS':>10}")
for r in recipes:
    mfu = fpt * tps / (med[r] / 1e3) / (peak * 1e9)
    rss = max(j["peak_rss_bytes"] for j in runs[r]) / 2**20
    print(f"{r:<{w}} {med[r]:>17.1f} {med[r] / med[base]:>{rw}.3f} {tps / (med[r] / 1e3):>9.0f} "
          f"{100 * mfu:>5.1f}% {rss:>8.0f} MiB")
if "nvfp4-te" in med and "ue5m3-b16" in med:
    print(f"\nnvfp4-te / ue5m3-b16 step time: {med['nvfp4-te'] / med['ue5m3-b16']:.3f}")
names = sorted({c for r in recipes for c in comps[r]},
               key=lambda c: -max(comps[r].get(c, 0) for r in recipes))
cw = [max(12, len(r) + 1) for r in recipes]
print(f"\n{'ms/step (median)':<22}" + "".join(f"{r:>{x}}" for r, x in zip(recipes, cw)))
for c in names:
    print(f"{c:<22}" + "".join(f"{comps[r].get(c, 0):>{x}.1f}" for r, x in zip(recipes, cw)))
PY
