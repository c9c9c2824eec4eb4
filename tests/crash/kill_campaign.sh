#!/usr/bin/env bash
# Crash-consistency campaign (docs/robustness.md "Crash consistency"): a short training run is
# SIGKILLed many times at chosen and random moments, resumed with `train --resume`, and each
# resumed run must (1) complete, (2) log the same metrics (every field but the timings) and
# end with the same checkpoint tensors, bit for bit, as an uninterrupted reference run, and
# (3) leave nothing a later resume would misread: no *.tmp, no *.corrupt, no error.txt, every
# metrics line whole, the same checkpoint files as the reference, and a second resume is a
# no-op ("already completed", nothing changed).
#
# Moment classes, taken in turn (kill i has class i mod 7), their parameters drawn from the
# seed (the hooks: include/fp4/base/safetensors.h "Test hooks of the durable writers"):
#   checkpoint  FP4_TEST_KILL_AT=checkpoint:N:K  SIGKILL after K bytes of the N-th checkpoint
#               file; K = `end`: all written, before fsync + rename; K = `after`: renamed
#               into place, before the pruning of older checkpoints
#   metrics     FP4_TEST_KILL_AT=metrics:N:K     after K bytes of the N-th metrics.jsonl line
#   random      kill -9 a random time after the first checkpoint (a fraction of the
#               reference's time from there to its end; under load it may come too late:
#               counted as random-after-end, as is a kill while a completed run exits, and the completed
#               run is still checked)
#   resume      a checkpoint kill, then the resume itself killed (in its rewrite of
#               metrics.jsonl, FP4_TEST_KILL_AT=file:1:K, or in its first checkpoint or one
#               of its first lines), then resumed again
#   summary     FP4_TEST_KILL_AT=file:4:K inside the final summary.json (after the last
#               checkpoint; files 1-3 are config.toml, recipe.toml, tokenizer.model)
#   enospc      FP4_TEST_FAIL_WRITE_AFTER=B: writes fail with ENOSPC after B bytes (a full
#               disk): the run must exit 1 naming the file and "No space left on device",
#               remove its temporaries, keep whole metrics lines, and its previous checkpoint
#               must resume bit-identically
#   prune       FP4_TEST_KILL_AT=checkpoint:N:after  a checkpoint renamed into place, the
#               older ones not yet pruned (N = the last: the resume has no step to train)
# Kills are drawn after the first checkpoint is complete (a run killed before it has nothing
# to resume from, and `--resume` refuses it: docs/checkpoints.md "Checkpoints and resume").
# Finally, when run as root with tmpfs mounts allowed, a real full disk: the run directory on a
# small tmpfs (skipped with a message otherwise).
#
# Usage: kill_campaign.sh <fp4train binary> <source dir> [--kills N] [--seed S] [--keep DIR]
#   --kills N  number of kills (default 50); --seed S  seed of the draws (default: from the
#   clock; printed); --keep DIR  keep the work directory there (default: a temporary, removed).
# Exit 0: all passed; 1: a check failed (the failing kill's parameters are printed).
set -uo pipefail
bin=$1; src=$2; shift 2
kills=50; seed=$(( $(date +%s) % 1000000 )); keep=
while [ $# -gt 0 ]; do
  case $1 in
    --kills) kills=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "kill_campaign.sh: unknown option $1"; exit 2 ;;
  esac
done
source "$src/tests/cli/lib/micro.bash"
if [ -n "$keep" ]; then work=$keep; rm -rf "$work"; mkdir -p "$work"; else work=$(mktemp -d); fi
pid=; mnt=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  [ -n "$mnt" ] && umount "$mnt" 2>/dev/null
  [ -z "$keep" ] && rm -rf "$work"
}
trap cleanup EXIT
RANDOM=$seed
echo "kill_campaign: seed $seed, $kills kills, work $work"
t_begin=$(date +%s)

STEPS=12 SAVE=2 KEEP=2
micro_setup "$work" docs=30 steps=$STEPS interval=5 windows=4 telemetry_interval=4
args=(--config "$work/micro.toml" --recipe ue5m3-b16 --data "$work/text" --peak-gflops 100
      --save-every $SAVE --keep-checkpoints $KEEP --quiet)
unset FP4_TEST_KILL_AT FP4_TEST_FAIL_WRITE_AFTER

