#!/usr/bin/env bash
# `fp4train compare` and `fp4train report` on a micro model and a slice of the Brown corpus:
# the report's table and plots, reuse of finished runs, refusal of a changed config, the
# listing of unfinished runs, and the report rebuilt without training.
# Usage: compare_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=30 vocab_size=384 batch_size=2 steps=12 warmup_steps=2 interval=6 windows=4 progress_seconds=60.0 telemetry_interval=6
cd "$work"

out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 2>&1) || fail "compare failed: $out"
grep -q "\[6/6\] recipe ue5m3-b16, seed 2" <<<"$out" || fail "no progress header for run 6/6: $out"
# At its end, compare prints the first columns of the report's main table, then its path.
grep -q "^Final-window loss (the full table" <<<"$out" || fail "compare printed no table: $out"
for r in fp32 bf16 ue5m3-b16; do
  grep -Eq "^  $r +2 +[0-9.]+ ± [0-9.]+ " <<<"$out" || fail "compare's table lacks the $r row: $out"
done
[ "$(echo "$out" | tail -1 | cut -c1-8)" = "report: " ] || fail "compare's last line is not the report path"
for r in fp32-s1 fp32-s2 bf16-s1 bf16-s2 ue5m3-b16-s1 ue5m3-b16-s2; do
  [ -f "cmp/$r/summary.json" ] || fail "cmp/$r/summary.json missing"
done
md=cmp/report.md
[ -f $md ] || fail "no report.md"
# summary.json names the FP4 GEMM a run's recipe resolved to, and only for runs with FP4 linears
python3 - cmp <<'PY' || fail "summary.json fp4_gemm"
import json, sys
s = lambda r: json.load(open(f"{sys.argv[1]}/{r}-s1/summary.json"))
assert s("ue5m3-b16")["fp4_gemm"] == "decoded-bf16", s("ue5m3-b16")
assert "fp4_gemm" not in s("fp32") and "fp4_gemm" not in s("bf16")
PY
grep -q "^| fp32 | 2 | " $md || fail "no fp32 row with 2 seeds in the report"
grep -q "^| bf16 | 2 | [0-9.]* ± [0-9.]* | +0.00% |" $md || fail "bf16 row lacks mean ± std or its 0% gap"
grep -Eq "^\| ue5m3-b16 \| 2 \| .*× (\([^|]*\) )?\|$" $md || fail "ue5m3-b16 row lacks its step-time ratio"
# Held-out NLL under the four policies, from each run's final checkpoint (eval.json).
grep -q "held-out NLL, none | held-out NLL, current | held-out NLL, replay-d50 | held-out NLL, calibrated |" $md \
  || fail "report lacks the four policy columns: $(grep '^| recipe' $md)"
python3 - <<'PY' || fail "eval.json does not agree with summary.json"
import json
for s in (1, 2):
    e = json.load(open(f"cmp/ue5m3-b16-s{s}/eval.json"))
    m = json.load(open(f"cmp/ue5m3-b16-s{s}/summary.json"))
    assert e["policies"] == ["none", "current", "replay-d50", "calibrated"], e["policies"]
    assert e["step"] == 12, e["step"]
    # The trainer's final evaluation (FP32 and policy `current`) is the same computation.
    assert e["results"]["none"]["nats_per_token"] == m["heldout_nll"], (e["results"]["none"], m)
    assert e["results"]["current"]["nats_per_token"] == m["heldout_nll_quant"], (e["results"]["current"], m)
PY
# The table's fp32 final-window loss is the mean of the two runs' summary values.
want=$(python3 - <<'PY'
import json
v=[json.load(open(f"cmp/fp32-s{s}/summary.json"))["final_window_loss"] for s in (1,2)]
print(f"{sum(v)/2:.4f}")
PY
)
grep -q "^| fp32 | 2 | $want ± " $md || fail "fp32 mean $want not in the table: $(grep '^| fp32 | 2' $md)"
if [ -f cmp/plots/loss.png ]; then
  for p in loss loss_vs_baseline heldout telemetry; do
    head -c 8 cmp/plots/$p.png | od -An -tx1 | grep -q "89 50 4e 47" || fail "cmp/plots/$p.png is not a PNG"
    grep -q "plots/$p.png" $md || fail "report does not show plots/$p.png"
  done
else
  grep -q "Plots were not made" $md || fail "no plots and no note saying why"
  python3 -c 'import matplotlib' 2>/dev/null && fail "matplotlib importable but no plots"
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && fail "matplotlib importable but no plots"
fi

