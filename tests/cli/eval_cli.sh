#!/usr/bin/env bash
# `fp4train eval` and `fp4train sample`: bad input named and refused; the table and JSON on a
# freshly initialised micro model (--config + --init-seed); and, once checkpoints exist
# eval/sample of a trained run's checkpoint agreeing with its summary.
# Usage: eval_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" steps=10 lr=3e-3 warmup_steps=2 interval=5 windows=12 telemetry_interval=50

# --- bad input -------------------------------------------------------------------------
expect_error "unknown policy 'bogus'" eval --checkpoint "$work/nothing" --policy bogus
expect_error "replay-d" eval --config "$work/micro.toml" --init-seed 1 --policy replay-d0
expect_error "checkpoint $work/nothing does not exist" eval --checkpoint "$work/nothing"
expect_error "checkpoint $work/nothing does not exist" sample --checkpoint "$work/nothing"
expect_error "either --checkpoint" eval
expect_error "either --checkpoint" eval --checkpoint "$work/nothing" --config "$work/micro.toml" --init-seed 1
expect_error "needs --init-seed" eval --config "$work/micro.toml"
expect_error "unknown recipe 'nope'" eval --config "$work/micro.toml" --init-seed 1 --recipe nope
printf 'name = "hp"\n[linear]\nmode = "fp4"\n[high_precision]\nblocks = [7]\n' > "$work/hp.toml"
expect_error "high_precision.blocks" eval --config "$work/micro.toml" --init-seed 1 --recipe "$work/hp.toml"
expect_error "one --policy" sample --config "$work/micro.toml" --init-seed 1 --policy none,current
expect_error "unknown policy 'x'" sample --config "$work/micro.toml" --init-seed 1 --policy x
expect_error "does not exist" eval --config "$work/micro.toml" --init-seed 1 --data "$work/missing"
expect_error "--json" eval --config "$work/micro.toml" --init-seed 1 --json "$work/no/dir/x.json"
expect_error "temperature" sample --config "$work/micro.toml" --init-seed 1 --temperature -1

# --- a freshly initialised micro model ---------------------------------------------------
"$bin" eval --config "$work/micro.toml" --init-seed 3 --recipe ue5m3-b16 --json "$work/init.json" \
  > "$work/init.txt" 2> "$work/init.err" || { cat "$work/init.txt" "$work/init.err"; fail "eval exited non-zero"; }
for p in none current replay-d50 calibrated; do
  grep -q "^$p " "$work/init.txt" || { cat "$work/init.txt"; fail "no table row for $p"; }
done
python3 - "$work/init.json" <<'PY' || fail "init.json check"
import json, math, sys
j = json.load(open(sys.argv[1]))
assert j["policies"] == ["none", "current", "replay-d50", "calibrated"], j["policies"]
r = j["results"]
assert j["tokens"] == 12 * 32 and j["windows"] == 12 and j["batch"] == 4, j
for p, v in r.items():
    assert abs(v["nats_per_token"] - math.log(512)) < 0.5, (p, v)       # untrained: ~ ln V
    assert v["tokens"] == 12 * 32 and v["bytes"] > v["tokens"], v
    assert abs(v["bits_per_byte"] - v["total_nats"] / math.log(2) / v["bytes"]) < 1e-12
assert r["none"]["nats_per_token"] != r["current"]["nats_per_token"]
assert r["replay-d50"]["batches"] == 3 and r["replay-d50"]["interval"] == 50
assert j["calibration"]["split"] == "train" and j["calibration"]["windows"] == 16
assert r["calibrated"]["calibration_tokens"] == 16 * 32
PY
# One policy, comma list and repetition; same numbers as the run with all four.
"$bin" eval --config "$work/micro.toml" --init-seed 3 --recipe ue5m3-b16 --policy current \
  --policy none,current --json "$work/two.json" > /dev/null 2>&1 || fail "eval --policy list"
python3 - "$work/init.json" "$work/two.json" <<'PY' || fail "two.json check"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert b["policies"] == ["current", "none"], b["policies"]
for p in b["policies"]:
    assert a["results"][p] == b["results"][p], p
PY
# Bit-identical under 1 and 2 threads.
OMP_NUM_THREADS=1 "$bin" eval --config "$work/micro.toml" --init-seed 3 --json "$work/t1.json" > /dev/null 2>&1 || fail "1 thread"
OMP_NUM_THREADS=2 "$bin" eval --config "$work/micro.toml" --init-seed 3 --json "$work/t2.json" > /dev/null 2>&1 || fail "2 threads"
cmp <(python3 -c "import json;print(json.load(open('$work/t1.json'))['results'])") \
    <(python3 -c "import json;print(json.load(open('$work/t2.json'))['results'])") || fail "threads differ"

# Sampling: same seed, same text; the window slides past seq_len (32) without error.
s1=$("$bin" sample --config "$work/micro.toml" --init-seed 3 --prompt "The jury said" --tokens 50 --seed 4 2>/dev/null) || fail "sample"
s2=$("$bin" sample --config "$work/micro.toml" --init-seed 3 --prompt "The jury said" --tokens 50 --seed 4 2>/dev/null) || fail "sample again"
[ "$s1" = "$s2" ] || fail "same seed gave different text"
case "$s1" in "The jury said"*) ;; *) fail "sample output does not start with the prompt: $s1" ;; esac
g=$("$bin" sample --config "$work/micro.toml" --init-seed 3 --temperature 0 --tokens 5 --policy calibrated 2>&1 >/dev/null) \
  || fail "greedy calibrated sample"
grep -q "policy calibrated, temperature 0" <<<"$g" || fail "sample summary line: $g"

# --- checkpoints ---------------------------------------------------------------------------
run="$work/runs/ue"
"$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --out "$run" --save-every 5 --quiet \
  > /dev/null 2>&1 || fail "train with --save-every"
[ -f "$run/tokenizer.model" ] || fail "run has no tokenizer.model"
ck="$run/checkpoints/step_00000010.safetensors"
[ -f "$ck" ] || fail "no checkpoint at the final step: $(ls "$run/checkpoints")"
"$bin" eval --checkpoint "$run" --policy none,current --json "$work/ck.json" > "$work/ck.txt" 2>&1 \
  || { cat "$work/ck.txt"; fail "eval --checkpoint RUN"; }
"$bin" eval --checkpoint "$ck" --policy none,current --json "$work/ck2.json" > /dev/null 2>&1 \
  || fail "eval --checkpoint FILE"
python3 - "$run/summary.json" "$work/ck.json" "$work/ck2.json" <<'PY' || fail "checkpoint eval vs summary"
import json, sys
s, a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["results"] == b["results"]
assert a["step"] == 10 and a["recipe"] == "ue5m3-b16" and a["recipe_source"] == "checkpoint", a
# The trainer's final evaluation is policy none (FP32) and current, same windows and batches.
assert a["results"]["none"]["nats_per_token"] == s["heldout_nll"], (a["results"], s)
assert a["results"]["current"]["nats_per_token"] == s["heldout_nll_quant"], (a["results"], s)
PY
"$bin" eval --checkpoint "$run" --recipe nvfp4-te --policy current > /dev/null 2>&1 || fail "eval with another recipe"
"$bin" sample --checkpoint "$run" --prompt "The" --tokens 10 > /dev/null 2>&1 || fail "sample --checkpoint"
expect_error "does not fit the model" eval --checkpoint "$run" --recipe "$work/hp.toml"
head -c 100 "$ck" > "$work/trunc.safetensors"
expect_error "trunc.safetensors" eval --checkpoint "$work/trunc.safetensors"
echo "eval_cli: all checks passed"