# The uninterrupted reference (a first run fills the token cache; the second is timed).
"$bin" train "${args[@]}" --out "$work/warm" > "$work/warm.log" 2>&1 || { cat "$work/warm.log"; fail "warm-up run"; }
# Timed: its wall time after the first checkpoint is where random kills fall.
t0=$(date +%s%N)
"$bin" train "${args[@]}" --out "$work/ref" > "$work/ref.log" 2>&1 &
pid=$!
while [ ! -f "$work/ref/checkpoints/step_$(printf %08d $SAVE).safetensors" ] && kill -0 "$pid" 2>/dev/null; do
  sleep 0.01
done
t1=$(date +%s%N)
wait "$pid" || { cat "$work/ref.log"; fail "reference run"; }
pid=
t2=$(date +%s%N)
ref_ms=$(( (t2 - t0) / 1000000 )); after_ms=$(( (t2 - t1) / 1000000 ))
ref_ck="$work/ref/checkpoints/$(printf 'step_%08d.safetensors' $STEPS)"
ck_size=$(stat -c %s "$ref_ck")
n_ck=$(( STEPS / SAVE ))
mapfile -t line_len < <(awk '{ print length($0) + 1 }' "$work/ref/metrics.jsonl")
n_lines=${#line_len[@]}
summary_size=$(stat -c %s "$work/ref/summary.json")
# Bytes a run writes before its first checkpoint (config.toml, recipe.toml, tokenizer.model,
# the first SAVE metrics lines), and up to the end of its last checkpoint.
pre_bytes=$(( $(cat "$work/ref/config.toml" "$work/ref/recipe.toml" "$work/ref/tokenizer.model" | wc -c)
              + $(head -$SAVE "$work/ref/metrics.jsonl" | wc -c) ))
echo "reference: $STEPS steps in $ref_ms ms ($after_ms ms after the first checkpoint), $n_ck checkpoints of $ck_size bytes, $n_lines metrics lines"

# The draws set variables instead of printing: bash reseeds $RANDOM in a subshell ($(...)),
# which would make them irreproducible.
rand() { R=$(( (RANDOM * 32768 + RANDOM) % $1 )); }  # R = 0 .. $1-1
# B = a byte position in a write of about $1 bytes: 0, `end` (all written, not committed),
# `after` (committed: renamed into place, not yet pruned; with $2 = noafter: `end`), or inside.
rand_bytes() {
  case $(( RANDOM % 8 )) in
    0) B=0 ;;
    1) B=end ;;
    2) B=after; [ "${2:-}" = noafter ] && B=end ;;
    *) rand $(( $1 - 1 )); B=$(( 1 + R )) ;;
  esac
}

# run_env LOG ENV...: train into $d with extra environment; sets $rc.
run_env() {
  local log=$1; shift
  { env "$@" "$bin" train "${args[@]}" --out "$d" > "$log" 2>&1; } 2>/dev/null; rc=$?
}
# resume_env LOG ENV...: resume $d; sets $rc.
resume_env() {
  local log=$1; shift
  { env "$@" "$bin" train --resume "$d" --data "$work/text" --peak-gflops 100 > "$log" 2>&1; } 2>/dev/null; rc=$?
}
newest_step() {
  ls "$d/checkpoints" 2>/dev/null | sed -n 's/^step_\([0-9]*\)\.safetensors$/\1/p' | sort | tail -1 | sed 's/^0*//'
}
killed() { [ "$rc" = 137 ] || { cat "$1"; fail "$what: expected death by SIGKILL (137), got $rc"; }; }

