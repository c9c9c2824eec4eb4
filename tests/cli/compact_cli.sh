#!/usr/bin/env bash
# `fp4train compact` (docs/compare.md "Compacted runs"): finished runs of a comparison get
# metrics.jsonl.zst instead of metrics.jsonl; `report` (report.md, plots) and
# tools/study_telemetry.py give the same bytes after as before; unfinished and locked runs are
# left alone; a compacted run is reused by `compare` and refused by a resume; a damaged archive
# or a directory holding both files is refused, naming the file.
# Usage: compact_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); lockpid=
trap '[ -n "$lockpid" ] && kill "$lockpid" 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" docs=30 vocab_size=384 batch_size=2 steps=12 warmup_steps=2 interval=6 windows=4 telemetry_interval=6
cd "$work"
cmp_args=(--config micro.toml --recipes fp32,ue5m3-b16 --seeds 1 --out cmp --save-every 6)
out=$("$bin" compare "${cmp_args[@]}" 2>&1) || fail "compare failed: $out"
py=/usr/bin/python3; [ -x "$py" ] || py=python3
"$py" "$src/tools/study_telemetry.py" cmp > telemetry.before || fail "study_telemetry failed"
cp cmp/report.md report.before
[ -d cmp/plots ] && cp -r cmp/plots plots.before
plain_ue=$(md5sum < cmp/ue5m3-b16-s1/metrics.jsonl)
# unzst FILE: its decompressed bytes on stdout (the zstd program, else Python's zstandard).
unzst() {
  if command -v zstd >/dev/null; then zstd -dcq "$1"; else "$py" - "$1" <<'PY'
import sys, zstandard
sys.stdout.buffer.write(zstandard.ZstdDecompressor().decompressobj().decompress(open(sys.argv[1], "rb").read()))
PY
  fi
}

# A run being trained (its .fp4train.lock held) is refused, and nothing changes.
# (A Python process holds the flock as fp4::train does; ready once it wrote locked.)
"$py" -c 'import fcntl, sys, time
f = open(sys.argv[1], "a"); fcntl.flock(f, fcntl.LOCK_EX); open(sys.argv[2], "w").close(); time.sleep(60)' \
  cmp/fp32-s1/.fp4train.lock locked & lockpid=$!
for _ in $(seq 100); do [ -e locked ] && break; sleep 0.1; done
[ -e locked ] || fail "the lock holder did not start"
if true; then
  expect_error "is in use by another fp4train process" compact cmp/fp32-s1
  [ -f cmp/fp32-s1/metrics.jsonl ] && [ ! -e cmp/fp32-s1/metrics.jsonl.zst ] || fail "a locked run was changed"
  kill "$lockpid"; wait "$lockpid" 2>/dev/null; lockpid=
fi

# An unfinished run of the comparison is listed and left; named alone, it is refused.
mv cmp/ue5m3-b16-s1/summary.json summary.aside
out=$("$bin" compact cmp 2>&1) || fail "compact failed: $out"
grep -q "^cmp/ue5m3-b16-s1: not finished, left as it is$" <<<"$out" || fail "unfinished run not listed: $out"
grep -Eq "^cmp/fp32-s1: metrics.jsonl [0-9]+ -> metrics.jsonl.zst [0-9]+ bytes$" <<<"$out" || fail "no line for fp32-s1: $out"
[ -f cmp/ue5m3-b16-s1/metrics.jsonl ] || fail "the unfinished run was compacted"
[ ! -e cmp/fp32-s1/metrics.jsonl ] && [ -f cmp/fp32-s1/metrics.jsonl.zst ] || fail "fp32-s1 not compacted: $(ls cmp/fp32-s1)"
expect_error "the run has not finished" compact cmp/ue5m3-b16-s1
mv summary.aside cmp/ue5m3-b16-s1/summary.json
out=$("$bin" compact cmp 2>&1) || fail "second compact failed: $out"
grep -q "^cmp/fp32-s1: compacted before" <<<"$out" || fail "fp32-s1 not seen as compacted: $out"
grep -q "^compact: 2 run(s), 1 compacted before, metrics logs " <<<"$out" || fail "no total line: $out"
[ "$(unzst cmp/ue5m3-b16-s1/metrics.jsonl.zst | md5sum)" = "$plain_ue" ] \
  || fail "metrics.jsonl.zst does not decompress to the log"

