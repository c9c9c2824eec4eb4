#!/usr/bin/env bash
# Finding things (docs/cli.md "The `fp4train` program"): `fp4train --help` gives one line per
# command; `fp4train configs` and `fp4train recipes` list every shipped file with what it is; an
# unknown recipe's error lists the available ones sorted. Expected values are read from
# configs/.
# Usage: list_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
source "$(dirname "$0")/lib/micro.bash"
cd "$src" || fail "no source dir"

help=$("$bin" --help) || fail "--help exited non-zero"
cmds=$(echo "$help" | sed -n '/^Subcommands:/,$p' | sed -n 's/^  \([a-z]*\) .*/\1/p')
for c in train compare report compact eval sample export profile info quant gemm configs recipes; do
  grep -qx "$c" <<<"$cmds" || fail "--help does not list '$c'"
  n=$(echo "$help" | sed -n '/^Subcommands:/,$p' | grep -c "^  $c ")
  [ "$n" = 1 ] || fail "--help lists '$c' on $n lines"
done
# One line each: no continuation lines below the list (a long description would wrap).
extra=$(echo "$help" | sed -n '/^Subcommands:/,$p' | tail -n +2 | grep -vc '^  [a-z]')
[ "$extra" = 0 ] || fail "--help: $extra continuation lines under Subcommands"
[ "$(echo "$help" | wc -l)" -le 30 ] || fail "--help is longer than one screen"
# The details stay under CMD --help.
th=$("$bin" train --help) || fail "train --help exited non-zero"
grep -q -- "--resume" <<<"$th" || fail "train --help lost its details"

out=$("$bin" configs) || fail "configs exited non-zero"
for f in configs/*.toml; do
  n=$(basename "$f" .toml)
  grep -q "^  $n " <<<"$out" || fail "configs does not list $n"
done
echo "$out" | grep "^  nemotron-h-tiny " | grep -q "hybrid" || fail "configs: nemotron-h-tiny not shown as a hybrid"
echo "$out" | grep "^  tiny " | grep -q "Llama-style" || fail "configs: tiny not shown as Llama-style"

out=$("$bin" recipes) || fail "recipes exited non-zero"
listed=$(echo "$out" | sed -n 's/^  \([^ ]*\) .*/\1/p')
want=$(ls configs/recipes/*.toml | xargs -n1 basename | sed 's/\.toml$//' | LC_ALL=C sort)
[ "$listed" = "$want" ] || fail "recipes lists $(echo $listed), expected $(echo $want)"
for n in ue5m3-b16 nvfp4-te fp32; do
  d=$(sed -n 's/^description = "\(.*\)"$/\1/p' "configs/recipes/$n.toml")
  echo "$out" | grep "^  $n " | grep -qF "$d" || fail "recipes: $n lacks its description '$d'"
done

err=$("$bin" train --config configs/tiny.toml --recipe nope 2>&1 >/dev/null)
names=$(echo "$err" | sed -n 's/.*available: \([^(]*\) (.*/\1/p')
[ "$names" = "$(echo $want)" ] || fail "unknown recipe: available list '$names' is not the sorted names"
grep -q "fp4train recipes" <<<"$err" || fail "unknown recipe: no pointer to 'fp4train recipes'"
err=$("$bin" train --config nope.toml 2>&1 >/dev/null)
grep -q "nope.toml: file not found.*'fp4train configs'" <<<"$err" || fail "a missing config does not point to 'fp4train configs': $err"
echo "list_cli: --help one line per command; configs, recipes listed; recipe errors sorted"
