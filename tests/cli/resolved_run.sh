#!/usr/bin/env bash
# One resolved run for every command (include/fp4/train/resolved_run.h): train, profile, info,
# data, compare, eval and the Python module, given the same config, recipe and --set
# arguments, resolve the same run: the same label and the same per-linear plans. Each writes
# what it resolved to FP4_RESOLVED_RUN_LOG (one JSON line per resolution); the labels the
# commands print are checked too.
# Usage: resolved_run.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=20 steps=4 warmup_steps=1 interval=4 windows=2
cd "$work"

# The config key labels the run; the recipe keys change its plans (block 32, the last block
# in BF16). `data` takes config keys only.
config_sets=(--set model.vocab_size=512)
recipe_sets=(--set fp4.block=32 --set high_precision.final_blocks=1)
label="micro+model.vocab_size=512"
recipe=ue5m3-b16

# run ENTRY ARGS...: fp4train ARGS with the log in log.ENTRY; its stdout in out.ENTRY.
run() {
  local entry=$1; shift
  FP4_RESOLVED_RUN_LOG="$work/log.$entry" OMP_NUM_THREADS=2 "$bin" "$@" >"$work/out.$entry" 2>&1 \
    || fail "$entry failed: $(tail -5 "$work/out.$entry")"
  [ -s "$work/log.$entry" ] || fail "$entry resolved no run (no line in FP4_RESOLVED_RUN_LOG)"
}
run train train --config micro.toml --recipe $recipe "${config_sets[@]}" "${recipe_sets[@]}" \
  --out "$work/run" --quiet
run profile profile --config micro.toml --recipe $recipe "${config_sets[@]}" "${recipe_sets[@]}" \
  --steps 1 --warmup 0
run info info --config micro.toml --recipe $recipe "${config_sets[@]}" "${recipe_sets[@]}"
run data data --config micro.toml "${config_sets[@]}"
run compare compare --config micro.toml --recipes $recipe "${config_sets[@]}" "${recipe_sets[@]}" \
  --seeds 1 --out "$work/cmp" --policies none --no-plots
run eval eval --config micro.toml --init-seed 1 --recipe $recipe "${config_sets[@]}" \
  "${recipe_sets[@]}" --policy none --windows 2

# The Python module, where it is built (build/python next to the binary).
py_dir="$(dirname "$bin")/python"
entries="train profile info compare eval"
if ls "$py_dir"/fp4train/_core*.so >/dev/null 2>&1; then
  FP4_RESOLVED_RUN_LOG="$work/log.python" PYTHONPATH="$py_dir" python3 - "$recipe" <<'PY' \
    || fail "python resolve_run failed"
import sys, fp4train
r = fp4train.resolve_run("micro.toml", sys.argv[1],
                         ["model.vocab_size=512", "fp4.block=32", "high_precision.final_blocks=1"])
assert r.label == "micro+model.vocab_size=512", r.label
assert [p["mode"] for p in r.plan()][-2:] == ["bf16", "fp32"], r.plan()[-2:]
PY
  entries="$entries python"
else
  echo "resolved_run: note: the Python module is not built ($py_dir); its entry is not checked"
fi

# Every entry's resolution with a recipe is the same; data's label is the same.
python3 - "$work" "$label" $entries <<'PY' || fail "the entry points resolved different runs"
import json, sys
work, label, entries = sys.argv[1], sys.argv[2], sys.argv[3:]
def lines(entry):
    return [json.loads(l) for l in open(f"{work}/log.{entry}")]
runs = {}
for e in entries:
    with_recipe = [r for r in lines(e) if r["recipe"]]
    assert len(with_recipe) == 1, (e, "resolved", len(with_recipe), "runs with a recipe")
    runs[e] = with_recipe[0]
first = runs[entries[0]]
assert first["label"] == label, first["label"]
assert len(first["plans"]) == 12 and first["plans"][-1]["mode"] == "bf16", first["plans"]
assert first["plans"][0]["fprop.x"][2] == 32, first["plans"][0]
for e, r in runs.items():
    assert r == first, (e, "differs from", entries[0], r, first)
data = lines("data")
assert len(data) == 1 and data[0]["label"] == label and data[0]["plans"] == [], data
print("resolved_run: %d entry points, label %s, %d linears" % (len(runs) + 1, label, len(first["plans"])))
PY

# The labels the commands print are the resolved one.
grep -qF "summary ($label, recipe" "$work/out.train" || fail "train summary: $(grep summary "$work/out.train")"
grep -qF "config $label, recipe" "$work/out.profile" || fail "profile header: $(head -3 "$work/out.profile")"
grep -qF "config $label, recipe" "$work/out.info" || fail "info header: $(head -3 "$work/out.info")"
grep -qF "\"config_name\": \"$label\"" "$work/cmp/compare.json" || fail "compare.json config_name"
echo "resolved_run: ok"