# The report and the plots are the same bytes; so is the telemetry summary.
out=$("$bin" report cmp 2>&1) || fail "report of the compacted runs failed: $out"
cmp -s report.before cmp/report.md || fail "report.md differs after compaction: $(diff report.before cmp/report.md)"
if [ -d plots.before ]; then
  for p in plots.before/*.png; do
    cmp -s "$p" "cmp/plots/$(basename "$p")" || fail "plot $(basename "$p") differs after compaction"
  done
fi
"$py" "$src/tools/study_telemetry.py" cmp > telemetry.after || fail "study_telemetry failed on compacted runs"
cmp -s telemetry.before telemetry.after || fail "study_telemetry output differs"

# compare reuses compacted runs and trains nothing.
out=$("$bin" compare "${cmp_args[@]}" 2>&1) || fail "compare over compacted runs failed: $out"
[ "$(echo "$out" | grep -c 'finished earlier, reused')" = 2 ] || fail "compacted runs not reused: $out"
cmp -s report.before cmp/report.md || fail "compare's report differs over compacted runs"

# A compacted run is not resumed: the log would be restarted beside its archive.
mv cmp/fp32-s1/summary.json summary.aside
z=$(md5sum < cmp/fp32-s1/metrics.jsonl.zst)
expect_error "its metrics log was compacted into cmp/fp32-s1/metrics.jsonl.zst" train --resume cmp/fp32-s1
[ ! -e cmp/fp32-s1/metrics.jsonl ] && [ "$(md5sum < cmp/fp32-s1/metrics.jsonl.zst)" = "$z" ] \
  || fail "a refused resume changed the run"
mv summary.aside cmp/fp32-s1/summary.json
expect_error "already holds a run" train --config micro.toml --recipe fp32 --out cmp/fp32-s1

# Both files: refused by report (and the plots), settled by compact from the plain log.
unzst cmp/fp32-s1/metrics.jsonl.zst > cmp/fp32-s1/metrics.jsonl
expect_error "cmp/fp32-s1 holds both metrics.jsonl and metrics.jsonl.zst" report cmp --no-plots
err=$("$py" "$src/tools/plot_runs.py" --out p2 cmp/fp32-s1 2>&1) && fail "plot_runs accepted both files"
grep -q "holds both" <<<"$err" || fail "plot_runs did not explain: $err"
out=$("$bin" compact cmp/fp32-s1 2>&1) || fail "compact of both files failed: $out"
[ ! -e cmp/fp32-s1/metrics.jsonl ] || fail "compact left the plain log"
"$bin" report cmp > /dev/null 2>&1 || fail "report after settling failed"
cmp -s report.before cmp/report.md || fail "report differs after settling"

# A damaged archive: report, plot_runs and compact name the file.
head -c 100 cmp/fp32-s1/metrics.jsonl.zst > t.zst && mv t.zst cmp/fp32-s1/metrics.jsonl.zst
expect_error "cmp/fp32-s1/metrics.jsonl.zst: truncated zstd data" report cmp --no-plots
expect_error "cmp/fp32-s1/metrics.jsonl.zst: truncated zstd data" compact cmp/fp32-s1
err=$("$py" "$src/tools/plot_runs.py" --out p2 cmp/fp32-s1 2>&1) && fail "plot_runs accepted a truncated archive"
grep -q "cmp/fp32-s1/metrics.jsonl.zst: .*truncated" <<<"$err" || fail "plot_runs did not name the file: $err"
expect_error "is not a directory" compact nowhere
echo "compact_cli: OK"
