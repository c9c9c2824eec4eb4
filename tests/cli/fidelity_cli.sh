#!/usr/bin/env bash
# `fp4train fidelity` end to end on a micro run (docs/fidelity.md): fp32 against the exact side
# gives error 0, cosine 1 and gain 1 exactly; an FP4 recipe does not; RNE recipes have variance 0;
# the results do not depend on the thread count; the claims file gets verdicts; fidelity.md
# defines every quantity it prints; steps that can show no held scale's staleness are warned
# about; bad input exits 2 with a message naming what is wrong, before any work.
# Usage: fidelity_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=30 steps=20 interval=10 windows=4
"$bin" train --config "$work/micro.toml" --recipe bf16 --data "$work/text" --out "$work/ref" \
  --save-every 2 --keep-checkpoints 100 --quiet > "$work/train.log" 2>&1 \
  || { cat "$work/train.log"; fail "reference run"; }

cat > "$work/claims.toml" <<'TOML'
[[claim]]
id = "fp32-exact"
metric = "rel_error"
a = "fp32"
b = "ue5m3-b16"
expect = "lower"
[[claim]]
id = "same"
metric = "rel_error"
a = "ue5m3-b16"
b = "ue5m3-b16"
expect = "within"
bound = 0.001
[[claim]]
id = "terms"
metric = "mse"
terms = { "ue5m3-b16" = 2.0, "ue5m3-b16-rne" = -1.0, "fp32" = -1.0 }
expect = "higher"
[[claim]]
id = "absent"
metric = "rel_error"
a = "mxfp4"
b = "ue5m3-b16"
expect = "lower"
TOML

run() {  # run OUT THREADS [extra args]
  local out=$1 threads=$2; shift 2
  OMP_NUM_THREADS=$threads "$bin" fidelity --run "$work/ref" --recipe ue5m3-b16,fp32,ue5m3-b16-rne \
    --steps 10,20 --batches 3 --draws 2 --resamples 200 --data "$work/text" --claims "$work/claims.toml" \
    --out "$work/$out" --linear-roles --quiet "$@" > "$work/$out.log" 2>&1 || { cat "$work/$out.log"; fail "fidelity ($out)"; }
}
run t1 1
run t2 2
grep -q "^fidelity: 3 recipes x 2 checkpoints x 3 batches" "$work/t1.log" || fail "summary line: $(cat "$work/t1.log")"
[ -s "$work/t1/fidelity.md" ] || fail "no fidelity.md"
python3 - "$work/t1/fidelity.json" "$work/t2/fidelity.json" <<'PY' || fail "fidelity.json checks"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["format"] == "fp4train.fidelity.v1" and a["checkpoints"] == [10, 20], a["checkpoints"]
assert a["references"] == "held"
r = {x["name"]: x for x in a["recipes"]}
f = r["fp32"]["whole"]
for m in ("rel_error", "mse", "bias2", "variance", "loss_penalty"):
    assert f[m] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}, (m, f[m])
assert f["gain"] == {"mean": 1.0, "lo": 1.0, "hi": 1.0}, f["gain"]
for m in ("loss_penalty_current", "loss_penalty_replay_d50", "loss_penalty_calibrated"):
    assert f[m] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}, (m, f[m])  # FP32 inference is the exact forward
    assert m in r["ue5m3-b16"]["whole"], m
