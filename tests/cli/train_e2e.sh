#!/usr/bin/env bash
# End-to-end: `fp4train train` on a slice of the real Brown corpus with a micro model, for
# four recipes (40 steps), the other shipped ones (2 steps) and a copied recipe with an
# override; checks outputs, learning, and the bad-input paths.
# Usage: train_e2e.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work"

for r in fp32 bf16 ue5m3-b16 nvfp4-te; do
  out="$work/runs/$r"
  "$bin" train --config "$work/micro.toml" --recipe "$r" --data "$work/text" --out "$out" \
    > "$work/$r.log" 2>&1 || { cat "$work/$r.log"; fail "train $r exited non-zero"; }
  [ -f "$out/summary.json" ] || fail "$r: no summary.json"
  [ "$(wc -l < "$out/metrics.jsonl")" -eq 40 ] || fail "$r: metrics.jsonl should have 40 lines"
  grep -q '"val_nll"' "$out/metrics.jsonl" || fail "$r: no val_nll in metrics"
  grep -q '^step 40/40 | loss' "$work/$r.log" || fail "$r: no progress line"
  python3 - "$out" "$r" <<'PY' || fail "$r: summary check"
import json, math, sys
out, r = sys.argv[1], sys.argv[2]
s = json.load(open(out + "/summary.json"))
m = [json.loads(l) for l in open(out + "/metrics.jsonl")]
assert s["status"] == "completed", s
assert [x["step"] for x in m] == list(range(1, 41))
for k in ("tokens", "loss", "lr", "grad_norm", "tokens_per_s"):
    assert all(k in x for x in m), k
assert abs(m[0]["loss"] - math.log(512)) < 0.5, m[0]["loss"]          # starts near ln(vocab)
assert s["final_window_loss"] < m[0]["loss"] - 1.0, (r, s["final_window_loss"])  # it learns
assert math.isfinite(s["heldout_nll"]) and math.isfinite(s["heldout_nll_quant"])
tel = [x["step"] for x in m if "telemetry" in x]
if r in ("ue5m3-b16", "nvfp4-te"):
    assert tel == [1, 10, 20, 30, 40], tel
    layer = m[0]["telemetry"]["layers.0.mixer.q_proj"]
    assert set(layer) == {"x", "w", "dy", "dyt", "xt"}, layer
    assert 0 < layer["x"]["rel_error"] < 1, layer
else:
    assert tel == [], (r, tel)
if r == "fp32":
    assert s["heldout_nll"] == s["heldout_nll_quant"]
else:
    assert s["heldout_nll"] != s["heldout_nll_quant"], "quantized inference must differ"
print(r, "first", round(m[0]["loss"], 3), "final", round(s["final_window_loss"], 3))
PY
done

# Same seed, same recipe → same bits (loss curve).
"$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --data "$work/text" --steps 5 \
  --out "$work/again1" --quiet > /dev/null || fail "rerun 1"
"$bin" train --config "$work/micro.toml" --recipe ue5m3-b16 --data "$work/text" --steps 5 \
  --out "$work/again2" --quiet > /dev/null || fail "rerun 2"
cmp <(python3 -c "import json;[print(json.loads(l)['loss']) for l in open('$work/again1/metrics.jsonl')]") \
    <(python3 -c "import json;[print(json.loads(l)['loss']) for l in open('$work/again2/metrics.jsonl')]") \
  || fail "same seed gave different losses"

expect_error "already holds a run" train --config "$work/micro.toml" --recipe fp32 --data "$work/text" --out "$work/runs/fp32"
expect_error "unknown recipe 'nope'" train --config "$work/micro.toml" --recipe nope --data "$work/text"
expect_error "does not exist" train --config "$work/micro.toml" --data "$work/missing"
mkdir -p "$work/empty"
expect_error "empty" train --config "$work/micro.toml" --data "$work/empty" --out "$work/e1"
printf '[model]\nd_modell = 3\n' > "$work/bad1.toml"
expect_error "unknown key 'model.d_modell'" train --config "$work/bad1.toml" --data "$work/text"
printf '[model\n' > "$work/bad2.toml"
expect_error "malformed TOML" train --config "$work/bad2.toml" --data "$work/text"
printf '[train]\nseq_len = 1\n' > "$work/bad3.toml"
expect_error "train.seq_len" train --config "$work/bad3.toml" --data "$work/text"
expect_error "" train --config "$work/micro.toml" --steps 0 --data "$work/text"

# A run that diverges stops with a clear message, keeps its metrics, writes no summary.
sed -e 's/^lr = .*/lr = 1e6\ngrad_clip = 0.0\nweight_decay = 0.0/' -e 's/^mlp_hidden = 64/mlp_hidden = 64\ninit_std = 1.0/' \
  "$work/micro.toml" > "$work/diverge.toml"
# (ue5m3-b16 is not in this list: its saturating held scales keep this particular run finite.)
for r in fp32 nvfp4-te; do
  expect_error "the run diverged" train --config "$work/diverge.toml" --recipe $r --data "$work/text" --out "$work/div-$r"
  [ -f "$work/div-$r/summary.json" ] && fail "$r: a diverged run must not write summary.json"
  grep -q "at step [0-9]" "$work/div-$r/error.txt" || fail "$r: error.txt must name the step"
