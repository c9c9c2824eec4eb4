#!/usr/bin/env bash
# Behaviour fingerprint of fp4train, for restructurings that must not change a bit
# (docs/design.md "The rooms, file by file", "Restructurings keep every bit"): short runs of
# every shipped recipe on the configs tiny, study and nemotron-h-tiny (the metrics.jsonl of each
# without its timing fields, and every tensor and non-timing metadata field of its final
# checkpoint), `fp4train info --json` of every shipped config, and `fp4train report` of the
# committed study. One line per item: "<item> <sha256>" (or "<item> refused" where the config
# refuses the recipe).
#
# Usage:
#   identity.sh record FP4TRAIN_BIN SOURCE_DIR OUT.txt      write the fingerprint
#   identity.sh check  FP4TRAIN_BIN SOURCE_DIR [BASELINE]   compare with the baseline
#   identity.sh baseline REV SOURCE_DIR                     build REV (a git worktree) and
#                                                           record its fingerprint as this
#                                                           CPU family's baseline
# The default baseline is tests/identity/baseline-<family>.txt, <family> x86-64-avx512 (AVX-512
# with AMX, or AMD's with AVX512-BF16: BF16 GEMMs on the native path), x86-64-avx512-widened
# (other AVX-512 CPUs, e.g. Intel's without AMX: BF16 GEMMs widened to FP32) or x86-64-avx2
# (from /proc/cpuinfo; FP4_MAX_CPU_ISA=AVX2 counts as avx2). Results may differ
# between CPU families (docs/numerics.md), so each family has its own baseline; docs/design.md
# ("Restructurings keep every bit") says from which commits. A baseline line whose hash reads
# to-record-after-REV changed by design at REV and has not been recorded on that family yet:
# check lists it until it is (`baseline REV` there, then keep only those lines' changes).
# Runs take about 15 minutes on 2 cores. Exit 0: identical; 1: differences (listed); 2: usage;
# 77: no baseline for this family (record one with `baseline`).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

family() {
  if [ "${FP4_MAX_CPU_ISA:-}" = AVX2 ] || ! grep -q ' avx512f' /proc/cpuinfo; then
    echo x86-64-avx2
  elif grep -q ' amx_bf16' /proc/cpuinfo ||
       { grep -q AuthenticAMD /proc/cpuinfo && grep -q ' avx512_bf16' /proc/cpuinfo; }; then
    echo x86-64-avx512
  else  # AVX-512 whose BF16 GEMMs take the widened path (docs/gemm.md "Which path a CPU takes")
    echo x86-64-avx512-widened
  fi
}

# Hash of a metrics.jsonl without timings, or of a checkpoint's tensors and metadata.
py_hash() {  # kind file [workdir srcdir: replaced by WORK, SRC in the checkpoint's metadata]
  python3 - "$1" "$2" "${3:-}" "${4:-}" <<'PY'
import hashlib, json, struct, sys
kind, path, work, src = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
TIMING = {"tokens_per_s", "step_ms", "mfu", "train_seconds", "wall_seconds", "machine_load"}
def scrub(x):
    if isinstance(x, dict):
        return {k: scrub(v) for k, v in x.items() if k not in TIMING and not k.endswith("_seconds")}
    if isinstance(x, list):
        return [scrub(v) for v in x]
    return x
h = hashlib.sha256()
if kind == "metrics":
    for line in open(path):
        h.update(json.dumps(scrub(json.loads(line)), sort_keys=True).encode() + b"\n")
else:  # safetensors checkpoint
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    meta.pop("checksum", None)  # covers the timings of 'trainer'
    if "trainer" in meta:
        meta["trainer"] = json.dumps(scrub(json.loads(meta["trainer"])), sort_keys=True)
    # The config_toml and names hold the run's temporary directory (data.cache) and
    # the source tree's (data.path).
    text = json.dumps(meta, sort_keys=True)
    if work:
        text = text.replace(work, "WORK")
        # The config's label: fp4train now adds none for data.cache (a key that changes no
        # result); the baseline's binary labelled it "tiny+data.cache=WORK/cache".
        text = text.replace("+data.cache=WORK/cache", "")
    if src:
        text = text.replace(src, "SRC")
    # The token-cache key is version 2 since pre-tokenized sources (data_key; docs/data.md "The
    # token cache"); a text corpus's cache records the version-1 key of the same tokens, which
    # the baseline's binary wrote.
    if work:
        import glob
        for m in glob.glob(work + "/cache/*/meta.json"):
            cm = json.load(open(m))
            for old in cm.get("legacy_keys", []):
                text = text.replace(cm["key"], old)
    h.update(text.encode())
    for name in sorted(header):
        t = header[name]
        a, b = t["data_offsets"]
        h.update(json.dumps([name, t["dtype"], t["shape"]]).encode())
        h.update(body[a:b])
print(h.hexdigest())
PY
}