assert abs(f["cosine"]["mean"] - 1) < 1e-12, f["cosine"]
q = r["ue5m3-b16"]["whole"]
assert q["rel_error"]["lo"] > 0 and q["cosine"]["mean"] < 1, q
assert r["ue5m3-b16"]["has_sr"] and r["ue5m3-b16"]["draws"] == 2
assert not r["ue5m3-b16-rne"]["has_sr"] and r["ue5m3-b16-rne"]["whole"]["variance"]["mean"] == 0.0
assert r["ue5m3-b16"]["whole"]["variance"]["lo"] > 0, "SR draws differ"
assert q["sgd_noise_fraction"]["mean"] > 0 and r["ue5m3-b16"]["whole"]["grad_to_qnoise"]["mean"] > 1
assert r["fp32"]["whole"]["grad_to_qnoise"]["mean"] is None  # +inf: no quantization noise
# Scale events: every role of the FP4 recipe, none for fp32; fractions in [0, 1]; under held
# references (D = 50 from step 1) the activations have grown past the step-1 reference.
ev = r["ue5m3-b16"]["scale_events"]
assert sorted(ev) == ["dy", "dyt", "w", "x", "xt"] and r["fp32"]["scale_events"] == {}, ev
for role, e in ev.items():
    for k in ("saturated_blocks", "zero_guard_blocks", "zeroed_nonzeros", "e4m3_subnormal_blocks", "at_or_above_reference_blocks"):
        assert 0 <= e[k] <= 1, (role, k, e[k])
assert ev["x"]["staleness"] > 1 and ev["x"]["zeroed_nonzeros"] > 0, ev["x"]
for role, e in ev.items():  # log2(a_b/g) quantiles: ordered integers; all-zero blocks a fraction
    qs = [e["log2_ratio_q" + p] for p in ("0.001", "0.01", "0.5", "0.99", "0.999")]
    assert qs == sorted(qs) and all(v == int(v) for v in qs), (role, qs)
    assert 0 <= e["zero_blocks"] <= 1, (role, e["zero_blocks"])
# Held D = 50 references from step 1: today's activations exceed them, so blocks above g exist.
assert ev["x"]["log2_ratio_q0.999"] >= 0 and ev["x"]["at_or_above_reference_blocks"] > 0, ev["x"]
# Per linear and role: every FP4 linear of the micro model (2 layers x 6), each role; the pooled
# figures lie within the linears' (a median, fraction or extreme quantile of a mixture lies
# between its components'); none for fp32.
bl = r["ue5m3-b16"]["block_amax_by_linear"]
assert len(bl) == 12 and all(n.startswith("layers.") for n in bl), sorted(bl)
assert "block_amax_by_linear" not in r["fp32"]
for role in ev:
    per = [bl[n][role] for n in bl]
    for k in ("log2_ratio_q0.5", "log2_ratio_q0.001", "log2_ratio_q0.999", "e4m3_subnormal_blocks"):
        lo, hi = min(p[k] for p in per), max(p[k] for p in per)
        assert lo <= ev[role][k] <= hi, (role, k, lo, ev[role][k], hi)
assert len({bl[n]["x"]["log2_ratio_q0.5"] for n in bl} | {bl[n]["dy"]["log2_ratio_q0.5"] for n in bl}) > 1
c = {x["id"]: x for x in a["contrasts"]}
assert c["fp32-exact"]["verdict"] == "supported", c["fp32-exact"]
assert c["same"]["verdict"] == "supported" and c["same"]["mean"] == 0.0, c["same"]
assert "absent" not in c
t = c["terms"]  # 2·mse(SR) − mse(RNE) − 0: SR's mse exceeds RNE's (variance), so above 0
assert t["terms"] == {"ue5m3-b16": 2.0, "ue5m3-b16-rne": -1.0, "fp32": -1.0} and "a" not in t, t
assert t["verdict"] == "supported" and t["contrast"] == "−fp32 + 2.00·ue5m3-b16 − ue5m3-b16-rne", t  # terms in key order
assert "ue5m3-b16-rne-vs-ue5m3-b16" in [x["id"] for x in a["contrasts"]]
# The thread count changes nothing but the timing.
for k in ("seconds",):
    a.pop(k); b.pop(k)
assert a == b, "results differ between 1 and 2 threads"
print("fidelity: fp32 exact, FP4 rel. error %.4f, thread-count invariant" % q["rel_error"]["mean"])
PY

