#!/usr/bin/env bash
# `fp4train rollout` (docs/fidelity.md "Paired rollouts"): from two checkpoints of a micro fp32
# run, fp32 (the reference), fp32 again, and ue5m3-b16 train 3 steps along 2 batch orders.
#  * the fp32 rollout along order 0 from step 2 is the run itself: its losses of steps 3..5 are
#    the run's, bit for bit, and its gradient norms those the run logged (weights, AdamW moments, sampler position and schedule restored);
#  * fp32 against the fp32 reference: every loss bit-identical, NLL gap and divergence exactly 0
#    (the rollouts are deterministic and start from the same state);
#  * ue5m3-b16 leaves the reference at the first step (non-zero gap and divergence);
#  * the same rollouts with 1, 2 and 3 threads give the same rollout.json (but the machine line),
#    gradient norms included; fp32 again has 0 loss spikes and fp32's gradient norms;
#  * --from rebuilds rollout.md byte for byte; bad input is refused, naming it.
# Usage: rollout_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" steps=8 warmup_steps=2 interval=100 windows=4 telemetry_interval=0
"$bin" train --config "$work/micro.toml" --recipe fp32 --out "$work/ref" --quiet --peak-gflops 1 \
  --save-every 2 --keep-checkpoints 10 > "$work/train.txt" 2>&1 || { cat "$work/train.txt"; fail "train"; }

expect_error "rollout needs --run DIR and --recipe" rollout --run "$work/ref"
expect_error "has no checkpoint of step 5 (it holds steps 2, 4, 6, 8)" rollout --run "$work/ref" --recipe fp32 --steps 5
expect_error "--steps: 'x' is not a step number" rollout --run "$work/ref" --recipe fp32 --steps x
expect_error "names step 4 twice" rollout --run "$work/ref" --recipe fp32 --steps 4,2,4
expect_error "--length: Value 0 not in range" rollout --run "$work/ref" --recipe fp32 --length 0
expect_error "--from rebuilds the report" rollout --from "$work/nothing.json" --run "$work/ref"
expect_error "cannot read $work/nothing.json" rollout --from "$work/nothing.json"
expect_error "is a directory, not a rollout.json" rollout --from "$work"
expect_error "is not a rollout.json" rollout --from "$work/ref/summary.json"
expect_error "run $work/none does not exist" rollout --run "$work/none" --recipe fp32
expect_error "checkpoint 8 + --length 3 runs past the run's train.steps = 8" rollout --run "$work/ref" --recipe fp32 --steps 8 --length 3
touch "$work/afile"
expect_error "--out $work/afile: cannot create the directory" rollout --run "$work/ref" --recipe fp32 --out "$work/afile"

for t in 1 2 3; do
  OMP_NUM_THREADS=$t "$bin" rollout --run "$work/ref" --recipe fp32,ue5m3-b16 --steps 2,4 --length 3 \
    --orders 2 --resamples 200 --out "$work/r$t" --quiet > "$work/r$t.txt" 2>&1 \
    || { cat "$work/r$t.txt"; fail "rollout ($t threads)"; }
done
python3 - "$work" <<'PY' || fail "rollout results"
import json, math, struct, sys
work = sys.argv[1]
a, a2, b = (json.load(open(f"{work}/r{t}/rollout.json")) for t in (1, 2, 3))
assert a["machine"].endswith("1 threads") and b["machine"].endswith("3 threads"), (a["machine"], b["machine"])
a.pop("machine"); a2.pop("machine"); b.pop("machine")
assert a == a2, "1 and 2 threads differ"
assert a == b, "1 and 3 threads differ"
assert "stress" not in a and a["stability"] == {"spike_threshold": 0.1, "grad_norm_limit": 1.0}, a.get("stability")
assert a["recipes"] == ["fp32 (reference)", "fp32", "ue5m3-b16"] and a["steps"] == [2, 4]
ref, again, ue = a["traces"]
bits = lambda v: struct.pack("<d", v)
gap = 0.0
for c in range(2):
    for o in range(2):
        r, f, u = ref[c][o], again[c][o], ue[c][o]
        assert len(r["loss"]) == 3 and all(math.isfinite(v) for v in r["loss"])
        assert [bits(v) for v in f["loss"]] == [bits(v) for v in r["loss"]], "fp32 against fp32 differs"
        assert f["nll"] == r["nll"] == r["nll_fp32"] == f["nll_fp32"]
        assert f["divergence"] == 0.0 == r["divergence"]
        assert len(r["grad_norm"]) == 3 and all(v > 0 for v in r["grad_norm"])
        assert [bits(v) for v in f["grad_norm"]] == [bits(v) for v in r["grad_norm"]], "fp32 grad norms differ"
        assert u["divergence"] > 0 and u["loss"][0] != r["loss"][0], "ue5m3-b16 identical to fp32"
        gap = max(gap, abs(u["nll"] - r["nll"]))
    # Orders differ: order 1 draws other batches than the run's own (order 0).
    assert ref[c][0]["loss"] != ref[c][1]["loss"]