# Rerun: every run is reused, nothing retrained.
out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 2>&1) || fail "rerun failed: $out"
[ "$(echo "$out" | grep -c 'finished earlier, reused')" = 6 ] || fail "rerun did not reuse all 6 runs: $out"
grep -q "^step " <<<"$out" && fail "rerun trained again: $out"

# An interrupted run (no summary, newest checkpoint gone) continues from its step-6 checkpoint
# and ends with the same bits as before.
before=$(python3 -c 'import json; print(json.load(open("cmp/bf16-s1/summary.json"))["final_window_loss"].hex())')
rm cmp/bf16-s1/summary.json cmp/bf16-s1/eval.json cmp/bf16-s1/checkpoints/step_00000012.safetensors
[ -f cmp/bf16-s1/checkpoints/step_00000006.safetensors ] || fail "no step-6 checkpoint kept"
out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 2>&1) || fail "resuming compare failed: $out"
grep -q "resuming cmp/bf16-s1 from step 6" <<<"$out" || fail "did not resume bf16-s1: $out"
after=$(python3 -c 'import json; print(json.load(open("cmp/bf16-s1/summary.json"))["final_window_loss"].hex())')
[ "$before" = "$after" ] || fail "resumed run differs: $before vs $after"
[ -f cmp/bf16-s1/eval.json ] || fail "resumed run has no eval.json"

# A different config (--steps) into the same directory is refused, and changes nothing.
sum_before=$(md5sum cmp/compare.json)
out=$("$bin" compare --config micro.toml --recipes fp32 --steps 13 --out cmp 2>&1) \
  && fail "changed --steps was accepted"
grep -q "different config" <<<"$out" || fail "unhelpful message for a changed config: $out"
[ "$(md5sum cmp/compare.json)" = "$sum_before" ] || fail "refused compare changed compare.json"

# Unknown policy and recipe are refused before training.
out=$("$bin" compare --config micro.toml --recipes fp32,nope --out cmp2 2>&1) && fail "unknown recipe accepted"
grep -q "nope" <<<"$out" || fail "unknown recipe not named: $out"
out=$("$bin" compare --config micro.toml --recipes fp32 --policies current,latest --out cmp2 2>&1) \
  && fail "unknown policy accepted"
grep -q "latest" <<<"$out" || fail "unknown policy not named: $out"
[ -e cmp2 ] && fail "a refused compare created its directory"

# Recipes are labelled by name: a copied file that keeps its name is refused before anything
# runs; given a new name, its runs live under --out named after it, whatever its path.
mkdir -p "$work/my recipes"
sed 's/^amax_interval = 50/amax_interval = 10/' "$src/configs/recipes/ue5m3-b16.toml" > "$work/my recipes/d10.toml"
out=$("$bin" compare --config micro.toml --recipes "ue5m3-b16,$work/my recipes/d10.toml" --out cmp3 2>&1) \
  && fail "two recipes named ue5m3-b16 accepted"
grep -q "both named 'ue5m3-b16'" <<<"$out" || fail "duplicate names not explained: $out"
sed -i 's/^name = .*/name = "ue5m3 d10"/' "$work/my recipes/d10.toml"
out=$("$bin" compare --config micro.toml --recipes "$work/my recipes/d10.toml" --out cmp3 --no-plots 2>&1) \
  || fail "compare with a recipe path failed: $out"
[ -f "cmp3/ue5m3_d10-s1/summary.json" ] || fail "run of a recipe path not under --out: $(ls cmp3)"
grep -q "^| ue5m3 d10 | 1 | " cmp3/report.md || fail "row not labelled by the recipe's name"
# Editing that recipe and rerunning must not reuse the old run silently.
sed -i 's/^amax_interval = 10/amax_interval = 20/' "$work/my recipes/d10.toml"
out=$("$bin" compare --config micro.toml --recipes "$work/my recipes/d10.toml" --out cmp3 --no-plots 2>&1) \
  && fail "a changed recipe reused the old run"