# --batch-size: another number of sequences per batch (tokens_per_batch follows; fp32 stays exact).
"$bin" fidelity --run "$work/ref" --recipe fp32,ue5m3-b16 --steps 20 --batches 2 --draws 2 --batch-size 2 \
  --data "$work/text" --out "$work/bs2" --quiet > "$work/bs2.log" 2>&1 || { cat "$work/bs2.log"; fail "--batch-size 2"; }
python3 - "$work/bs2/fidelity.json" "$work/t1/fidelity.json" <<'PY' || fail "--batch-size"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["tokens_per_batch"] * 2 == b["tokens_per_batch"], (a["tokens_per_batch"], b["tokens_per_batch"])
r = {x["name"]: x for x in a["recipes"]}
assert r["fp32"]["whole"]["rel_error"]["mean"] == 0.0 and r["ue5m3-b16"]["whole"]["rel_error"]["mean"] > 0
PY

# The outlier stress preserves the exact function bit for bit (L* and g*, mapped back), keeps
# fp32 exact, and raises the FP4 error; a factor that is not a power of two is refused.
"$bin" fidelity --run "$work/ref" --recipe fp32,ue5m3-b16 --steps 20 --batches 2 --draws 2 \
  --stress-factor 4096 --stress-channels 0,5 --data "$work/text" --out "$work/stress" --quiet \
  > "$work/stress.log" 2>&1 || { cat "$work/stress.log"; fail "--stress-factor"; }
"$bin" fidelity --run "$work/ref" --recipe fp32,ue5m3-b16 --steps 20 --batches 2 --draws 2 \
  --data "$work/text" --out "$work/nostress" --quiet > "$work/nostress.log" 2>&1 || fail "no stress"
python3 - "$work/stress/fidelity.json" "$work/nostress/fidelity.json" <<'PY' || fail "outlier stress"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
st = a["stress"]
assert st["factor"] == 4096 and st["channels"] == [0, 5], st
assert st["exact_loss_max_abs_diff"] == 0 and st["exact_grad_max_abs_diff"] == 0, st
assert a["samples"]["exact_loss"] == b["samples"]["exact_loss"], "the stressed exact loss changed"
ra, rb = ({x["name"]: x for x in j["recipes"]} for j in (a, b))
assert ra["fp32"]["whole"]["rel_error"]["mean"] == 0.0
assert ra["ue5m3-b16"]["whole"]["rel_error"]["mean"] > 1.5 * rb["ue5m3-b16"]["whole"]["rel_error"]["mean"]
print("stress: exact function preserved, FP4 error %.3f -> %.3f" % (rb["ue5m3-b16"]["whole"]["rel_error"]["mean"], ra["ue5m3-b16"]["whole"]["rel_error"]["mean"]))
PY

# Per-linear roles (docs/fidelity.md "Per-linear roles"): fp32 is exact in every role; the first
# block's q/k/v_proj read the same X in the exact and the recipe pass (embedding and norm are
# FP32), so local and end-to-end Y agree exactly there; the replayed wgrad is the pass's own, so
# each linear's dW e2e equals its parameter's figures exactly, with and without the stress (its
# mapping back agrees with the parameters'); a claim on a role scope gets a verdict; --from
# rebuilds the same files.
cat > "$work/roles.toml" <<'TOML'
[[claim]]
id = "dx-local"
metric = "rel_error"
scope = "dX.local"
a = "fp32"
b = "ue5m3-b16"
expect = "lower"
TOML
for st in "" "--stress-factor 1024 --stress-channels 3"; do
  out="$work/roles${st:+-stress}"
  "$bin" fidelity --run "$work/ref" --recipe ue5m3-b16,fp32,ue5m3-b16-rne --steps 10,20 --batches 2 --draws 2 \
    --resamples 100 --linear-roles $st --claims "$work/roles.toml" --data "$work/text" --out "$out" --quiet \
    > "$out.log" 2>&1 || { cat "$out.log"; fail "--linear-roles $st"; }
  python3 - "$out/fidelity.json" <<'PY' || fail "per-linear roles $st"