assert gap > 0
# The run's own losses of steps 3..5 (the F64 tensor "losses" of its step-8 checkpoint).
raw = open(f"{work}/ref/checkpoints/step_00000008.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
info = json.loads(raw[8:8 + n])["losses"]
s0, e0 = info["data_offsets"]
run_losses = struct.unpack("<%dd" % ((e0 - s0) // 8), raw[8 + n + s0:8 + n + e0])
assert [bits(v) for v in ref[0][0]["loss"]] == [bits(v) for v in run_losses[2:5]], \
    (ref[0][0]["loss"], run_losses[2:5])
# ... and its gradient norms those the run logged for steps 3..5 (metrics.jsonl).
logged = {m["step"]: m["grad_norm"] for m in map(json.loads, open(f"{work}/ref/metrics.jsonl")) if "grad_norm" in m}
assert ref[0][0]["grad_norm"] == [logged[s] for s in (3, 4, 5)], (ref[0][0]["grad_norm"], logged)
md = open(f"{work}/r1/rollout.md").read()
for s in ("## Gap to the fp32 rollout", "| `fp32` | +0.00000 [+0.00000, +0.00000]", "## Loss gap by step",
          "## Paired contrasts", "| `fp32` | `ue5m3-b16` |", "## Stability", "Stress: none",
          "| `fp32` | +0.00 [+0.00, +0.00] |", "### Stability contrasts"):
    assert s in md, s
print(f"rollout: fp32 again identical at all 3 steps x 2 checkpoints x 2 orders; ue5m3-b16 NLL gap up to {gap:.2e}")
PY
cp "$work/r1/rollout.md" "$work/before.md"; cp "$work/r1/rollout.json" "$work/before.json"
# The file records its bootstrap (200 resamples): --from beside it rebuilds rollout.md as it was
# and leaves the file alone; a recount with other resamples needs an --out of its own.
"$bin" rollout --from "$work/r1/rollout.json" > "$work/from.txt" 2>&1 || { cat "$work/from.txt"; fail "--from"; }
cmp -s "$work/before.md" "$work/r1/rollout.md" || fail "--from did not rebuild rollout.md byte for byte"
cmp -s "$work/before.json" "$work/r1/rollout.json" || fail "--from rewrote its input"
expect_error "would replace the report beside $work/r1/rollout.json; give --out DIR" rollout --from "$work/r1/rollout.json" --resamples 300
"$bin" rollout --from "$work/r1/rollout.json" --resamples 300 --out "$work/r300" > /dev/null 2>&1 || fail "--from --out"
grep -q "300 resamples" "$work/r300/rollout.md" || fail "--from --resamples 300"
# --from: options of new rollouts refused, a damaged file named with what is wrong.
expect_error "go with new ones (given: --length)" rollout --from "$work/r1/rollout.json" --length 5 --out "$work/x"
python3 - "$work" <<'PY' || fail "damaged rollout.json files"
import json, sys
work = sys.argv[1]
good = json.load(open(f"{work}/r1/rollout.json"))
def bad(name, edit):
    d = json.loads(json.dumps(good)); edit(d)
    json.dump(d, open(f"{work}/bad-{name}.json", "w"))
bad("string", lambda d: d["traces"][1][0][0]["loss"].__setitem__(0, "5.0"))
bad("length", lambda d: d.__setitem__("length", 2.5))
bad("seed", lambda d: d.__setitem__("seed", -5))
bad("noref", lambda d: (d["recipes"].pop(0), d["traces"].pop(0)))
bad("stress", lambda d: d.__setitem__("stress", {"lr_scale": -3, "no_warmup": False, "batch_size": 2}))
PY
expect_error "a trace's figure is neither a number nor null: \"5.0\"" rollout --from "$work/bad-string.json" --out "$work/x"
expect_error "length must be a whole number of at least 1, got 2.5" rollout --from "$work/bad-length.json" --out "$work/x"
expect_error "seed must be a whole number of at least 0, got -5" rollout --from "$work/bad-seed.json" --out "$work/x"
expect_error "recipes must list \"fp32 (reference)\" first" rollout --from "$work/bad-noref.json" --out "$work/x"
expect_error "stress.lr_scale must be a finite number above 0" rollout --from "$work/bad-stress.json" --out "$work/x"
echo "rollout_cli: ok"
