#!/usr/bin/env bash
# One process per run directory: while `train` runs into DIR, a second `train --resume DIR`
# is refused (exit 2, naming the directory) before it changes any file; the first run is not
# disturbed (no error.txt, its metrics complete), and after it ends the lock is free again.
# Usage: run_lock.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=30 steps=400 interval=100 windows=4
args=(--config "$work/micro.toml" --recipe fp32 --data "$work/text")

# A run with a checkpoint, killed: the directory a resume continues.
"$bin" train "${args[@]}" --out "$work/run" --save-every 5 > "$work/run1.log" 2>&1 &
pid=$!
for _ in $(seq 1 12000); do
  ls "$work/run/checkpoints" 2>/dev/null | grep -q '^step_.*\.safetensors$' && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
kill -9 "$pid" 2>/dev/null || fail "the run ended before it could be killed (make it longer)"
wait "$pid" 2>/dev/null; pid=

# The first resume trains; a second one while it runs is refused.
"$bin" train --resume "$work/run" --save-every 5 > "$work/res1.log" 2>&1 &
pid=$!
for _ in $(seq 1 12000); do  # until the first resume has logged a step of its own
  grep -q '^step ' "$work/res1.log" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
kill -0 "$pid" 2>/dev/null || fail "the first resume ended too early: $(cat "$work/res1.log")"
out=$("$bin" train --resume "$work/run" --save-every 5 2>&1); rc=$?
[ $rc = 2 ] || fail "a second resume of a run in use: exit $rc, want 2: $out"
grep -q "is in use by another fp4train process" <<<"$out" || fail "refusal not explained: $out"
grep -q "$work/run" <<<"$out" || fail "refusal does not name the directory: $out"
wait "$pid"; rc=$?; pid=
[ $rc = 0 ] || fail "the first resume failed (exit $rc): $(tail -5 "$work/res1.log")"
[ -f "$work/run/summary.json" ] || fail "the first resume did not complete"
[ -e "$work/run/error.txt" ] && fail "the refused resume left error.txt: $(cat "$work/run/error.txt")"
python3 - "$work/run/metrics.jsonl" <<'PY' || fail "metrics.jsonl is not steps 1..400"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if l.strip()]
assert steps == list(range(1, 401)), (len(steps), steps[:3], steps[-3:])
PY
# The lock was released with the process: resuming the completed run is the usual no-op.
out=$("$bin" train --resume "$work/run" 2>&1) || fail "resume after the lock was released: $out"
grep -q "already completed" <<<"$out" || fail "unexpected: $out"
echo "PASS"