import json, sys
a = json.load(open(sys.argv[1]))
names = a["linear_names"]
assert names[0] == "layers.0.mixer.q_proj" and len(names) == 12, names
r = {x["name"]: x for x in a["recipes"]}
keys = ["Y.local", "Y.e2e", "dX.local", "dX.e2e", "dW.local", "dW.e2e"]
for k in keys:
    assert r["fp32"]["roles"][k]["rel_error"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}, (k, r["fp32"]["roles"][k])
    assert r["fp32"]["roles"][k]["gain"]["mean"] == 1.0
    assert r["ue5m3-b16"]["roles"][k]["rel_error"]["lo"] > 0, k
assert r["ue5m3-b16-rne"]["roles"]["dX.e2e"]["variance"]["mean"] == 0.0
for name in ("ue5m3-b16", "ue5m3-b16-rne"):
    lr, p = r[name]["linear_roles"], r[name]["params"]
    for n in names[:3]:
        assert lr[n]["Y.local"] == lr[n]["Y.e2e"], (name, n, lr[n]["Y.local"], lr[n]["Y.e2e"])
    for n in names:
        for m in ("rel_error", "cosine", "gain"):  # the same per-draw sums, to the last bit
            assert lr[n]["dW.e2e"][m] == p[n][m], (name, n, m, lr[n]["dW.e2e"][m], p[n][m])
        for m in ("bias2", "variance"):  # the spread summed another way (StreamMoments)
            assert abs(lr[n]["dW.e2e"][m] - p[n][m]) <= 1e-9 * max(1e-3, abs(p[n][m])), (name, n, m, lr[n]["dW.e2e"][m], p[n][m])
    # Later layers see errors from earlier ones: end to end is worse than local, overall.
    assert r[name]["roles"]["dX.e2e"]["rel_error"]["mean"] > r[name]["roles"]["dX.local"]["rel_error"]["mean"]
if "stress" in a:  # the mapping back of dX and dW, against the unstressed exact tensors
    assert a["stress"]["exact_roles_max_abs_diff"] == 0, a["stress"]
c = {x["id"]: x for x in a["contrasts"]}
assert c["dx-local"]["verdict"] == "supported" and c["dx-local"]["scope"] == "dX.local", c["dx-local"]
PY
done
"$bin" fidelity --from "$work/roles/fidelity.json" --claims "$work/roles.toml" --out "$work/roles-rebuilt" \
  > "$work/roles-rebuilt.log" 2>&1 || { cat "$work/roles-rebuilt.log"; fail "--from with roles"; }
cmp -s "$work/roles/fidelity.json" "$work/roles-rebuilt/fidelity.json" || fail "--from: roles' fidelity.json differs"
cmp -s "$work/roles/fidelity.md" "$work/roles-rebuilt/fidelity.md" || fail "--from: roles' fidelity.md differs"
grep -q "^| layers.0.mixer.q_proj | " "$work/roles/fidelity.md" || fail "no per-linear table in fidelity.md"
# fidelity.md defines what it prints (docs/fidelity.md "Reading the report"): every column
# heading of every table (its words before any parenthesis), except the names of rows, steps
# and quantiles, appears in its closing Definitions section.
python3 - "$work/roles/fidelity.md" <<'PY' || fail "fidelity.md: a printed quantity is not defined"
import re, sys
md = open(sys.argv[1]).read()
assert "\n## Definitions" in md, "no Definitions section"
defs = " ".join(md.split("\n## Definitions", 1)[1].replace("**", "").split()).lower()
structural = {"recipe", "role", "linear", "id", "metric", "mean [95%]", "median"}
headings = set()
for line, rule in zip(md.splitlines(), md.splitlines()[1:]):
    if line.startswith("| ") and rule.startswith("|---"):
        headings.update(c.strip() for c in line.strip("|").split("|"))