record() {  # bin src out
  local bin src out=$3 work cfg r rd log
  bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); src=$(cd "$2" && pwd)
  work=$(mktemp -d); trap 'rm -rf "$work"' RETURN
  : > "$work/fingerprint"
  local recipes; recipes=$(cd "$src/configs/recipes" && ls *.toml | sed 's/\.toml$//' | sort)
  for cfg in $(cd "$src/configs" && ls *.toml | sed 's/\.toml$//' | sort); do
    # From inside the source tree: the JSON names the config file as given.
    (cd "$src" && "$bin" info --config "configs/$cfg.toml" --json) > "$work/info.json" 2>&1 || true
    echo "info/$cfg $(sha256sum < "$work/info.json" | cut -c1-64)" >> "$work/fingerprint"
  done
  for cfg in tiny study nemotron-h-tiny; do
    for r in $recipes; do
      rd="$work/runs/$cfg-$r"; log="$work/$cfg-$r.log"
      echo "identity: $cfg $r" >&2
      if OMP_NUM_THREADS=2 "$bin" train --config "$src/configs/$cfg.toml" --recipe "$r" \
          --data "$src/data/brown/text" --steps 3 --out "$rd" --quiet \
          --set data.cache="$work/cache" --set eval.interval=2 --set eval.windows=4 \
          --set log.telemetry_interval=2 > "$log" 2>&1; then
        echo "run/$cfg/$r/metrics $(py_hash metrics "$rd/metrics.jsonl")" >> "$work/fingerprint"
        local ck; ck=$(ls "$rd"/checkpoints/*.safetensors 2>/dev/null | sort | tail -1)
        if [ -n "$ck" ]; then
          echo "run/$cfg/$r/checkpoint $(py_hash checkpoint "$ck" "$work" "$src")" >> "$work/fingerprint"
        else
          echo "run/$cfg/$r/checkpoint none" >> "$work/fingerprint"
        fi
      else
        echo "run/$cfg/$r refused" >> "$work/fingerprint"
      fi
    done
  done
  cp -r "$src/docs/results/study" "$work/study"
  # Without its report and plots: `report --no-plots` notes a plots/ directory left from an
  # earlier report, which the baseline's binary did not.
  rm -rf "$work/study/report.md" "$work/study/plots"
  # From inside $work: the report names the directory it was given.
  (cd "$work" && "$bin" report study --hypotheses "$src/configs/studies/claims.toml" --no-plots \
    > report.log 2>&1)
  # The report names the study file by its path in the source tree: SRC, so that the
  # fingerprint does not depend on where the tree is.
  echo "report/study $(sed "s|$src|SRC|g" "$work/study/report.md" | sha256sum | cut -c1-64)" \
    >> "$work/fingerprint"
  mv "$work/fingerprint" "$out"
}

case "${1:-}" in
  record) [ $# -eq 4 ] || exit 2; record "$2" "$3" "$4" ;;
  check)
    [ $# -ge 3 ] || exit 2
    base=${4:-$here/baseline-$(family).txt}
    if [ ! -f "$base" ]; then
      echo "identity: no baseline $base for this CPU family; record one with" \
           "'bash tests/identity/identity.sh baseline $(cat "$here/BASELINE_REV" 2>/dev/null || echo REV) .'"
      exit 77
    fi
    now=$(mktemp); record "$2" "$3" "$now"
    if diff -u "$base" "$now"; then
      echo "identity: $(wc -l < "$now") items identical to $(basename "$base")"; rm -f "$now"; exit 0
    fi
    echo "identity: differences from $(basename "$base") (above)"
    pending=$(grep -c ' to-record-after-' "$base")
    [ "$pending" -eq 0 ] || echo "identity: $pending of them are baseline lines not yet recorded" \
      "on this family (to-record-after-REV; docs/design.md \"Restructurings keep every bit\")"
    rm -f "$now"; exit 1 ;;
  baseline)
    [ $# -eq 3 ] || exit 2
    rev=$2; src=$(cd "$3" && pwd); wt=$(mktemp -d)/fp4train-$rev
    git -C "$src" worktree add --detach "$wt" "$rev" >&2 || exit 2
    ln -s "$src/data" "$wt/data"
    cmake -S "$wt" -B "$wt/build" -DCMAKE_BUILD_TYPE=Release -DFP4_PYTHON=OFF > /dev/null &&
      cmake --build "$wt/build" -j"$(nproc)" --target fp4train > /dev/null || exit 2
    record "$wt/build/fp4train" "$src" "$here/baseline-$(family).txt"
    git -C "$src" worktree remove --force "$wt"
    echo "identity: wrote $here/baseline-$(family).txt from $rev" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