grep -q "different recipe" <<<"$out" || fail "changed recipe not explained: $out"
# A run made before gemm = "auto" moved ue5m3-b16 to decoded-bf16 (its recipe.toml says
# "decoded") is not mixed with new runs, and the refusal names the GEMM.
cp -r cmp cmpold
grep -qx 'gemm = "decoded-bf16"' cmpold/ue5m3-b16-s1/recipe.toml || fail "ue5m3-b16 ran no decoded-bf16"
sed -i 's/^gemm = "decoded-bf16"$/gemm = "decoded"/' cmpold/ue5m3-b16-s1/recipe.toml
out=$("$bin" compare --config micro.toml --recipes ue5m3-b16 --out cmpold --no-plots 2>&1) \
  && fail "a decoded-GEMM run was reused for decoded-bf16"
grep -qF 'made with linear.gemm = "decoded", where ue5m3-b16 now runs "decoded-bf16"' <<<"$out" \
  || fail "the older run's GEMM not named: $out"

# A run that diverges is a result: it is reported, and the other runs go on.
sed -e 's/^lr = .*/lr = 1e4/' micro.toml > div.toml
out=$("$bin" compare --config div.toml --recipes ue5m3-b16,fp32 --out dv --no-plots 2>&1)
grep -q "DIVERGED" <<<"$out" || fail "no divergence at lr 1e4? $out"
grep -q "^| ue5m3-b16 | 0 | .* | at step [0-9]* |" dv/report.md || fail "diverged run not reported: $(cat dv/report.md)"
out=$("$bin" compare --config div.toml --recipes ue5m3-b16,fp32 --out dv --no-plots 2>&1)
grep -q "diverged earlier, kept" <<<"$out" || fail "diverged run retrained: $out"

# A policy added later is computed for the finished runs.
out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 --policies replay-d2 2>&1) || fail "adding a policy failed: $out"
python3 -c 'import json; e=json.load(open("cmp/ue5m3-b16-s2/eval.json")); assert "replay-d2" in e["results"] and "calibrated" in e["results"], e["policies"]' \
  || fail "eval.json lacks the added policy or lost the old ones"
grep -q "held-out NLL, replay-d2 |" cmp/report.md || fail "report lacks the added policy"

