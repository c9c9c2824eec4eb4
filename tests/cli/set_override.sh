#!/usr/bin/env bash
# `--set KEY=VALUE` through the CLI: a micro run with config and recipe keys overridden has
# them in its resolved config.toml and recipe.toml, its recipe (and config) labelled in the run
# directory name, the summary and the progress lines; the run resumes; bad settings exit 2
# naming the --set; profile and eval take them too.
# Usage: set_override.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=20 steps=6 warmup_steps=2 interval=6 windows=2
cd "$work"

# expect_exit2 <substring> <args...>: exit status 2 and the substring on stderr, one line.
expect_exit2() {
  local want=$1; shift
  local err rc
  err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" = 2 ] || fail "exit status $rc (expected 2) for: $* ($err)"
  grep -qF -- "$want" <<<"$err" || fail "message for '$*' lacks '$want': $err"
  [ "$(echo "$err" | wc -l)" = 1 ] || fail "more than one line for '$*': $err"
}

out=$("$bin" train --config micro.toml --recipe ue5m3-b16 --set train.lr=2e-3 \
      --set fp4.block=32 --set 'recipe.rounding.dy="rne"' --set fp4.weight_2d=false 2>&1) \
  || fail "train with --set failed: $out"
name='ue5m3-b16+fp4.block=32+rounding.dy=rne+fp4.weight_2d=false'
dir="runs/micro+train.lr=2e-3-$name-s1"
[ -d "$dir" ] || fail "run directory $dir not made: $(ls runs)"
grep -qF "recipe $name (fp4,fp4,fp4,fp4 per block; FP4 GEMM decoded-bf16)" <<<"$out" || fail "progress lines lack the labelled recipe: $out"
grep -qF "overrides: --set train.lr=2e-3 --set fp4.block=32" <<<"$out" || fail "no overrides line: $out"
grep -qx "lr = 0.002" "$dir/config.toml" || fail "config.toml lacks lr = 0.002: $(cat "$dir/config.toml")"
grep -qx "block = 32" "$dir/recipe.toml" || fail "recipe.toml lacks block = 32"
grep -qx 'dy = "rne"' "$dir/recipe.toml" || fail "recipe.toml lacks dy = \"rne\""
grep -qx 'weight_2d = false' "$dir/recipe.toml" || fail "recipe.toml lacks weight_2d = false"
grep -qxF "name = \"$name\"" "$dir/recipe.toml" || fail "recipe.toml name: $(grep ^name "$dir/recipe.toml")"
grep -qx "amax_interval = 50" "$dir/recipe.toml" || fail "recipe.toml lost the file's amax_interval"
python3 - "$dir/summary.json" "$name" <<'PY' || fail "summary.json names"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["recipe"] == sys.argv[2], s["recipe"]
assert s["config"] == "micro+train.lr=2e-3", s["config"]
assert s["fp4_gemm"] == "decoded-bf16", s.get("fp4_gemm")  # gemm = "auto", as resolved
PY
# The resolved files are a complete run: `--resume` of the finished run reads them back.
resume_out=$("$bin" train --resume "$dir" 2>&1)  # captured: grep -q in a pipe races the writer
grep -q "already completed" <<<"$resume_out" || fail "resume of the --set run"

# eval of its checkpoint names the labelled recipe; --set changes it again, labelled again.
"$bin" eval --checkpoint "$dir" --policy current --json e.json > /dev/null 2>&1 || fail "eval"
python3 -c "import json,sys; r=json.load(open('e.json'))['recipe']; assert r == sys.argv[1], r" "$name" \
  || fail "eval.json recipe"
"$bin" eval --checkpoint "$dir" --policy current --set fp4.block=16 --json e2.json > /dev/null 2>&1 || fail "eval --set"
python3 -c "import json,sys; r=json.load(open('e2.json'))['recipe']; assert r == sys.argv[1] + '+fp4.block=16', r" "$name" \
  || fail "eval --set recipe name"

# Bad settings: exit 2, one line naming the --set argument, before anything is made.
expect_exit2 "--set train.lr=fast: key 'train.lr': expected a number" train --config micro.toml --set train.lr=fast
expect_exit2 "--set fp4.block=0: key 'fp4.block': expected a value in [1, 256], got 0" train --config micro.toml --set fp4.block=0
expect_exit2 "(data.path in micro.toml with --set data.path=nowhere)" train --config micro.toml --set data.path=nowhere
expect_exit2 "--set fp4.blok=3: unknown key 'fp4.blok'" train --config micro.toml --set fp4.blok=3
expect_exit2 "--set trian.lr=1: unknown table 'trian'" train --config micro.toml --set trian.lr=1
expect_exit2 "--set fp4.block=16: key 'fp4.block' is already set by --set fp4.block=32" \
  train --config micro.toml --set fp4.block=32 --set fp4.block=16
expect_exit2 "--set train.steps=3 and --steps both set train.steps" train --config micro.toml --steps 4 --set train.steps=3
expect_exit2 "--set cannot be combined" train --resume "$dir" --set train.lr=1
expect_exit2 "--set train.lr=1: a checkpoint's run config is fixed" eval --checkpoint "$dir" --set train.lr=1
expect_exit2 "--set fp4.block=0" profile --config micro.toml --set fp4.block=0
[ "$(ls runs | wc -l)" = 1 ] || fail "a refused command made a run directory: $(ls runs)"

# Keys that change no result (data.cache, log.progress_seconds) rename neither the config nor
# the run directory; the value is still used (the cache goes where it says).
out=$("$bin" train --config micro.toml --recipe fp32 --steps 2 --set data.cache="$work/cache2" \
      --set log.progress_seconds=5 --set train.seed=3 2>&1) || fail "train with data.cache: $out"
[ -d "runs/micro+train.seed=3-fp32-s3" ] || fail "a data.cache / progress_seconds setting renamed the run: $(ls runs)"
[ -d "$work/cache2" ] || fail "--set data.cache was not used"

# profile labels the recipe and config it timed, as train labels them (the config's stem).
"$bin" profile --config micro.toml --recipe mxfp4 --steps 1 --warmup 0 --peak-gflops 100 \
  --set fp4.block=16 --set train.batch_size=2 --json p.json > p.log 2>&1 || { cat p.log; fail "profile --set"; }
grep -qF "config micro+train.batch_size=2, recipe mxfp4+fp4.block=16:" p.log || fail "profile line: $(grep ^config p.log)"
grep -qF "tokens/step (batch 2 x seq 32)" p.log || fail "profile did not apply train.batch_size"
echo "set_override: all checks passed"