missing = []
for h in sorted(headings):
    name = re.sub(r"\s*\(.*\)$", "", h).lower()
    if name in structural or re.fullmatch(r"step \d+|[\d.]+%|(y|dx|dw) (local|e2e)", name):
        continue
    if name not in defs:
        missing.append(h)
assert not missing, "not in the Definitions section: %s" % missing
assert len(headings) > 20, headings
print("fidelity.md: %d column headings, every quantity defined" % len(headings))
PY

# --from rebuilds the report from fidelity.json alone: the same JSON and markdown.
"$bin" fidelity --from "$work/t1/fidelity.json" --claims "$work/claims.toml" --out "$work/rebuilt" \
  > "$work/rebuilt.log" 2>&1 || { cat "$work/rebuilt.log"; fail "fidelity --from"; }
cmp -s "$work/t1/fidelity.md" "$work/rebuilt/fidelity.md" || fail "--from: fidelity.md differs: $(diff "$work/t1/fidelity.md" "$work/rebuilt/fidelity.md" | head -5)"
cmp -s "$work/t1/fidelity.json" "$work/rebuilt/fidelity.json" || fail "--from: fidelity.json differs"

# Held references (docs/fidelity.md "References"): a D = 4 recipe evaluated at step 11 holds
# what step 9 sampled (weights of checkpoint 8, the training batch of step 9); at step 21 it
# refreshes itself, so there held and current agree bit for bit, and at step 11 they differ.
# ue5m3-b16 (D = 50) holds what step 1 sampled on the initial weights.
sed 's/^amax_interval = .*/amax_interval = 4/; s/^name = .*/name = "ue5m3-d4"/' \
  "$src/configs/recipes/ue5m3-b16.toml" > "$work/ue5m3-d4.toml"
grep -q '^amax_interval = 4' "$work/ue5m3-d4.toml" || fail "could not write the D = 4 recipe"
for mode in held current; do
  "$bin" fidelity --run "$work/ref" --recipe "$work/ue5m3-d4.toml,ue5m3-b16" --steps 10,20 \
    --batches 2 --draws 2 --resamples 50 --data "$work/text" --references $mode \
    --out "$work/$mode" --quiet > "$work/$mode.log" 2>&1 || { cat "$work/$mode.log"; fail "fidelity --references $mode"; }
done
python3 - "$work/held/fidelity.json" "$work/current/fidelity.json" <<'PY' || fail "held references"
import json, sys
h, c = (json.load(open(f)) for f in sys.argv[1:3])
assert h["references"] == "held" and c["references"] == "current"
hr = {x["name"]: x for x in h["recipes"]}
cr = {x["name"]: x for x in c["recipes"]}
assert hr["ue5m3-d4"]["refresh_steps"] == [9, 21], hr["ue5m3-d4"]["refresh_steps"]
assert hr["ue5m3-b16"]["refresh_steps"] == [1, 1], hr["ue5m3-b16"]["refresh_steps"]
assert cr["ue5m3-d4"]["refresh_steps"] == [11, 21], cr["ue5m3-d4"]["refresh_steps"]
hb, cb = hr["ue5m3-d4"]["by_checkpoint"], cr["ue5m3-d4"]["by_checkpoint"]
assert hb[1] == cb[1], ("step 21 refreshes: held == current", hb[1], cb[1])
assert hb[0]["rel_error"] != cb[0]["rel_error"], ("step 11 holds step 9's references", hb[0], cb[0])
# Inference policies: under current references the training forward and eval's current policy
# quantize alike (g = max|X| per call, amax(W) of the same weights): the same loss bit for bit.
cs, hs = c["samples"]["recipes"], h["samples"]["recipes"]
for name in ("ue5m3-d4", "ue5m3-b16"):
    assert cs[name]["whole"]["loss_penalty"] == cs[name]["whole"]["loss_penalty_current"], name
