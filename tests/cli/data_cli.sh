#!/usr/bin/env bash
# `fp4train data` and the data sources of docs/data.md ("`fp4train data`", "JSONL",
# "Pre-tokenized shards"), end to end on a micro model:
#  * data describes a text corpus (not built, then built with --build; --json);
#  * --export writes llm.c shards of the cached streams, and training on them (data.path,
#    data.heldout, data.tokenizer) gives the same metrics, bit for bit, as training on the text;
#  * a vocabulary above 65,535 (uint32 ids, data.heldout_fraction) trains for a few steps;
#  * bad input (truncated shard, id outside the vocabulary, no held-out choice, a malformed
#    JSONL record, a truncated .jsonl.zst) exits 2 with a message naming the file;
#  * tools/text_to_jsonl.py's .jsonl.zst shards of the text give the text's token counts.
# Usage: data_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"
py=/usr/bin/python3
micro_setup "$work" docs=20 steps=3 warmup_steps=1 interval=3 windows=4
cfg="$work/micro.toml"

bad() {  # bad <stderr fragment> <args...>
  local want=$1; shift
  "$bin" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "exit $rc (want 2) for: $* ($(cat "$work/err"))"
  grep -qF -- "$want" "$work/err" || fail "stderr for '$*' lacks '$want': $(cat "$work/err")"
}
# --- describe, build, describe again -----------------------------------------------------
"$bin" data --config "$cfg" > "$work/d1.txt" 2>&1 || fail "data: $(cat "$work/d1.txt")"
grep -q "documents:  18 train, 2 held-out" "$work/d1.txt" || fail "data: $(cat "$work/d1.txt")"
grep -q "not built" "$work/d1.txt" || fail "data before --build: $(cat "$work/d1.txt")"
[ ! -e "$work/cache" ] || [ -z "$(ls "$work/cache")" ] || fail "data without --build wrote a cache"
"$bin" data --config "$cfg" --build --json > "$work/d2.json" 2>"$work/d2.err" || fail "data --build: $(cat "$work/d2.err")"
$py - "$work/d2.json" <<'PY' || fail "data --json: $(cat "$work/d2.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["cached"] and j["format"] == "text" and j["train_docs"] == 18 and j["heldout_docs"] == 2, j
assert j["train_tokens"] > 1000 and j["heldout_tokens"] > 100 and j["token_bytes"] == 2, j
assert len(j["key"]) == 16 and j["cache_dir"].endswith(j["key"]), j
PY
grep -q "training tokenizer" "$work/d2.err" || fail "data --build did not say it trained: $(cat "$work/d2.err")"

# --- llm.c shards from the cache train bit for bit as the text does -------------------------
"$bin" data --config "$cfg" --export "$work/llmc" > "$work/exp.txt" 2>&1 || fail "export: $(cat "$work/exp.txt")"
for f in train.bin val.bin tokenizer.model; do [ -s "$work/llmc/$f" ] || fail "export lacks $f"; done
"$bin" train --config "$cfg" --out "$work/r-text" --quiet > "$work/t1.txt" 2>&1 || fail "train on text: $(cat "$work/t1.txt")"
"$bin" train --config "$cfg" --out "$work/r-llmc" --quiet \
  --set data.path="\"$work/llmc/train.bin\"" --set data.heldout="\"$work/llmc/val.bin\"" \
  --set data.tokenizer="\"$work/llmc/tokenizer.model\"" > "$work/t2.txt" 2>&1 || fail "train on llmc: $(cat "$work/t2.txt")"
