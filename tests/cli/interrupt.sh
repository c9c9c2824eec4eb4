#!/usr/bin/env bash
# Ctrl-C during `fp4train train`: SIGINT (and SIGTERM) finish the current step, write its
# checkpoint, print the exact resume command and end the process as killed by the signal
# (status 130 / 143); metrics.jsonl holds exactly the steps done; running the printed command
# completes the run with the same bits as an uninterrupted one. A second signal stops at once.
# Usage: interrupt.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
# Background jobs of a non-interactive shell ignore SIGINT (and fp4train then leaves it so);
# with job control they get it, as a foreground program gets Ctrl-C.
set -m

# 60 steps: the signal is sent once 3 metrics lines exist (step 3 or 6), and the run must still
# be training when it arrives, however loaded the machine (20 steps raced on a 2-core CI run).
steps=60
micro_setup "$work" docs=30 steps=$steps interval=10 windows=4 telemetry_interval=10
args=(--config "$work/micro.toml" --recipe ue5m3-b16 --data "$work/text")

"$bin" train "${args[@]}" --out "$work/ref" --quiet > "$work/ref.log" 2>&1 \
  || { cat "$work/ref.log"; fail "reference run"; }

# start_and_signal NAME SIGNAL [train options]: start a run into $work/NAME, send SIGNAL once it
# has logged 3 steps, wait; sets $rc.
start_and_signal() {
  local name=$1 sig=$2; shift 2
  "$bin" train "${args[@]}" --out "$work/$name" "$@" > "$work/$name.log" 2> "$work/$name.err" &
  pid=$!
  for _ in $(seq 1 12000); do  # up to ~2 minutes on a loaded machine
    [ "$(wc -l 2>/dev/null < "$work/$name/metrics.jsonl" || echo 0)" -ge 3 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  kill -"$sig" "$pid" 2>/dev/null || fail "$name ended before it could be signalled (make it longer)"
  wait "$pid"; rc=$?; pid=
}

# check_stopped NAME SIGNAL STATUS: the message, the checkpoint, metrics.jsonl; then resume with
# the printed command and compare with the reference bit for bit.
check_stopped() {
  local name=$1 sig=$2 want=$3 d="$work/$1"
  [ "$rc" = "$want" ] || { cat "$d.err"; fail "$name: exit status $rc after $sig, expected $want"; }
  [ -f "$d/summary.json" ] && fail "$name: a stopped run must not have summary.json"
  local line step ck cmd
  line=$(grep "^stopped by $sig after step [0-9]* of $steps; checkpoint " "$d.err") \
    || { cat "$d.err"; fail "$name: no 'stopped by $sig after step N of $steps; checkpoint ...' message"; }
  step=$(echo "$line" | sed 's/^stopped by [A-Z]* after step \([0-9]*\) .*/\1/')
  ck=$(printf '%s/checkpoints/step_%08d.safetensors' "$d" "$step")
  grep -qF "checkpoint $ck" <<<"$line" || fail "$name: message names another checkpoint: $line"
  [ -f "$ck" ] || fail "$name: checkpoint $ck missing: $(ls "$d/checkpoints")"
  cmd=$(grep -A1 "^metrics.jsonl holds the steps so far" "$d.err" | tail -1 | sed 's/^  //')
  [ "$cmd" = "$bin train --resume $d --data $work/text" ] \
    || fail "$name: resume command is '$cmd', expected '$bin train --resume $d --data $work/text'"
  python3 - "$d/metrics.jsonl" "$step" "$4" <<'PY' || fail "$name: metrics.jsonl inconsistent with step $step"
import json, sys
path, step, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps = [json.loads(l)["step"] for l in open(path)]  # every line complete JSON
# log every `every` steps, and always at telemetry and evaluation steps (1, 10, 20, ...)
want = [s for s in range(1, step + 1) if s % every == 0 or s == 1 or s % 10 == 0]
assert steps == want, (steps, want)
PY
  echo "$name: $(echo "$line" | cut -d';' -f1)"
  eval "$cmd" > "$d.resume.log" 2>&1 || { cat "$d.resume.log"; fail "$name: resume failed"; }
  grep -q "^resumed at step $step of $steps" "$d.resume.log" || fail "$name: did not resume at step $step"
  python3 - "$work/ref" "$d" "$4" "$steps" <<'PY' || fail "$name: resumed run differs from the uninterrupted one"
import json, sys
ref, run, every, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
a = {j["step"]: j for j in map(json.loads, open(ref + "/metrics.jsonl"))}
b = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert [x["step"] for x in b] == [s for s in range(1, steps + 1) if s % every == 0 or s == 1 or s % 10 == 0 or s == steps]
for y in b:
    x = a[y["step"]]
    for k in ("loss", "lr", "grad_norm", "val_nll", "val_nll_quant", "telemetry"):
        assert x.get(k) == y.get(k), (y["step"], k, x.get(k), y.get(k))
sa, sb = json.load(open(ref + "/summary.json")), json.load(open(run + "/summary.json"))
for k in ("first_loss", "final_window_loss", "heldout_nll", "heldout_nll_quant"):
    assert sa[k] == sb[k], (k, sa[k], sb[k])
print("  resumed from", sb["resumed_from_step"], "to the same final-window loss", sb["final_window_loss"])
PY
}

# SIGINT, logging every step, no periodic checkpoints: the stop writes the only one.
start_and_signal int INT
check_stopped int SIGINT 130 1

# SIGTERM, with periodic checkpoints and a metrics line every 3 steps.
start_and_signal term TERM --save-every 7 --log-every 3
check_stopped term SIGTERM 143 3

# A second signal stops at once: no stop message, no summary.
"$bin" train "${args[@]}" --out "$work/hard" > "$work/hard.log" 2> "$work/hard.err" &
pid=$!
for _ in $(seq 1 12000); do
  [ "$(wc -l 2>/dev/null < "$work/hard/metrics.jsonl" || echo 0)" -ge 3 ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
kill -INT "$pid"; kill -TERM "$pid"  # two different signals: neither can merge into the other
wait "$pid"; rc=$?; pid=
# Killed by whichever of the two its handler saw second (both may be pending at once).
[ "$rc" = 130 ] || [ "$rc" = 143 ] \
  || { cat "$work/hard.err"; fail "hard: status $rc after SIGINT then SIGTERM, expected 130 or 143"; }
grep -q "^stopped by" "$work/hard.err" && fail "hard: the second signal must stop at once, not after a checkpoint"
[ -f "$work/hard/summary.json" ] && fail "hard: summary.json after a hard stop"
echo "second signal: exited at once with status $rc"

# A run that is not stopped is not affected: exit 0, summary written (the reference above).
[ -f "$work/ref/summary.json" ] || fail "reference has no summary.json"
echo "interrupt: all checks passed"