done

# Values that would wrap around, non-files as configs, unknown commands.
printf '[train]\nsteps = 5000000000\n' > "$work/bad4.toml"
expect_error "train.steps" train --config "$work/bad4.toml" --data "$work/text"
mkdir -p "$work/dir.toml"
expect_error "not a regular file" train --config "$work/dir.toml" --data "$work/text"
expect_error "not a regular file" train --config "$work/micro.toml" --recipe "$work/dir.toml" --data "$work/text"
expect_error "unknown command 'bogus'" bogus

# A recipe that cannot run on the config is refused before anything is written.
sed -e 's/^seq_len = 32/seq_len = 7/' -e 's/^batch_size = 4/batch_size = 1/' "$work/micro.toml" > "$work/odd.toml"
expect_error "multiple of 16" train --config "$work/odd.toml" --recipe nvfp4-te --data "$work/text" --out "$work/odd"
[ -e "$work/odd" ] && fail "a refused run must not create its directory"
# The fit check runs once, before the data is prepared (validate_run; train() does not repeat
# it): nothing on stdout (no "data:" line), the one error line, exit status 2, also when the
# data path does not exist.
for d in "$work/text" "$work/missing"; do
  "$bin" train --config "$work/odd.toml" --recipe nvfp4-te --data "$d" --out "$work/odd" \
    > "$work/odd.out" 2> "$work/odd.err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "refused recipe (--data $d): exit status $rc, want 2"
  [ -s "$work/odd.out" ] && fail "refused recipe (--data $d): stdout before the check: $(cat "$work/odd.out")"
  [ "$(wc -l < "$work/odd.err")" -eq 1 ] &&
    grep -q '^fp4train: error: recipe nvfp4-te .* applies the 16-point RHT along tokens (fp4.rht_wgrad): train.batch_size × train.seq_len = 7 must be a multiple of 16$' "$work/odd.err" \
    || fail "refused recipe (--data $d): stderr: $(cat "$work/odd.err")"
done
[ -e "$work/odd" ] && fail "a refused run must not create its directory"
printf 'name = "hp"\n[linear]\nmode = "fp4"\n[high_precision]\nblocks = [7]\n' > "$work/hp.toml"
expect_error "high_precision.blocks" train --config "$work/micro.toml" --recipe "$work/hp.toml" --data "$work/text"
printf 'name = "hp"\n[linear]\nmode = "fp4"\n[high_precision]\nfinal_blocks = 5\n' > "$work/hp2.toml"
expect_error "high_precision.final_blocks" train --config "$work/micro.toml" --recipe "$work/hp2.toml" --data "$work/text"

# The recipes added for docs/numerics.md's table run (2 steps, finite loss, resolved recipe kept).
for r in ue5m3-b32 ue5m3-te nvfp4-all mxfp4; do
  "$bin" train --config "$work/micro.toml" --recipe $r --data "$work/text" --steps 2 \
    --out "$work/new-$r" > "$work/new-$r.log" 2>&1 || { cat "$work/new-$r.log"; fail "train $r"; }
  python3 -c "import json,math,sys; m=[json.loads(l) for l in open(sys.argv[1])]; assert len(m)==2 and all(math.isfinite(x['loss']) for x in m), m" \
    "$work/new-$r/metrics.jsonl" || fail "$r: losses"
  grep -q "^name = \"$r\"" "$work/new-$r/recipe.toml" || fail "$r: recipe.toml"
done

# The paper's override (final four down_proj) does not fit the 2-layer (4-block) micro model: refused,
# naming the key. Copy the recipe, change the knob, run it: the start line lists the override.
expect_error "override[0].final_blocks" train --config "$work/micro.toml" --recipe ue5m3-b16-t2048 --data "$work/text" --out "$work/t2048"
[ -e "$work/t2048" ] && fail "a refused run must not create its directory"
sed 's/^final_blocks = 4 /final_blocks = 1 /' "$src/configs/recipes/ue5m3-b16-t2048.toml" > "$work/mine.toml"
grep -q "^final_blocks = 1 " "$work/mine.toml" || fail "sed did not change the knob"
"$bin" train --config "$work/micro.toml" --recipe "$work/mine.toml" --data "$work/text" --steps 2 \
  --out "$work/mine" > "$work/mine.log" 2>&1 || { cat "$work/mine.log"; fail "train mine.toml"; }
grep -q 'override\[0\] linears = \["down_proj"\], final_blocks = 1, gemm = "wgrad", role = "dy": scale_target = 2048.0 -> 1 linear: layers.3.mixer.down_proj$' "$work/mine.log" \
  || { cat "$work/mine.log"; fail "start line must list the override and the linear it hit"; }
grep -q '^\[\[override\]\]' "$work/mine/recipe.toml" || fail "recipe.toml must keep the override"
printf 'name = "o"\n[linear]\nmode = "fp4"\n[[override]]\nlinears = ["mlp.gate"]\nscale_target = 2.0\n' > "$work/ov.toml"
expect_error "key 'override[0].linears'" train --config "$work/micro.toml" --recipe "$work/ov.toml" --data "$work/text"
echo "train_e2e: all checks passed"