# Held D = 50 references from step 1 are not the batch's own: the training forward differs.
assert hs["ue5m3-b16"]["whole"]["loss_penalty"] != hs["ue5m3-b16"]["whole"]["loss_penalty_current"]
print("held references: step 11 holds step 9's, step 21 refreshes")
PY
# Staleness the steps cannot show (docs/fidelity.md "Choosing the steps"): steps 10 and 20 are
# not both multiples of 4 (nor of 50), so the panel above warned of nothing; steps 8 and 20 are
# multiples of D = 4, each followed by a refresh step (9, 21), so ue5m3-d4 is warned about (its
# name, D, the steps, the run's usable off-grid checkpoints, steps to save), ue5m3-b16 is not,
# and the warning is in fidelity.json and fidelity.md, and survives --from.
for mode in held current; do
  ! grep -q "warning" "$work/$mode.log" || fail "off-grid steps warned ($mode): $(cat "$work/$mode.log")"
done
"$bin" fidelity --run "$work/ref" --recipe "$work/ue5m3-d4.toml,ue5m3-b16" --steps 8,20 \
  --batches 2 --draws 2 --resamples 50 --data "$work/text" --out "$work/grid" --quiet \
  > "$work/grid.out" 2> "$work/grid.err" || { cat "$work/grid.err"; fail "fidelity on the D = 4 grid"; }
want="fidelity: warning: recipe ue5m3-d4 holds its tensor scale for amax_interval D = 4 steps, but every evaluated checkpoint step (8, 20) is a multiple of D, so each is followed by a refresh step (9, 21)"
grep -qF -- "$want" "$work/grid.err" || fail "no staleness warning on stderr: $(cat "$work/grid.err")"
grep -qF -- "this run holds 2, 6, 10, 14, 18 (--steps)" "$work/grid.err" || fail "warning lacks the usable steps: $(cat "$work/grid.err")"
grep -qF -- "e.g. steps 7, 19 and, for their refreshes, 4, 16." "$work/grid.err" || fail "warning lacks the steps to save: $(cat "$work/grid.err")"
[ "$(grep -c "warning" "$work/grid.err")" = 1 ] || fail "ue5m3-b16 (D = 50) warned too: $(cat "$work/grid.err")"
grep -qF -- "**Warning:** recipe ue5m3-d4 holds its tensor scale" "$work/grid/fidelity.md" || fail "no warning in fidelity.md"
python3 - "$work/grid/fidelity.json" "$work/held/fidelity.json" <<'PY' || fail "warnings in fidelity.json"
import json, sys
g, h = (json.load(open(f)) for f in sys.argv[1:3])
assert len(g["warnings"]) == 1 and g["warnings"][0].startswith("recipe ue5m3-d4 holds"), g["warnings"]
assert h["warnings"] == [], h["warnings"]
r = {x["name"]: x for x in g["recipes"]}
assert r["ue5m3-d4"]["refresh_steps"] == [9, 21], r["ue5m3-d4"]["refresh_steps"]  # the rule warned about
assert r["ue5m3-d4"]["scale_events"]["x"]["staleness"] == 1.0, r["ue5m3-d4"]["scale_events"]["x"]
PY
"$bin" fidelity --from "$work/grid/fidelity.json" --out "$work/grid-rebuilt" > /dev/null 2> "$work/grid-rebuilt.err" \
  || { cat "$work/grid-rebuilt.err"; fail "--from of a warned panel"; }
grep -qF -- "$want" "$work/grid-rebuilt.err" || fail "--from does not repeat the warning"
cmp -s "$work/grid/fidelity.md" "$work/grid-rebuilt/fidelity.md" || fail "--from: the warned fidelity.md differs"
# D = 2 against checkpoints of every second step: none off the grid to offer, only steps to save.
sed 's/^amax_interval = .*/amax_interval = 2/; s/^name = .*/name = "ue5m3-d2"/' \
  "$src/configs/recipes/ue5m3-b16.toml" > "$work/ue5m3-d2.toml"