# eval refuses text whose tokenizer is not the run's.
mkdir -p other && ls "$src/data/brown/text"/*.txt | tail -20 | xargs -I{} cp {} other/
out=$("$bin" eval --checkpoint cmp/fp32-s1 --data other --policy none 2>&1) && fail "eval on another corpus accepted"
grep -q "token-cache key" <<<"$out" || fail "corpus mismatch not explained: $out"

# Per-window held-out NLL (eval.json window_nll): one value per window, averaging to the NLL;
# the report shows the paired bootstrap against bf16, without a verdict of its own (the row's
# verdict is the t-interval's: docs/compare.md "The report").
python3 - <<'PY' || fail "eval.json window_nll is wrong"
import json
e = json.load(open("cmp/ue5m3-b16-s1/eval.json"))
for pol, r in e["results"].items():
    w = r["window_nll"]
    assert len(w) == e["windows"], (pol, len(w), e["windows"])
    assert abs(sum(w) / len(w) - r["nats_per_token"]) <= 1e-12 * r["nats_per_token"], pol
PY
grep -q "^| ue5m3-b16 | 2 | .*\] \(lower\|higher\|not resolved\) | [-+][0-9.]* \[[-+][0-9.]*, [-+][0-9.]*\] |" cmp/report.md \
  || fail "no t-interval and bootstrap cells for ue5m3-b16: $(grep '^| ue5m3-b16 | 2' cmp/report.md)"

# A study file: every hypothesis gets a verdict; a bad one is refused and changes nothing.
cat > study.toml <<'TOML'
[[hypothesis]]
id = "T1"
claim = "ue5m3-b16 beats bf16"
lower = "ue5m3-b16"
than = "bf16"
[[hypothesis]]
id = "T2"
claim = "held-out"
metric = "heldout_nll"
lower = "ue5m3-b16"
than = "fp32"
[[hypothesis]]
id = "T3"
claim = "needs a recipe not compared"
lower = "mxfp4"
than = "fp32"
TOML
out=$("$bin" report cmp --no-plots --hypotheses study.toml 2>&1) || fail "report --hypotheses failed: $out"
grep -q "^## Hypotheses" cmp/report.md || fail "no Hypotheses section"
grep -q "^| T1 | .* | \*\*\(supported\|contradicted\|not resolved\)\*\*" cmp/report.md || fail "T1 has no verdict: $(grep '^| T1' cmp/report.md)"
grep -q "^| T2 | .*heldout_nll (none)" cmp/report.md || fail "T2 is not on held-out NLL"
grep -q "^| T3 | .* | \*\*not run\*\* (no completed run of mxfp4)" cmp/report.md || fail "T3 not 'not run': $(grep '^| T3' cmp/report.md)"
# hypotheses.json: the same verdicts; T1's per-seed contrast recomputed from the runs' own
# summary.json (final-window loss of ue5m3-b16 minus bf16, seed by seed).
python3 - <<'PY' || fail "hypotheses.json wrong"
import json
h = {x["id"]: x for x in json.load(open("cmp/hypotheses.json"))}
assert sorted(h) == ["T1", "T2", "T3"], sorted(h)
assert h["T3"]["verdict"] == "not run" and "per_seed" in h["T3"], h["T3"]
fw = lambda r, s: json.load(open(f"cmp/{r}-s{s}/summary.json"))["final_window_loss"]
want = [fw("ue5m3-b16", s) - fw("bf16", s) for s in (1, 2)]
got = h["T1"]["per_seed"]
assert len(got) == 2 and all(abs(a - b) < 1e-12 for a, b in zip(got, want)), (got, want)
assert abs(h["T1"]["mean"] - sum(want) / 2) < 1e-12 and len(h["T1"]["t95"]) == 2, h["T1"]
assert h["T1"]["verdict"] in ("supported", "contradicted", "not resolved"), h["T1"]
assert h["T2"]["metric"] == "heldout_nll" and h["T2"]["policy"] == "none", h["T2"]
PY
if [ -f cmp/plots/loss.png ]; then  # with plots: the hypotheses and the block-scale ranges
  "$bin" report cmp --hypotheses study.toml > /dev/null 2>&1 || fail "report with plots failed"
  for p in hypotheses scale_range; do
    head -c 8 cmp/plots/$p.png | od -An -tx1 | grep -q "89 50 4e 47" || fail "cmp/plots/$p.png is not a PNG"
    grep -q "plots/$p.png" cmp/report.md || fail "report does not show plots/$p.png"
  done
  "$bin" report cmp > /dev/null 2>&1 || fail "report without a study failed"
  [ -e cmp/plots/hypotheses.png ] && fail "a stale hypotheses.png outlived its study"
  [ -e cmp/hypotheses.json ] && fail "a stale hypotheses.json outlived its study"
  grep -q "plots/scale_range.png" cmp/report.md || fail "scale_range.png dropped without a study"
  "$bin" report cmp --no-plots --hypotheses study.toml > /dev/null 2>&1 || fail "report failed"
  # --no-plots links none of the old plots (another baseline may have drawn them) and says so.
  grep -q '](plots/' cmp/report.md && fail "report --no-plots links the old plots"
  grep -q "Plots were not remade (--no-plots)" cmp/report.md || fail "report --no-plots does not say plots/ is stale"
fi
sum_before=$(md5sum cmp/report.md)
printf '[[hypothesis]]\nid = "X"\nclaim = "c"\nlower = "a"\n' > bad.toml
out=$("$bin" report cmp --no-plots --hypotheses bad.toml 2>&1); rc=$?
[ $rc = 2 ] || fail "bad study file: exit $rc, want 2: $out"
grep -q "bad.toml: hypothesis X: missing string 'than'" <<<"$out" || fail "bad study not explained: $out"
[ "$(md5sum cmp/report.md)" = "$sum_before" ] || fail "a refused study changed report.md"
out=$("$bin" compare --config micro.toml --recipes fp32 --out cmp4 --hypotheses nope.toml 2>&1) \
  && fail "compare with a missing study file accepted"
[ -e cmp4 ] && fail "a refused compare created its directory"

# --task: the downstream task on every run's final checkpoint (reused runs too), remembered in
# compare.json, tabulated by the report; a rerun does not recompute it.
out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 --task next-sentence --no-plots 2>&1) || fail "compare --task failed: $out"
for r in fp32-s1 fp32-s2 bf16-s1 bf16-s2 ue5m3-b16-s1 ue5m3-b16-s2; do
  python3 -c 'import json,sys; t=json.load(open(sys.argv[1])); assert t["task"]=="next-sentence" and set(t["policies"])>={"none","current","replay-d2"}, t["policies"]' \
    "cmp/$r/task.json" || fail "cmp/$r/task.json missing or lacks a policy"
done
grep -q "^## Downstream task: next-sentence" cmp/report.md || fail "report lacks the task table"
grep -q "^| ue5m3-b16 | 2 | [0-9.]*% \[" cmp/report.md || fail "no ue5m3-b16 task row: $(grep -A8 Downstream cmp/report.md)"
python3 -c 'import json; assert json.load(open("cmp/compare.json"))["task"]=="next-sentence"' || fail "compare.json lacks the task"
out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 --no-plots 2>&1) || fail "rerun after --task failed: $out"
grep -q "next-sentence under" <<<"$out" && fail "the task was recomputed on a rerun: $out"
python3 -c 'import json; assert json.load(open("cmp/compare.json"))["task"]=="next-sentence"' || fail "a rerun without --task forgot the task"
# A missing task.json is computed again; one the report would refuse is recomputed, not reused.
rm cmp/fp32-s1/task.json
echo '{"task":"next-sentence","items":3,"chance":0.25,"results":{}}' > cmp/bf16-s2/task.json
out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 --no-plots 2>&1) || fail "rerun with a lost task.json failed: $out"
grep -q "recipe fp32, seed 1: next-sentence under" <<<"$out" || fail "lost task.json not recomputed: $out"
grep -q "recipe bf16, seed 2: task.json is unusable" <<<"$out" || fail "bad task.json not noticed: $out"
python3 -c 'import json; t=json.load(open("cmp/bf16-s2/task.json")); assert "none" in t["results"]' || fail "bad task.json not recomputed"
out=$("$bin" compare --config micro.toml --recipes fp32 --out cmp5 --task cloze 2>&1) && fail "unknown task accepted"
grep -q "unknown task" <<<"$out" || fail "unknown task not explained: $out"
# A second task accumulates: minimal-pairs into task-minimal-pairs.json beside task.json; the
# report adds its section with item-paired comparisons against the baseline.
out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 --task minimal-pairs --no-plots 2>&1) || fail "compare --task minimal-pairs failed: $out"
for r in fp32-s1 bf16-s2 ue5m3-b16-s1; do
  python3 -c 'import json,sys; t=json.load(open(sys.argv[1])); assert t["task"]=="minimal-pairs" and "none" in t["results"] and len(t["paradigms"])==6, t' \
    "cmp/$r/task-minimal-pairs.json" || fail "cmp/$r/task-minimal-pairs.json missing or malformed"
  [ -f "cmp/$r/task.json" ] || fail "cmp/$r/task.json (next-sentence) lost"
done
python3 -c 'import json; assert json.load(open("cmp/compare.json"))["task"]=="next-sentence,minimal-pairs"' || fail "compare.json lacks both tasks"
grep -q "^## Minimal pairs" cmp/report.md || fail "report lacks the minimal-pairs section"
grep -q "^| \`ue5m3-b16\` − \`bf16\` | current | 2 | " cmp/report.md || fail "no item-paired ue5m3-b16 − bf16 row: $(grep -A12 'Paired comparisons' cmp/report.md)"
grep -q "^## Downstream task: next-sentence" cmp/report.md || fail "the next-sentence table went missing"
out=$("$bin" eval --checkpoint cmp/bf16-s1 --task minimal-pairs --policy none 2>&1) || fail "eval --task minimal-pairs failed: $out"
grep -Eq "^none +cloze +[0-9.]+% \[" <<<"$out" || fail "eval --task minimal-pairs printed no cloze row: $out"

# A summary.json without the files a run writes first is refused, not reused.
mv cmp/bf16-s1/config.toml cmp/bf16-s1/config.toml.away
out=$("$bin" compare --config micro.toml --recipes fp32,bf16,ue5m3-b16 --seeds 2 --out cmp \
  --save-every 6 --keep-checkpoints 2 --no-plots 2>&1) && fail "an incomplete run was reused: $out"
grep -q "bf16-s1 holds summary.json but no config.toml" <<<"$out" || fail "incomplete run not named: $out"
mv cmp/bf16-s1/config.toml.away cmp/bf16-s1/config.toml

# report rebuilds from finished runs and lists an unfinished one.
rm cmp/bf16-s2/summary.json
rm cmp/report.md
out=$("$bin" report cmp --no-plots 2>&1) || fail "report failed: $out"
grep -q "^| bf16 | 1 | " cmp/report.md || fail "report did not drop the unfinished bf16 seed"
grep -q "bf16-s2" cmp/report.md || fail "unfinished run not listed"
out=$("$bin" report "$work/text" 2>&1) && fail "report on a non-compare directory succeeded"
grep -q "compare.json" <<<"$out" || fail "unhelpful report error: $out"
echo "PASS"
