#!/usr/bin/env bash
# fp4train's default OpenMP wait policy (src/cli/omp_wait.h): with neither OMP_WAIT_POLICY nor
# GOMP_SPINCOUNT set, libgomp runs passive (spin count 0, as OMP_DISPLAY_ENV=verbose reports
# it after fp4train has re-executed itself); a variable the user set is left as it is; and a
# micro training run gives bit-identical metrics (losses, grad norms) under passive, active and
# a bounded spin, at 2 threads.
# Usage: omp_wait.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
unset OMP_WAIT_POLICY GOMP_SPINCOUNT

# The spin count libgomp settled on in the process that ran the command (the last report).
spin_of() { env "$@" OMP_DISPLAY_ENV=verbose "$bin" info --config "$src/configs/tiny.toml" 2>&1 |
            sed -n "s/^ *GOMP_SPINCOUNT = '\([0-9]*\)'.*/\1/p" | tail -1; }
s=$(spin_of); [ "$s" = 0 ] || fail "default: GOMP_SPINCOUNT $s, expected 0 (passive)"
s=$(spin_of GOMP_SPINCOUNT=1234); [ "$s" = 1234 ] || fail "user GOMP_SPINCOUNT=1234 became $s"
s=$(spin_of OMP_WAIT_POLICY=active); [ "$s" -gt 1000000 ] || fail "user OMP_WAIT_POLICY=active gave spin count $s"
# Arguments survive the re-execution (a bad one still gets its own error and exit 2).
expect_error "--steps" train --config "$src/configs/tiny.toml" --steps -5

micro_setup "$work" docs=20 steps=4 warmup_steps=1 interval=4 windows=2
cd "$work"
for p in default active spin; do
  case $p in
    default) e=() ;;
    active) e=(OMP_WAIT_POLICY=active) ;;
    spin) e=(GOMP_SPINCOUNT=3000) ;;
  esac
  env "${e[@]}" OMP_NUM_THREADS=2 "$bin" train --config micro.toml --recipe ue5m3-b16 --quiet \
    --out "run-$p" >/dev/null 2>&1 || fail "train under $p failed"
  python3 -c "
import json, sys
for l in open('run-$p/metrics.jsonl'):
    r = json.loads(l)
    print(r['step'], r['loss'].hex() if isinstance(r['loss'], float) else r['loss'], float(r['grad_norm']).hex())
" > "$p.txt" || fail "metrics of $p unreadable"
done
[ -s default.txt ] || fail "no metrics"
cmp -s default.txt active.txt || fail "active waiting changed the losses: $(diff default.txt active.txt | head -4)"
cmp -s default.txt spin.txt || fail "a bounded spin changed the losses: $(diff default.txt spin.txt | head -4)"
echo "omp_wait: ok"