"$bin" fidelity --run "$work/ref" --recipe "$work/ue5m3-d2.toml" --steps 20 --batches 2 --draws 2 \
  --resamples 20 --data "$work/text" --out "$work/grid2" --quiet > /dev/null 2> "$work/grid2.err" \
  || { cat "$work/grid2.err"; fail "fidelity on the D = 2 grid"; }
grep -qF -- "D = 2 steps, but every evaluated checkpoint step (20) is a multiple of D" "$work/grid2.err" \
  && grep -qF -- "This run holds no checkpoint it could evaluate instead" "$work/grid2.err" \
  && grep -qF -- "e.g. steps 19 and, for their refreshes, 18." "$work/grid2.err" \
  || fail "the D = 2 warning: $(cat "$work/grid2.err")"
rm "$work/ref/checkpoints/step_00000008.safetensors"
"$bin" fidelity --run "$work/ref" --recipe "$work/ue5m3-d4.toml" --steps 10 --batches 2 \
  --data "$work/text" --out "$work/miss" > /dev/null 2> "$work/miss.err"
[ $? = 2 ] && grep -q "lacks steps 8 (train the reference run with --save-every" "$work/miss.err" \
  || fail "a missing refresh checkpoint: $(cat "$work/miss.err")"

# Bad input: exit 2, one message naming the problem.
bad() {  # bad WANT ARGS...
  local want=$1; shift
  "$bin" fidelity "$@" > "$work/bad.out" 2> "$work/bad.err"
  local rc=$?
  [ "$rc" = 2 ] || fail "fidelity $*: exit $rc, want 2 ($(cat "$work/bad.err"))"
  grep -qF -- "$want" "$work/bad.err" || fail "fidelity $*: message lacks '$want': $(cat "$work/bad.err")"
}
mkdir -p "$work/empty"
bad "does not exist" --run "$work/nope" --recipe ue5m3-b16
bad "holds no checkpoints" --run "$work/empty" --recipe ue5m3-b16
bad "no checkpoint of step 15 (it holds steps 2, 4, 6, 10, 12" --run "$work/ref" --recipe ue5m3-b16 --steps 15 --data "$work/text"
bad "--steps: 'x' is not a step number" --run "$work/ref" --recipe ue5m3-b16 --steps x
bad "--steps: '1.5' is not a step number" --run "$work/ref" --recipe ue5m3-b16 --steps 1.5
# A whole number in scientific notation is that step, as for every integer option.
bad "no checkpoint of step 15 (" --run "$work/ref" --recipe ue5m3-b16 --steps 1.5e1 --data "$work/text"
bad "recipe nope" --run "$work/ref" --recipe nope --data "$work/text"
printf '[high_precision]\nblocks = [7]\n' > "$work/far.toml"
bad "does not fit the model" --run "$work/ref" --recipe "$work/far.toml" --data "$work/text"
bad "--batches" --run "$work/ref" --recipe ue5m3-b16 --batches 1
printf '[[claim]]\nid = "x"\nmetric = "rel_error"\na = "ue5m3-b16"\nb = "fp32"\nexpect = "smaller"\n' > "$work/badclaim.toml"
bad 'expect must be' --run "$work/ref" --recipe ue5m3-b16,fp32 --batches 2 --draws 1 --data "$work/text" --claims "$work/badclaim.toml" --out "$work/bc" --quiet
bad "rounds stochastically: its bias and variance need --draws 2" --run "$work/ref" --recipe ue5m3-b16 --draws 1 --data "$work/text"
bad "is not a directory" --run "$work/ref/summary.json" --recipe ue5m3-b16
touch "$work/afile"
bad "cannot be created" --run "$work/ref" --recipe ue5m3-b16 --out "$work/afile"
bad "--seed" --run "$work/ref" --recipe ue5m3-b16 --seed -1
claim_err() {  # claim_err WANT TOML-BODY: a bad claims file, refused before any pass
  printf '[[claim]]\nid = "x"\n%s\n' "$2" > "$work/c.toml"
  bad "$1" --run "$work/ref" --recipe ue5m3-b16,fp32 --batches 2 --draws 2 --data "$work/text" --claims "$work/c.toml" --out "$work/ce" --quiet
  [ ! -e "$work/ce/fidelity.json" ] || fail "a bad claims file still produced a panel"
}
claim_err "unknown key 'scop'" $'metric = "rel_error"\nscop = "linears"\na = "fp32"\nb = "ue5m3-b16"\nexpect = "lower"'
claim_err "exists for scope whole only" $'metric = "loss_penalty"\nscope = "linears"\na = "fp32"\nb = "ue5m3-b16"\nexpect = "lower"'
claim_err "must be a finite number" $'metric = "rel_error"\nterms = { fp32 = nan }\nexpect = "lower"'
claim_err "scope 'nonsense' is not whole, linears or a parameter" $'metric = "rel_error"\nscope = "nonsense"\na = "fp32"\nb = "ue5m3-b16"\nexpect = "lower"'
bad "--linear-roles go with a new panel" --from "$work/t1/fidelity.json" --linear-roles
bad "names ue5m3-b16 twice" --run "$work/ref" --recipe ue5m3-b16,fp32,ue5m3-b16 --data "$work/text"
bad "names step 20 twice" --run "$work/ref" --recipe ue5m3-b16 --steps 20,20 --data "$work/text"
bad "names channel 3 twice" --run "$work/ref" --recipe ue5m3-b16 --stress-factor 4 --stress-channels 3,3 --data "$work/text"
bad "--stress-channels needs --stress-factor" --run "$work/ref" --recipe ue5m3-b16 --stress-channels 3 --data "$work/text"
printf '[[claim]]\nid = "r"\nmetric = "rel_error"\nscope = "dX.local"\na = "fp32"\nb = "ue5m3-b16"\nexpect = "lower"\n' > "$work/rc.toml"
bad "needs a panel run with --linear-roles" --from "$work/nostress/fidelity.json" --claims "$work/rc.toml" --out "$work/rc"
claim_err 'id "x" is used twice' $'metric = "rel_error"\na = "fp32"\nb = "ue5m3-b16"\nexpect = "lower"\n[[claim]]\nid = "x"\nmetric = "rel_error"\na = "fp32"\nb = "ue5m3-b16"\nexpect = "lower"'
claim_err 'bound goes with expect = "within" only' $'metric = "rel_error"\na = "fp32"\nb = "ue5m3-b16"\nexpect = "lower"\nbound = 0.1'
claim_err "role scopes such as dX.local need --linear-roles" $'metric = "rel_error"\nscope = "dX.local"\na = "fp32"\nb = "ue5m3-b16"\nexpect = "lower"'
# A recipe whose RHT needs a token count the run does not have (30 tokens per micro-batch).
"$bin" train --config "$work/micro.toml" --recipe bf16 --data "$work/text" --out "$work/s30" --steps 2 \
  --save-every 2 --set train.seq_len=30 --set train.micro_batch_size=1 --quiet > "$work/s30.log" 2>&1 \
  || { cat "$work/s30.log"; fail "the 30-token run"; }
bad "multiple of 16" --run "$work/s30" --recipe nvfp4-te --data "$work/text"
bad "must be a power of two" --run "$work/ref" --recipe ue5m3-b16 --stress-factor 3
bad "outside 0..31" --run "$work/ref" --recipe ue5m3-b16 --stress-factor 4 --stress-channels 40 --data "$work/text"
bad "not a fidelity.json" --from "$work/ref/summary.json"
bad "--from rebuilds the report of a finished panel" --from "$work/t1/fidelity.json" --run "$work/ref"
bad "needs --run DIR and --recipe" --recipe ue5m3-b16
echo "fidelity_cli: all checks passed"
