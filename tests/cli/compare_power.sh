#!/usr/bin/env bash
# Power before cost and checkpoints of `fp4train compare` (docs/compare.md "Power before cost",
# "The report", "Checkpoints"): configs/studies/noise.toml is what `fp4train noise` makes of
# its committed sources; on a micro model, compare prints the power estimate from a noise
# table before training, warns when the seeds cannot resolve --effect (and not when they can),
# says the noise of an unmeasured config is unknown; the report has a Power table without
# --hypotheses and one verdict word per row; each run keeps only its final checkpoint, plus
# the --checkpoint-steps ones.
# Usage: compare_power.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

# The committed noise table is rebuilt, byte for byte, from the sources its header names.
table="$src/configs/studies/noise.toml"
[ -f "$table" ] || fail "no $table"
gen=$(sed -n 's/^#   \(fp4train noise .*\)$/\1/p' "$table")
[ -n "$gen" ] || fail "$table names no generating command in its header"
(cd "$src" && "$bin" ${gen#fp4train } --out "$work/noise.rebuilt" >/dev/null 2>"$work/noise.err") \
  || fail "rebuilding the noise table failed: $(cat "$work/noise.err")"
cmp -s "$table" "$work/noise.rebuilt" \
  || fail "configs/studies/noise.toml is stale; rerun its header's command: $(diff "$table" "$work/noise.rebuilt" | head -20)"
echo "ok: noise table rebuilt from its sources"

micro_setup "$work" docs=20 vocab_size=384 batch_size=2 steps=6 warmup_steps=2 interval=6 windows=2 progress_seconds=60.0 telemetry_interval=6
cd "$work"
common=(--config micro.toml --recipes fp32,ue5m3-b16 --seeds 2 --policies none --no-plots --save-every 2)

# Bad --checkpoint-steps: exit 2 before anything is made.
out=$("$bin" compare "${common[@]}" --checkpoint-steps 2,99 --out cmp 2>&1); rc=$?
[ "$rc" = 2 ] || fail "--checkpoint-steps 99 of 6 steps: status $rc: $out"
grep -qF -- "--checkpoint-steps: step 99 is not a step of the runs (1..6)" <<<"$out" || fail "message: $out"
[ -e cmp ] && fail "a refused compare created its directory"

# A config the table does not hold: its noise is unknown, a pilot is suggested.
out=$("$bin" compare "${common[@]}" --noise "$table" --out cmp 2>&1) || fail "compare failed: $out"
grep -qF "power: the paired noise of config micro is unknown" <<<"$out" || fail "no unknown-noise line: $out"
grep -qF "a pilot measures it" <<<"$out" || fail "no pilot suggestion: $out"
grep -q "resolves ±0.005 nats with [0-9]* seeds" <<<"$out" || fail "no measured config suggested: $out"
# The power lines come before the first run.
[ "$(echo "$out" | grep -n "power:" | head -1 | cut -d: -f1)" -lt \
  "$(echo "$out" | grep -n "\[1/4\]" | head -1 | cut -d: -f1)" ] || fail "power printed after training: $out"

# Checkpoints: only the final one per run by default.
for d in cmp/fp32-s1 cmp/fp32-s2 cmp/ue5m3-b16-s1 cmp/ue5m3-b16-s2; do
  ls "$d/checkpoints" | grep -qx "step_00000006.safetensors" || fail "$d lacks its final checkpoint"
  [ "$(ls "$d/checkpoints" | wc -l)" = 1 ] || fail "$d keeps more than the final checkpoint: $(ls "$d/checkpoints")"
done

# The report: a Power table without --hypotheses, and one verdict word per main-table row.
md=cmp/report.md
grep -q "^## Hypotheses" $md && fail "hypotheses section without --hypotheses"
grep -q "^## Power" $md || fail "report lacks the Power table"
grep -Eq "^\| ue5m3-b16 \| 2 \| [0-9.]+ \| ±[0-9.]+ \| [0-9≥ ]+ \|$" $md \
  || fail "Power row of ue5m3-b16: $(sed -n '/^## Power/,/^## /p' $md)"
grep -qF "bootstrap over windows (evaluation noise only)" $md || fail "bootstrap column not labelled"
row=$(grep "^| ue5m3-b16 | 2 | [0-9]" $md | head -1)
words=$(echo "$row" | grep -oE "lower|higher|not resolved" | wc -l)
[ "$words" = 1 ] || fail "the ue5m3-b16 row has $words verdict words: $row"

# `noise` of something that is not a comparison: exit 2 naming it.
out=$("$bin" noise "$work/text" 2>&1); rc=$?
[ "$rc" = 2 ] || fail "noise of a non-comparison: status $rc: $out"
grep -qF "$work/text holds no compare.json" <<<"$out" || fail "noise message: $out"

# The noise of this comparison, measured, then read back by a rerun (every run reused).
"$bin" noise cmp --out noise.toml || fail "fp4train noise failed"
grep -qx 'config = "micro"' noise.toml || fail "noise.toml: $(cat noise.toml)"
grep -qx 'baseline = "fp32"' noise.toml || fail "noise.toml baseline: $(cat noise.toml)"
grep -Eq '^"ue5m3-b16" = \{ seeds = 2, std = [0-9.]+ \}$' noise.toml || fail "noise.toml row: $(cat noise.toml)"
out=$("$bin" compare "${common[@]}" --noise noise.toml --effect 0.00001 --out cmp 2>&1) \
  || fail "rerun failed: $out"
grep -qF "power: the paired noise of config micro (noise.toml) against fp32, for ±1e-05 nats with the planned 2 seeds:" <<<"$out" \
  || fail "no power header: $out"
grep -Eq "^  ue5m3-b16: paired std [0-9.]+ -> 95% half-width ±[0-9.]+; ±1e-05 takes (>= )?[0-9]+ seeds \(measured over 2 seeds in cmp\)$" <<<"$out" \
  || fail "no power line for ue5m3-b16: $out"
grep -q "^WARNING: 2 seeds cannot resolve ±1e-05 nats on micro: it takes [0-9]* seeds" <<<"$out" \
  || fail "no warning: $out"
grep -q "finished earlier, reused" <<<"$out" || fail "the rerun trained again: $out"
grep -q "^| ue5m3-b16 | 2 | .* | [0-9≥ ]* |$" $md || fail "no Power row after the rerun"
grep -qF -- "--effect 1e-05" $md || fail "reproduce command lacks --effect: $(grep 'fp4train compare' $md)"
out=$("$bin" compare "${common[@]}" --noise noise.toml --effect 10 --out cmp 2>&1) || fail "rerun failed: $out"
grep -q "WARNING" <<<"$out" && fail "warned although 2 seeds resolve ±10 nats: $out"
grep -qF "±10 takes 2 seeds" <<<"$out" || fail "no power line at ±10: $out"
grep -qF "measured at" <<<"$out" && fail "a note on steps although they agree: $out"
# Without --effect a rerun keeps the directory's; an explicit one (even the default) wins.
out=$("$bin" compare "${common[@]}" --noise noise.toml --out cmp 2>&1) || fail "rerun failed: $out"
grep -qF "for ±10 nats" <<<"$out" || fail "a rerun without --effect lost the directory's: $out"
out=$("$bin" compare "${common[@]}" --noise noise.toml --effect 0.005 --out cmp 2>&1) || fail "rerun failed: $out"
grep -qF "for ±0.005 nats" <<<"$out" || fail "an explicit --effect 0.005 was ignored: $out"
# Bad --effect values: exit 2 saying what is wrong.
for bad in "abc:'abc' is not a number" "0:0 is not a difference in nats" "-1:-1 is not a difference in nats"; do
  out=$("$bin" compare "${common[@]}" --effect "${bad%%:*}" --out cmp 2>&1); rc=$?
  [ "$rc" = 2 ] && grep -qF -- "${bad#*:}" <<<"$out" || fail "--effect ${bad%%:*}: status $rc: $out"
done
sed 's/^steps = 6$/steps = 9/' noise.toml > noise9.toml
out=$("$bin" compare "${common[@]}" --noise noise9.toml --out cmp 2>&1) || fail "rerun failed: $out"
grep -qF "(cmp was measured at 9 steps; this plan has 6: its spread may differ)" <<<"$out" \
  || fail "no note on other steps: $out"

# --checkpoint-steps: those checkpoints are kept beside the final one.
out=$("$bin" compare --config micro.toml --recipes fp32 --seeds 1 --policies none --no-plots \
      --save-every 2 --checkpoint-steps 2,3 --out keep 2>&1) || fail "compare --checkpoint-steps failed: $out"
got=$(ls keep/fp32-s1/checkpoints | tr '\n' ' ')
[ "$got" = "step_00000002.safetensors step_00000003.safetensors step_00000006.safetensors " ] \
  || fail "--checkpoint-steps 2,3 kept: $got"
grep -qF -- "--checkpoint-steps 2,3" keep/report.md || fail "reproduce command lacks --checkpoint-steps"
# A finished run reused by a rerun asking for other checkpoint steps says it lacks them.
out=$("$bin" compare --config micro.toml --recipes fp32 --seeds 1 --policies none --no-plots \
      --save-every 2 --checkpoint-steps 4,5 --out keep 2>&1) || fail "rerun with other steps failed: $out"
grep -qF "note: it has no checkpoint at --checkpoint-steps 4,5" <<<"$out" || fail "no note on missing checkpoints: $out"
# A comparison without 2 seeds paired with the baseline measures no noise: refused.
out=$("$bin" noise keep 2>&1); rc=$?
[ "$rc" = 2 ] && grep -qF "no recipe has 2 or more seeds paired with the baseline" <<<"$out" \
  || fail "noise of a one-recipe comparison: status $rc: $out"
# Off the refresh grid of a D = 2 recipe (refreshes at 1, 3, 5): the fidelity panel evaluates
# checkpoint 3 at step 4, holding what step 3 sampled from checkpoint 2 (docs/fidelity.md
# "References"), which --checkpoint-steps kept.
sed 's/^name = "ue5m3-b16"/name = "ue5m3-d2"/; s/^amax_interval = 50 .*/amax_interval = 2/' \
  "$src/configs/recipes/ue5m3-b16.toml" > d2.toml
out=$("$bin" fidelity --run keep/fp32-s1 --steps 3 --recipe d2.toml --batches 2 --draws 2 \
      --out fid 2>&1) || fail "fidelity on the kept checkpoints failed: $out"
echo "compare_power: OK"
