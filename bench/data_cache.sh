#!/usr/bin/env bash
# Token-cache building on large JSONL.zst corpora (docs/performance.md "Building the token
# cache"): corpora of the given sizes are made by replicating the Brown corpus with a seed
# (each copy takes the documents in a seeded order and rotates each document's lines by its
# copy number, so no two copies are the same text), written as .jsonl.zst shards of about
# 16 MB of text each. For each size `fp4train data --build` builds the cache from nothing,
# `--reps` times (default 1), under /usr/bin/time. Printed per size: the text size, the
# tokens, the median wall time, tokens per second, peak resident memory (max RSS), and the
# ratios of time and memory to the smallest size. Memory stays flat once the training split
# exceeds the tokenizer's 32 MiB training sample: nothing else grows with the corpus.
# Usage: bash bench/data_cache.sh [--bin PATH] [--reps N] [--vocab V] [MB ...]  (default 25 50 100 200)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/fp4train"; reps=1; vocab=4096
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    *) echo "data_cache.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(25 50 100 200)
[[ -x $bin ]] || { echo "data_cache.sh: no fp4train at $bin (bash scripts/build)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "data_cache.sh: needs /usr/bin/time (Debian: time)" >&2; exit 2; }
command -v zstd >/dev/null || { echo "data_cache.sh: needs zstd (scripts/setup installs it)" >&2; exit 2; }
brown="$root/data/brown/text"
[[ -d $brown ]] || { echo "data_cache.sh: no Brown corpus at $brown (bash scripts/setup)" >&2; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
echo "# fp4train data --build on replicated Brown JSONL.zst; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, vocab $vocab"
printf "%8s %12s %10s %12s %10s %8s %8s\n" "text_MB" "tokens" "wall_s" "tokens/s" "maxRSS_MB" "t/t0" "mem/m0"
t0=""; m0=""
for mb in "${sizes[@]}"; do
  dir="$work/corpus-$mb"; mkdir -p "$dir"
  /usr/bin/python3 - "$brown" "$dir" "$mb" <<'PY'
import json, os, random, subprocess, sys
brown, out, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
docs = [open(os.path.join(brown, f), encoding="utf-8").read().strip() for f in sorted(os.listdir(brown)) if not f.startswith(".")]
target, shard_bytes = mb * 1_000_000, 16_000_000
total, copy, shard, buf, size = 0, 0, 0, [], 0
def flush():
    global shard, buf, size
    if not buf: return
    data = "".join(buf).encode()
    subprocess.run(["zstd", "-q", "-3", "-o", os.path.join(out, "shard-%04d.jsonl.zst" % shard)], input=data, check=True)
    shard, buf, size = shard + 1, [], 0
while total < target:
    order = list(range(len(docs))); random.Random(1000 + copy).shuffle(order)
    for i in order:
        lines = docs[i].split("\n"); k = copy % len(lines)
        text = "\n".join(lines[k:] + lines[:k])
        buf.append(json.dumps({"text": text, "copy": copy}, ensure_ascii=False) + "\n")
        size += len(text); total += len(text)
        if size >= shard_bytes: flush()
        if total >= target: break
    copy += 1
flush()
PY
  walls=(); rss=(); tokens=0
  for ((r = 0; r < reps; r++)); do
    rm -rf "$work/cache"
    /usr/bin/time -f "%e %M" -o "$work/time" "$bin" data --data "$dir" --build --json \
      --set data.cache="\"$work/cache\"" --set model.vocab_size="$vocab" > "$work/d.json" 2> "$work/log"
    read -r w m < "$work/time"
    walls+=("$w"); rss+=("$m")
    tokens=$(/usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['train_tokens'] + j['heldout_tokens'])" "$work/d.json")
  done
  med() { printf "%s\n" "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
  wall=$(med "${walls[@]}"); mem=$(med "${rss[@]}")
  text_mb=$(/usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('%.1f' % ((j['train_bytes'] + j['heldout_bytes']) / 1e6))" "$work/d.json")
  [[ -n $t0 ]] || { t0=$wall; m0=$mem; }
  awk -v mb="$text_mb" -v tok="$tokens" -v w="$wall" -v m="$mem" -v t0="$t0" -v m0="$m0" \
    'BEGIN {printf "%8s %12d %10.1f %12.0f %10.0f %8.2f %8.2f\n", mb, tok, w, tok / w, m / 1024, w / t0, m / m0}'
  rm -rf "$dir"
done
