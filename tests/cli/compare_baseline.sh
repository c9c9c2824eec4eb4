#!/usr/bin/env bash
# `fp4train compare --baseline` and `compare --set` on a micro model: the gap columns are
# measured against the chosen baseline (checked against the runs' own summaries), every run gets
# the overrides (labelled names, resolved config.toml / recipe.toml), `report --baseline`
# rebuilds against another, and a baseline that is not compared, or other --set arguments into
# the same directory, are refused with exit 2 before anything runs.
# Usage: compare_baseline.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=20 vocab_size=384 batch_size=2 steps=6 warmup_steps=2 interval=6 windows=2 progress_seconds=60.0 telemetry_interval=6
cd "$work"
common=(--config micro.toml --recipes fp32,ue5m3-b16,mxfp4 --seeds 2 --policies none,current)

# The baseline must be among the compared recipes: refused before anything is made.
out=$("$bin" compare "${common[@]}" --baseline bf16 --out cmp 2>&1); rc=$?
[ "$rc" = 2 ] || fail "--baseline bf16 (not compared): status $rc: $out"
grep -qF -- "--baseline bf16 is not among the compared recipes (fp32+fp4.block=32" <<<"$out" \
  && fail "no --set yet, but labelled names: $out"
grep -qF -- "--baseline bf16 is not among the compared recipes (fp32, ue5m3-b16, mxfp4)" <<<"$out" \
  || fail "unhelpful message: $out"
[ -e cmp ] && fail "a refused compare created its directory"

out=$("$bin" compare "${common[@]}" --baseline fp32 --set fp4.block=32 --set train.lr=5e-3 \
      --out cmp 2>&1) || fail "compare --baseline fp32 --set failed: $out"
for r in fp32 ue5m3-b16 mxfp4; do
  for s in 1 2; do
    d="cmp/$r+fp4.block=32-s$s"
    [ -f "$d/summary.json" ] || fail "$d/summary.json missing: $(ls cmp)"
    grep -qx "block = 32" "$d/recipe.toml" || fail "$d/recipe.toml lacks block = 32"
    grep -qxF "name = \"$r+fp4.block=32\"" "$d/recipe.toml" || fail "$d/recipe.toml name"
    grep -qx "lr = 0.005" "$d/config.toml" || fail "$d/config.toml lacks lr = 0.005"
  done
done
md=cmp/report.md
grep -qF "| recipe | seeds | final-window loss | vs fp32+fp4.block=32 | Δ vs fp32+fp4.block=32, paired by seed |" $md \
  || fail "header not against the fp32 baseline: $(grep '^| recipe' $md | head -1)"
grep -qF "vs bf16" $md && fail "report still mentions bf16"
grep -qF -- "--set fp4.block=32 --set train.lr=5e-3 --baseline fp32" $md || fail "reproduce command lacks --set/--baseline"
# The rows, recomputed from the summaries: gap of the means and paired differences to fp32.
python3 - <<'PY' || fail "gap columns differ from the summaries"
import json, math, re
def fw(r, s): return json.load(open(f"cmp/{r}+fp4.block=32-s{s}/summary.json"))["final_window_loss"]
md = open("cmp/report.md").read()
for r in ("fp32", "ue5m3-b16", "mxfp4"):
    mean = lambda x: sum(x) / len(x)
    a, b = [fw(r, s) for s in (1, 2)], [fw("fp32", s) for s in (1, 2)]
    gap = 100 * (mean(a) - mean(b)) / mean(b)
    d = [x - y for x, y in zip(a, b)]
    sd = math.sqrt(sum((x - mean(d)) ** 2 for x in d))
    row = f"| {r}+fp4.block=32 | 2 | "
    line = next(l for l in md.splitlines() if l.startswith(row))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[3] == f"{gap:+.2f}%", (r, cells[3], gap)
    assert cells[4] == f"{mean(d):+.4f} ± {sd:.4f}", (r, cells[4], mean(d), sd)
print("gap columns against fp32 agree with the summaries")
PY
if [ -f cmp/plots/loss.png ]; then
  grep -q "plots/loss_vs_baseline.png" $md || fail "report lacks the baseline plot"
  head -c 8 cmp/plots/loss_vs_baseline.png | od -An -tx1 | grep -q "89 50 4e 47" || fail "loss_vs_baseline.png is not a PNG"
  grep -qF "(baseline fp32+fp4.block=32)" <<<"$out" || fail "plot_runs.py was not given the baseline: $out"
fi
python3 -c 'import json; p=json.load(open("cmp/compare.json")); assert p["sets"] == ["fp4.block=32", "train.lr=5e-3"] and p["baseline"] == "fp32", p' \
  || fail "compare.json lacks sets/baseline"

# report --baseline: the same runs against another recipe; the plan's baseline otherwise.
"$bin" report cmp --no-plots --baseline ue5m3-b16 > /dev/null 2>&1 || fail "report --baseline ue5m3-b16"
grep -qF "| vs ue5m3-b16+fp4.block=32 |" $md || fail "report --baseline did not change the baseline"
grep -qF "| ue5m3-b16+fp4.block=32 | 2 | " $md || fail "no ue5m3-b16 row"
grep "^| ue5m3-b16+fp4.block=32 | 2 | " $md | grep -qF "| +0.00% | +0.0000 ± 0.0000 |" || fail "baseline row not +0"
"$bin" report cmp --no-plots > /dev/null 2>&1 || fail "report"
grep -qF "| vs fp32+fp4.block=32 |" $md || fail "report without --baseline did not keep the plan's"
out=$("$bin" report cmp --no-plots --baseline nvfp4-te 2>&1); rc=$?
[ "$rc" = 2 ] && grep -qF "nvfp4-te is not among the compared recipes" <<<"$out" || fail "report --baseline nvfp4-te: $rc $out"

# Other --set arguments into the same directory: refused, nothing changed.
before=$(md5sum < cmp/compare.json)
out=$("$bin" compare "${common[@]}" --set fp4.block=16 --out cmp 2>&1); rc=$?
[ "$rc" = 2 ] || fail "other --set into cmp: status $rc"
grep -qF "made with --set fp4.block=32 --set train.lr=5e-3, not --set fp4.block=16" <<<"$out" || fail "unhelpful: $out"
[ "$(md5sum < cmp/compare.json)" = "$before" ] || fail "refused compare changed compare.json"
# The same ones: everything reused.
out=$("$bin" compare "${common[@]}" --set fp4.block=32 --set train.lr=5e-3 --out cmp --no-plots 2>&1) || fail "rerun: $out"
[ "$(echo "$out" | grep -c 'finished earlier, reused')" = 6 ] || fail "rerun did not reuse the 6 runs: $out"
grep -qF "| vs fp32+fp4.block=32 |" $md || fail "rerun without --baseline lost the plan's baseline"
# train.seed belongs to --seeds.
out=$("$bin" compare "${common[@]}" --set train.seed=3 --out cmp4 2>&1); rc=$?
[ "$rc" = 2 ] && grep -qF -- "--set train.seed=3 and --seeds" <<<"$out" || fail "train.seed: $rc $out"
echo "compare_baseline: all checks passed"
