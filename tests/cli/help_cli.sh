#!/usr/bin/env bash
# `fp4train --help` (docs/cli.md "The `fp4train` program"): every command the program knows is
# listed once, on one line, with a whole sentence: a description that ends without a full stop
# was cut off (the first line of a multi-line description, or a summary clipped to a width).
# The commands are those of the unknown-command error, which lists every registered one.
# Usage: help_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1
source "$(dirname "$0")/lib/micro.bash"

help=$("$bin" --help) || fail "--help exited non-zero"
err=$("$bin" no-such-command 2>&1 > /dev/null)
known=$(echo "$err" | sed -n 's/.*(commands: \(.*\); see --help).*/\1/p' | tr -d ' ' | tr ',' '\n')
[ -n "$known" ] || fail "the unknown-command error lists no commands"

list=$(echo "$help" | sed -n '/^Subcommands:/,$p' | tail -n +2 | grep -v '^$')
for c in $known; do
  line=$(echo "$list" | grep "^  $c ") || fail "--help does not list '$c'"
  [ "$(echo "$line" | wc -l)" = 1 ] || fail "--help lists '$c' on several lines"
  desc=$(echo "$line" | sed "s/^  $c  *//")
  [ -n "$desc" ] || fail "--help: '$c' has no description"
  case "$desc" in
    *.) ;;
    *) fail "--help: the description of '$c' is cut off (no full stop at its end): '$desc'" ;;
  esac
done
# Nothing else under Subcommands: a wrapped description would leave a continuation line.
n_known=$(echo "$known" | wc -l)
[ "$(echo "$list" | wc -l)" = "$n_known" ] || fail "--help: lines under Subcommands other than the $n_known commands: $list"
echo "help_cli: $n_known commands, one whole sentence each"