$py - "$work/r-text/metrics.jsonl" "$work/r-llmc/metrics.jsonl" <<'PY' || fail "llmc run differs from the text run"
import json, sys
T = {"tokens_per_s", "step_ms", "mfu", "machine_load"}
a, b = ([{k: v for k, v in json.loads(l).items() if k not in T} for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 3 and a == b, (a, b)
PY
[ -s "$work/r-llmc/tokenizer.model" ] || fail "the llmc run has no tokenizer.model"

# --- a vocabulary above 65,535: uint32 ids -------------------------------------------------
$py - "$work/big.u32" <<'PY'
import struct, sys, random
r = random.Random(7)
open(sys.argv[1], "wb").write(struct.pack("<8000I", *[r.randrange(70000) for _ in range(8000)]))
PY
"$bin" train --config "$cfg" --out "$work/r-big" --quiet --set model.vocab_size=70000 \
  --set data.path="\"$work/big.u32\"" --set data.format='"uint32"' --set data.heldout_fraction=0.1 \
  > "$work/t3.txt" 2>&1 || fail "train with vocab 70000: $(cat "$work/t3.txt")"
$py - "$work/r-big" <<'PY' || fail "vocab-70000 run: $(cat "$work/r-big/summary.json")"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert len(lines) == 3 and all(math.isfinite(l["loss"]) for l in lines), lines
# Uniform random ids: the first loss is near ln 70000 = 11.16 (init logits are small).
assert abs(lines[0]["loss"] - math.log(70000)) < 0.5, lines[0]["loss"]
PY
# Without data.tokenizer: eval scores NLL (no bits/byte), sample says what it lacks.
"$bin" eval --checkpoint "$work/r-big" --policy none --windows 2 > "$work/e3.txt" 2>&1 || fail "eval of r-big: $(cat "$work/e3.txt")"
grep -q "bits/byte: not computed" "$work/e3.txt" || fail "eval of r-big: $(cat "$work/e3.txt")"
bad "data.tokenizer" sample --checkpoint "$work/r-big" --tokens 4
"$bin" data --config "$cfg" --json --set model.vocab_size=70000 --set data.path="\"$work/big.u32\"" \
  --set data.format='"uint32"' --set data.heldout_fraction=0.1 > "$work/d3.json" 2>/dev/null || fail "data of big.u32"
grep -q '"token_bytes": 4' "$work/d3.json" || fail "vocab 70000 cache not 4-byte: $(cat "$work/d3.json")"

# --- bad input: exit 2, the file named ------------------------------------------------------
head -c 2000 "$work/llmc/train.bin" > "$work/trunc.bin"
bad "truncated" data --config "$cfg" --set data.path="\"$work/trunc.bin\"" --set data.heldout_fraction=0.1
bad "id " train --config "$cfg" --out "$work/r-bad" --set model.vocab_size=60000 \
  --set data.path="\"$work/big.u32\"" --set data.format='"uint32"' --set data.heldout_fraction=0.1
bad "data.heldout_fraction" data --config "$cfg" --set data.path="\"$work/big.u32\"" --set data.format='"uint32"'
bad "data.format" data --config "$cfg" --set data.format='"parquet"'
bad "reads only data.*" data --config "$cfg" --set train.lr=1
# JSONL: a malformed record names the file and line; a truncated .zst names the file.
mkdir -p "$work/j"
printf '{"text": "one"}\n{"text": 5}\n' > "$work/j/a.jsonl"
bad "a.jsonl:2" data --config "$cfg" --data "$work/j"
"$py" "$src/tools/text_to_jsonl.py" "$work/text" "$work/jz" --docs-per-shard 100 >/dev/null || fail "text_to_jsonl"
head -c 1000 "$work/jz/shard-0000.jsonl.zst" > "$work/trunc.jsonl.zst"
bad "truncated zstd" data --config "$cfg" --data "$work/trunc.jsonl.zst"
printf '\xef\xbb\xbf{"text": "one"}\n' > "$work/j/a.jsonl"
bad "byte-order mark" data --config "$cfg" --data "$work/j"
# compare --task needs documents: refused before any run on pre-tokenized data.
bad "pre-tokenized" compare --config "$cfg" --out "$work/cmp" --recipes fp32 --seeds 1 --task next-sentence \
  --set data.path="\"$work/big.u32\"" --set data.format='"uint32"' --set data.heldout_fraction=0.1 \
  --set model.vocab_size=70000
[ ! -e "$work/cmp" ] || fail "compare --task made its directory before refusing pre-tokenized data"
# The same documents as .jsonl.zst give the text run's tokens (another key: names differ).
"$bin" data --config "$cfg" --data "$work/jz" --build --json > "$work/d4.json" 2>/dev/null || fail "data of $work/jz"
$py - "$work/d2.json" "$work/d4.json" <<'PY' || fail "jsonl.zst tokens differ from the text's"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert b["format"] == "jsonl" and b["key"] != a["key"], b
assert (a["train_tokens"], a["heldout_tokens"]) == (b["train_tokens"], b["heldout_tokens"]), (a, b)
PY
# llm.c's layout: train and val shards in one directory; data.heldout names the val shard,
# which then is not trained on.
mkdir -p "$work/lay"
cp "$work/llmc/train.bin" "$work/lay/fineweb_train_000001.bin"
cp "$work/llmc/val.bin" "$work/lay/fineweb_val_000000.bin"
"$bin" data --config "$cfg" --data "$work/lay" --set data.heldout="\"$work/lay/fineweb_val_000000.bin\"" \
  --build --json > "$work/d5.json" 2>"$work/d5.err" || fail "data of $work/lay: $(cat "$work/d5.err")"
$py - "$work/d2.json" "$work/d5.json" <<'PY' || fail "the val shard inside data.path was trained on: $(cat "$work/d5.json")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert (a["train_tokens"], a["heldout_tokens"]) == (b["train_tokens"], b["heldout_tokens"]), (a, b)
PY
grep -q "held out, not trained on" "$work/d5.err" || fail "no note of the excluded val shard: $(cat "$work/d5.err")"
echo "data_cli: ok"