# verify: resume $d to completion and run every check against the reference.
verify() {
  local before after
  before=$(newest_step)
  [ -n "$before" ] || fail "$what: no complete checkpoint after the kill: $(ls "$d/checkpoints" 2>&1)"
  if [ "$class" = random-after-end ]; then  # the run completed before the kill: no resume
    python3 "$src/tests/crash/check_run.py" "$work/ref" "$d" || fail "$what: the run differs from the reference"
    rm -rf "$d" "$d".*log*
    return
  fi
  resume_env "$d.resume.log"
  [ "$rc" = 0 ] || { cat "$d.resume.log"; fail "$what: the resume exited $rc"; }
  grep -qE "skipping checkpoint|unusable checkpoint" "$d.resume.log" \
    && { cat "$d.resume.log"; fail "$what: a kill left a visible damaged checkpoint"; }
  # It resumed from the newest complete checkpoint (or, after a kill in summary.json, found
  # the final one).
  grep -qE "^resumed at step $before of $STEPS" "$d.resume.log" \
    || { cat "$d.resume.log"; fail "$what: did not resume from the newest checkpoint (step $before)"; }
  python3 "$src/tests/crash/check_run.py" "$work/ref" "$d" || fail "$what: resumed run differs from the reference"
  before=$(cd "$d" && find . -type f -exec md5sum {} + | sort)
  resume_env "$d.again.log"
  [ "$rc" = 0 ] && grep -q "already completed" "$d.again.log" \
    || { cat "$d.again.log"; fail "$what: a second resume of the completed run must be a no-op"; }
  after=$(cd "$d" && find . -type f -exec md5sum {} + | sort)
  [ "$before" = "$after" ] || fail "$what: the second resume changed files"
  rm -rf "$d" "$d".*log*
}

# The hooks refuse a malformed value, naming the variable.
for v in FP4_TEST_KILL_AT=checkpoint:1 FP4_TEST_KILL_AT=disk:1:0 FP4_TEST_FAIL_WRITE_AFTER=-1; do
  d="$work/bad"
  run_env "$work/bad.log" "$v"
  [ "$rc" != 0 ] && grep -q "^fp4train: error: ${v%%=*}=" "$work/bad.log" \
    || { cat "$work/bad.log"; fail "$v: expected an error naming the variable"; }
  rm -rf "$d"
done

declare -A count
classes=(checkpoint metrics random resume summary enospc prune)
for (( i = 0; i < kills; i++ )); do
  class=${classes[$(( i % ${#classes[@]} ))]}
  d="$work/k$i"
  case $class in
    checkpoint)
      rand $(( n_ck - 1 )); n=$(( 2 + R )); rand_bytes "$ck_size"; k=$B
      what="kill $i (checkpoint:$n:$k)"
      run_env "$d.log" FP4_TEST_KILL_AT=checkpoint:$n:$k; killed "$d.log" ;;
    metrics)
      # A line written after the first checkpoint (lines 1..SAVE come before it).
      rand $(( n_lines - SAVE )); n=$(( SAVE + 1 + R )); rand_bytes "${line_len[$((n - 1))]}"; k=$B
      what="kill $i (metrics:$n:$k)"
      run_env "$d.log" FP4_TEST_KILL_AT=metrics:$n:$k; killed "$d.log" ;;
    random)
      # Once the first checkpoint is there, a fraction 0 .. 0.95 of the reference's time
      # from there to its end (the machine's load varies: a kill may come too late).
      rand 951; ms=$(( after_ms * R / 1000 ))
      what="kill $i (random, ${ms} ms)"
      env "$bin" train "${args[@]}" --out "$d" > "$d.log" 2>&1 &
      pid=$!
      while [ -z "$(newest_step)" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
      sleep "$(printf '%d.%03d' $(( ms / 1000 )) $(( ms % 1000 )))"
      kill -9 "$pid" 2>/dev/null
      { wait "$pid"; } 2>/dev/null; rc=$?; pid=
      if [ "$rc" = 0 ]; then class=random-after-end; else killed "$d.log"; fi  # finished first: still verified
      # Killed after its summary was written (while the process was exiting): it completed.
      grep -qs '"status": *"completed"' "$d/summary.json" && class=random-after-end ;;
    resume)
      rand $(( n_ck - 2 )); n=$(( 2 + R )); rand_bytes "$ck_size" noafter; k=$B
      run_env "$d.log" FP4_TEST_KILL_AT=checkpoint:$n:$k; what="kill $i (checkpoint:$n:$k)"; killed "$d.log"
      case $(( RANDOM % 3 )) in
        0) rand_bytes "$(stat -c %s "$d/metrics.jsonl")"; second=file:1:$B ;;  # its rewrite
        1) rand_bytes "$ck_size"; second=checkpoint:1:$B ;;
        2) m=$(( 1 + RANDOM % 2 )); rand_bytes 150; second=metrics:$m:$B ;;
      esac
      # The resume's own checkpoint/line kill must come before the run ends: after step n*SAVE
      # (or n*SAVE - 1) the resumed run has at least SAVE more steps to go.
      what="kill $i (checkpoint:$n:$k, then the resume at $second)"
      resume_env "$d.log2" FP4_TEST_KILL_AT=$second; killed "$d.log2" ;;
    summary)
      rand_bytes "$summary_size" noafter; n=$B
      what="kill $i (summary.json, file:4:$n)"
      # Files: config.toml, recipe.toml, tokenizer.model, then summary.json.
      run_env "$d.log" FP4_TEST_KILL_AT=file:4:$n; killed "$d.log"
      [ -f "$d/summary.json" ] && fail "$what: summary.json complete after a kill inside it" ;;
    prune)
      # Between a checkpoint's rename and the pruning after it (the final one: the resume has
      # no step left to train).
      rand $(( n_ck - KEEP )); n=$(( KEEP + 1 + R ))
      what="kill $i (checkpoint:$n:after)"
      run_env "$d.log" FP4_TEST_KILL_AT=checkpoint:$n:after; killed "$d.log"
      m=$(( n < KEEP + 1 ? n : KEEP + 1 ))
      [ "$(ls "$d/checkpoints" | grep -c '^step_.*\.safetensors$')" -eq $m ] \
        || fail "$what: expected $m checkpoints before the pruning: $(ls "$d/checkpoints" | tr '\n' ' ')" ;;
    enospc)
      # After the first checkpoint is complete, before the last one is.
      rand $(( (n_ck - 1) * ck_size )); b=$(( pre_bytes + ck_size + R ))
      what="kill $i (ENOSPC after $b bytes)"
      run_env "$d.log" FP4_TEST_FAIL_WRITE_AFTER=$b
      [ "$rc" = 1 ] || { cat "$d.log"; fail "$what: expected exit 1, got $rc"; }
      grep -qE "^fp4train: error: write failed: $d/[^ ]*: No space left on device" "$d.log" \
        || { cat "$d.log"; fail "$what: no clear message naming the file and the error"; }
      [ -f "$d/summary.json" ] && fail "$what: summary.json after a failed run"
      ls "$d/checkpoints" | grep -q '\.tmp$' && fail "$what: a failed checkpoint write left its temporary"
      # metrics.jsonl holds whole lines only (a cut line is removed again).
      [ -z "$(tail -c 1 "$d/metrics.jsonl")" ] || fail "$what: metrics.jsonl ends inside a line" ;;
  esac
  verify
  count[$class]=$(( ${count[$class]:-0} + 1 ))
  echo "ok: $what"
done

# A real full disk: the run directory on a tmpfs too small for it (root only).
tmpfs=skipped
mnt="$work/tmpfs"; mkdir -p "$mnt"
size_kb=$(( 5 * ck_size / 2 / 1024 ))  # room for 2 checkpoints, not for a third one's temporary
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=${size_kb}k tmpfs "$mnt" 2>/dev/null; then
  d="$mnt/run"; what="tmpfs of ${size_kb} KiB"
  run_env "$work/tmpfs.log"
  [ "$rc" = 1 ] || { cat "$work/tmpfs.log"; fail "$what: expected exit 1 on a full disk, got $rc"; }
  grep -qE "^fp4train: error: write failed: $d/[^ ]*: No space left on device" "$work/tmpfs.log" \
    || { cat "$work/tmpfs.log"; fail "$what: no clear message naming the file and the error"; }
  echo "tmpfs: $(grep '^fp4train: error' "$work/tmpfs.log")"
  mount -o remount,size=64m "$mnt" || fail "remount of the tmpfs"
  verify
  umount "$mnt"; mnt=
  tmpfs=passed
  echo "ok: $what (full, then enlarged and resumed)"
else
  mnt=
  echo "tmpfs: skipped (needs root and permission to mount a tmpfs)"
fi

summary=""
for c in checkpoint metrics random random-after-end resume summary enospc prune; do
  [ -n "${count[$c]:-}" ] && summary+=" $c=${count[$c]}"
done
echo "kill_campaign: all $kills kills passed (seed $seed):$summary; real full disk (tmpfs): $tmpfs;" \
     "$(( $(date +%s) - t_begin )) s"
