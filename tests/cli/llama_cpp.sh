#!/usr/bin/env bash
# `fp4train export --format gguf` checked against llama.cpp itself (docs/export.md "The
# llama.cpp check"): micro fp32 runs of both Llama-style MLPs (squared ReLU -> llama.cpp's
# arcee, SwiGLU with grouped-query attention -> llama) and of the hybrid (Mamba-2 with 2 groups,
# GQA attention, MLP -> nemotron_h), exported, loaded by llama.cpp (node-llama-cpp 3.21.1,
# tools/llama/), scored on fp4train eval's own held-out windows: the mean NLL and every
# window's NLL agree to 1e-4 relative. Copies with a plausible export bug (SwiGLU halves
# swapped, q/k rows in HF's order, A_log for A) must miss, so the check
# can fail. Every key and tensor written is read back; configs llama.cpp cannot run are
# refused (exit 2). llama.cpp's tokenizer (the exported SentencePiece vocabulary) gives the
# held-out documents fp4train's token ids. Greedy continuations (fp4train sample, llama.cpp)
# agree token for token.
# Exit 77 (skip) without tools/llama/node_modules (scripts/setup installs it where Node.js >= 20
# runs on x86-64) unless FP4_REQUIRE_LLAMA=1 (.ci/run sets it).
# Usage: llama_cpp.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
lib="$(cd "$(dirname "$0")" && pwd)/lib"
source "$lib/micro.bash"
llama="$src/tools/llama"

micro_setup "$work" steps=80 warmup_steps=8 interval=100 windows=6 telemetry_interval=0

# --- refusals (no llama.cpp needed) -------------------------------------------------------
"$bin" train --config "$work/micro.toml" --recipe fp32 --out "$work/norope" --quiet --peak-gflops 1 \
  --steps 2 --set model.rope=false > "$work/t0.txt" 2>&1 || { cat "$work/t0.txt"; fail "train (no RoPE)"; }
expect_error "model.rope = false" export --checkpoint "$work/norope" --out "$work/g0" --format gguf
[ ! -e "$work/g0" ] || fail "a refused export created its --out directory"
expect_error "--format: gguf2 not in" export --checkpoint "$work/norope" --out "$work/g0" --format gguf2

# The hybrid: the micro model as "M-*M-" (Mamba-2: 4 heads of 8, 2 groups, state 8, two SSD
# chunks per sequence), no RoPE, as llama.cpp's nemotron_h.
sed -e 's/^n_layers = 2$/pattern = "M-*M-"\nn_kv_heads = 1\nrope = false\nmamba_num_heads = 4\nmamba_head_dim = 8\nmamba_n_groups = 2\nmamba_state_size = 8\nmamba_chunk_size = 16/' \
  "$work/micro.toml" > "$work/hybrid.toml"
grep -q 'pattern = "M-\*M-"' "$work/hybrid.toml" || fail "hybrid.toml"
"$bin" train --config "$work/hybrid.toml" --recipe fp32 --out "$work/hyrope" --quiet --peak-gflops 1 \
  --steps 2 --set model.rope=true > "$work/t1.txt" 2>&1 || { cat "$work/t1.txt"; fail "train (hybrid, RoPE)"; }
expect_error "nemotron_h applies no RoPE" export --checkpoint "$work/hyrope" --out "$work/g1" --format gguf
# llama.cpp's nemotron_h needs a Mamba-2 and an attention block (it aborts on the file otherwise).
for p in '"**"' '"MM"' '"M-"'; do
  sed -e "s/^pattern = .*/pattern = $p/" "$work/hybrid.toml" > "$work/p.toml"
  "$bin" train --config "$work/p.toml" --recipe fp32 --out "$work/pat" --quiet --peak-gflops 1 --steps 1 \
    > "$work/t3.txt" 2>&1 || { cat "$work/t3.txt"; fail "train (pattern $p)"; }
  expect_error "needs at least one of each" export --checkpoint "$work/pat" --out "$work/g1" --format gguf
  rm -rf "$work/pat"
done

if [ ! -d "$llama/node_modules/node-llama-cpp" ]; then
  [ "${FP4_REQUIRE_LLAMA:-0}" = 1 ] && fail "tools/llama/node_modules missing (bash scripts/setup installs it)"
  echo "SKIP: tools/llama/node_modules missing (bash scripts/setup installs node-llama-cpp)"
  exit 77
fi

# check_run NAME ARCH [--config F] [--recipe R --weights W [--requantize]] [--set ...]: train,
# export (F32 weights; or W for the FP4 linears, scored by eval's llama-q8_0 policy, which
# computes as llama.cpp does), score with both engines, compare.
check_run() {
  local name=$1 arch=$2; shift 2
  local run="$work/$name" config="$work/micro.toml" recipe=fp32 weights=f32 policy=none requant=()
  if [ "${1:-}" = --config ]; then config=$2; shift 2; fi
  if [ "${1:-}" = --recipe ]; then recipe=$2 weights=$4 policy=llama-q8_0; shift 4; fi
  if [ "${1:-}" = --requantize ]; then requant=(--requantize); shift; fi
  "$bin" train --config "$config" --recipe "$recipe" --out "$run" --quiet --peak-gflops 1 "$@" \
    > "$run.train.txt" 2>&1 || { cat "$run.train.txt"; fail "$name: train"; }
  "$bin" export --checkpoint "$run" --out "$run/gguf" --format gguf --weights "$weights" "${requant[@]}" \
    > "$run.export.txt" 2>&1 || { cat "$run.export.txt"; fail "$name: export"; }
  grep -q "architecture $arch" "$run.export.txt" || { cat "$run.export.txt"; fail "$name: not $arch"; }
  # A re-quantized export is scored with the recipe's weights as NVFP4 (E4M3 scales).
  local eval_sets=()
  [ ${#requant[@]} -gt 0 ] && eval_sets=(--set fp4.scale_format=e4m3 --set fp4.scale_target=448)
  "$bin" eval --checkpoint "$run" --policy "$policy" "${eval_sets[@]}" --json "$run/eval.json" \
    --windows-out "$run/windows.json" > "$run.eval.txt" 2>&1 || { cat "$run.eval.txt"; fail "$name: eval"; }
  node "$llama/llama_nll.mjs" "$run/gguf/model.gguf" "$run/windows.json" "$run/llama.json" \
    > "$run.llama.txt" 2>&1 || { cat "$run.llama.txt"; fail "$name: llama.cpp"; }
  python3 - "$run" "$arch" <<'PY' || fail "$name: llama.cpp disagrees"
import json, sys
run, arch = sys.argv[1:]
policy, ours = next(iter(json.load(open(f"{run}/eval.json"))["results"].items()))
theirs = json.load(open(f"{run}/llama.json"))
rel = lambda a, b: abs(a - b) / abs(a)
worst = max(rel(a, b) for a, b in zip(ours["window_nll"], theirs["window_nll"]))
assert len(ours["window_nll"]) == len(theirs["window_nll"]) == 6, "window counts"
print(f"{arch} ({run.split('/')[-1]}, eval --policy {policy}): fp4train {ours['nats_per_token']:.6f}, llama.cpp {theirs['nats_per_token']:.6f} "
      f"nats/token; worst window relative difference {worst:.2e}")
# F32 weights: 1e-4 relative, mean and every window. FP4 weights against Q8_0 activations:
# mean 1e-4, every window 5e-4 (a last-bit difference upstream can flip one Q8_0 rounding,
# which moves that activation by a 1/127 step: docs/export.md "FP4 weights in GGUF").
window_tol = 1e-4 if policy == "none" else 5e-4
assert rel(ours["nats_per_token"], theirs["nats_per_token"]) < 1e-4
assert worst < window_tol
PY
}

check_run relu2 arcee
check_run swiglu llama --set model.mlp=swiglu --set model.n_kv_heads=1
check_run hybrid nemotron_h --config "$work/hybrid.toml"

# greedy_check NAME: greedy continuations of three prompts (16 tokens) by fp4train sample and by
# llama.cpp on the F32 export agree token for token; a first difference is accepted only at a
# near tie (llama.cpp's top two probabilities within 1e-3, where the engines' last-bit
# differences may choose either), and is printed.
greedy_check() {
  local run="$work/$1" i=0
  for p in "The" "It was a" "In the"; do
    "$bin" sample --checkpoint "$run" --policy none --temperature 0 --prompt "$p" --tokens 16 \
      --ids-out "$run/ids$i.json" > "$run.sample.txt" 2>&1 || { cat "$run.sample.txt"; fail "$1: sample"; }
    i=$((i + 1))
  done
  python3 -c "import json, sys; print(json.dumps([json.load(open(f)) for f in sys.argv[1:]]))" \
    "$run"/ids0.json "$run"/ids1.json "$run"/ids2.json > "$run/prompts.json"
  node "$llama/llama_greedy.mjs" "$run/gguf/model.gguf" "$run/prompts.json" 16 "$run/greedy.json" \
    > "$run.greedy.txt" 2>&1 || { cat "$run.greedy.txt"; fail "$1: llama.cpp greedy"; }
  python3 - "$run" "$1" <<'PY' || fail "$1: greedy continuations differ"
import json, sys
run, name = sys.argv[1:]
ours, theirs = json.load(open(f"{run}/prompts.json")), json.load(open(f"{run}/greedy.json"))
assert len(ours) == len(theirs) == 3
same = 0
for k, (a, b) in enumerate(zip(ours, theirs)):
    a, b, margin = a["continuation"], b["continuation"], b["margin"]
    d = next((t for t in range(min(len(a), len(b))) if a[t] != b[t]), None)
    if d is None:
        assert len(a) == len(b), f"prompt {k}: lengths {len(a)} and {len(b)}"
        same += 1
        continue
    print(f"{name}: prompt {k} differs at token {d} ({a[d]} vs {b[d]}), llama.cpp's top-2 gap {margin[d]:.2e}")
    assert margin[d] < 1e-3, f"prompt {k}: a difference that is no near tie"
print(f"{name}: greedy continuations identical for {same} of 3 prompts (16 tokens each)")
PY
}
greedy_check hybrid
greedy_check swiglu
# FP4 weights: an MXFP4 run (arcee); an NVFP4 run (nvfp4-te: SwiGLU, d 64 so every inner
# dimension is a multiple of GGUF's NVFP4 block of 64; its BF16 final blocks go as F32); a
# UE5M3 run re-quantized to NVFP4.
check_run mxfp4 arcee --recipe mxfp4 --weights mxfp4
check_run nvfp4 llama --recipe nvfp4-te --weights nvfp4 --set model.mlp=swiglu --set model.d_model=64
check_run ue5m3 llama --recipe ue5m3-b16 --weights nvfp4 --requantize --set model.mlp=swiglu --set model.d_model=64
grep -q "NVFP4 (re-quantized)" "$work/ue5m3.export.txt" || fail "re-quantized export not said so"
expect_error "--requantize writes them re-quantized" export --checkpoint "$work/ue5m3" --out "$work/g2" --format gguf --weights nvfp4
expect_error "arcee graph" export --checkpoint "$work/mxfp4" --out "$work/g2" --format gguf --weights nvfp4 --requantize
"$bin" train --config "$work/micro.toml" --recipe nvfp4-te --out "$work/nv32" --quiet --peak-gflops 1 \
  --steps 2 --set model.mlp=swiglu > "$work/t2.txt" 2>&1 || { cat "$work/t2.txt"; fail "train (NVFP4, d 32)"; }
expect_error "inner dimension 32 is not a multiple of 64" export --checkpoint "$work/nv32" --out "$work/g2" --format gguf --weights nvfp4
expect_error "not as MXFP4" export --checkpoint "$work/nvfp4" --out "$work/g2" --format gguf --weights mxfp4
expect_error "--weights goes with --format gguf" export --checkpoint "$work/nvfp4" --out "$work/g2" --weights nvfp4
expect_error "--requantize goes with --weights nvfp4" export --checkpoint "$work/nvfp4" --out "$work/g2" --format gguf --requantize
[ ! -e "$work/g2" ] || fail "a refused export created its --out directory"

# --- every key and tensor written, read back --------------------------------------------
python3 - "$work/swiglu" "$lib" <<'PY' || fail "GGUF contents"
import sys
run = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import gguf_read
kv, tensors, _ = gguf_read.read(open(f"{run}/gguf/model.gguf", "rb").read())
names = {n: (ne, t) for n, (ne, t, _) in tensors.items()}
cfg = {"d": 32, "L": 2, "F": 64, "H": 2, "KV": 1, "V": 512, "T": 32}
want = {"general.architecture": "llama", "general.file_type": 0, "llama.context_length": cfg["T"],
        "llama.embedding_length": cfg["d"], "llama.block_count": cfg["L"],
        "llama.feed_forward_length": cfg["F"], "llama.attention.head_count": cfg["H"],
        "llama.attention.head_count_kv": cfg["KV"], "llama.rope.dimension_count": 16,
        "llama.vocab_size": cfg["V"], "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": False}
for k, v in want.items():
    assert kv.get(k) == v, (k, kv.get(k), v)
assert abs(kv["llama.attention.layer_norm_rms_epsilon"] - 1e-5) < 1e-12
assert kv["llama.rope.freq_base"] == 10000.0
assert len(kv["tokenizer.ggml.tokens"]) == len(kv["tokenizer.ggml.scores"]) == len(kv["tokenizer.ggml.token_type"]) == cfg["V"]
assert kv["tokenizer.ggml.tokens"][:3] == ["<unk>", "<s>", "</s>"], kv["tokenizer.ggml.tokens"][:3]
assert kv["tokenizer.ggml.token_type"][:3] == [2, 3, 3]
assert kv["tokenizer.ggml.tokens"][3] == "<0x00>" and kv["tokenizer.ggml.token_type"][3] == 6
d, F, V, hd = cfg["d"], cfg["F"], cfg["V"], 16
expect = {"token_embd.weight": [d, V], "output_norm.weight": [d], "output.weight": [d, V]}
for i in range(cfg["L"]):
    expect.update({f"blk.{i}.attn_norm.weight": [d], f"blk.{i}.attn_q.weight": [d, 2 * hd],
                   f"blk.{i}.attn_k.weight": [d, hd], f"blk.{i}.attn_v.weight": [d, hd],
                   f"blk.{i}.attn_output.weight": [2 * hd, d], f"blk.{i}.ffn_norm.weight": [d],
                   f"blk.{i}.ffn_gate.weight": [d, F], f"blk.{i}.ffn_up.weight": [d, F],
                   f"blk.{i}.ffn_down.weight": [F, d]})
assert {n: v[0] for n, v in names.items()} == expect, sorted(set(names) ^ set(expect))
assert all(t == 0 for _, t in names.values())
print(f"GGUF: {len(kv)} keys and {len(names)} tensors as expected")
PY

# --- llama.cpp tokenizes the held-out documents as fp4train did --------------------------
# The held-out split of a text directory: documents 9, 19, ... in name order, each trimmed,
# encoded and followed by EOS (docs/data.md); `data --export` writes that stream (val.bin).
"$bin" data --config "$work/micro.toml" --export "$work/shards" > "$work/data.txt" 2>&1 \
  || { cat "$work/data.txt"; fail "data --export"; }
python3 - "$work/text" "$work/texts.json" <<'PY' || fail "held-out texts"
import json, os, sys
names = sorted(os.listdir(sys.argv[1]))
docs = [open(os.path.join(sys.argv[1], n), "rb").read().decode().strip(" \t\n\r\f\v")
        for i, n in enumerate(names) if i % 10 == 9]
json.dump({"texts": docs}, open(sys.argv[2], "w"))
PY
node "$llama/llama_tokenize.mjs" "$work/relu2/gguf/model.gguf" "$work/texts.json" "$work/tok.json" \
  > "$work/tok.txt" 2>&1 || { cat "$work/tok.txt"; fail "llama.cpp tokenize"; }
python3 - "$work/shards/val.bin" "$work/tok.json" <<'PY' || fail "llama.cpp tokenizes differently"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
header = struct.unpack_from("<256i", b, 0)
width = 2 if header[1] == 1 else 4  # llm.c: version 1 uint16, 2 uint32
ids = list(struct.unpack_from(f"<{header[2]}{'H' if width == 2 else 'I'}", b, 1024))
docs, cur = [], []
for t in ids:
    if t == 2:
        docs.append(cur); cur = []
    else:
        cur.append(t)
theirs = json.load(open(sys.argv[2]))["ids"]
assert len(docs) == len(theirs) == 4, (len(docs), len(theirs))
same = sum(a == b for a, b in zip(docs, theirs))
print(f"tokenizer: {same} of {len(docs)} held-out documents ({sum(map(len, docs))} tokens) "
      "tokenized identically by llama.cpp")
for i, (a, b) in enumerate(zip(docs, theirs)):
    if a != b:
        k = next(j for j in range(min(len(a), len(b)) + 1) if j >= min(len(a), len(b)) or a[j] != b[j])
        print(f"  document {i}: first difference at token {k}: fp4train {a[k:k + 5]}, llama.cpp {b[k:k + 5]}")
assert same == len(docs)
PY

# --- a weight read wrongly must fail the check -------------------------------------------
# corrupt SRC DST MODE: a copy of a GGUF with one plausible export bug. rope-halves: the rows of
# every attn_q / attn_k head in HF's rotate-half order instead of adjacent pairs; gate-up: the
# SwiGLU halves of up_proj swapped (ffn_gate <-> ffn_up); ssm-a-log: the Mamba-2 A_log written
# where llama.cpp takes A = -exp(A_log); scale-plus-one: every FP4 block scale one code up;
# nibbles-swapped: the two E2M1 codes of every FP4 byte exchanged; scale2-inverted: every
# NVFP4 tensor scale written as its reciprocal.
corrupt() {
  python3 - "$@" "$lib" <<'PY'
import math, struct, sys
src, dst, mode, lib = sys.argv[1:]
sys.path.insert(0, lib)
import gguf_read
b = bytearray(open(src, "rb").read())
_, tensors_, data = gguf_read.read(b)
info = {n: (ne, off) for n, (ne, t, off) in tensors_.items()}
types = {n: t for n, (ne, t, off) in tensors_.items()}
def rows(name):
    ne, off = info[name]
    w = ne[0] * 4
    return [bytes(b[data + off + r * w:data + off + (r + 1) * w]) for r in range(ne[1])], data + off
def put(at, rs):
    b[at:at + sum(map(len, rs))] = b"".join(rs)
hd = 16
for name in info:
    if mode == "rope-halves" and (name.endswith("attn_q.weight") or name.endswith("attn_k.weight")):
        rs, at = rows(name)
        out = []
        for h in range(len(rs) // hd):
            head = rs[h * hd:(h + 1) * hd]
            out += head[0::2] + head[1::2]  # row j <- pair j (j < hd/2), else the pairs' second rows
        put(at, out)
    if mode == "gate-up" and name.endswith("ffn_gate.weight"):
        g, ga = rows(name)
        u, ua = rows(name.replace("ffn_gate", "ffn_up"))
        put(ga, u); put(ua, g)
    # FP4 blocks: MXFP4 (type 39) 1 scale + 16 bytes per 32 values; NVFP4 (40) 4 + 32 per 64.
    if mode == "scale2-inverted" and name.endswith(".scale"):  # 1/gd (compressed-tensors' sense)
        _, off = info[name]
        struct.pack_into("<f", b, data + off, 1.0 / struct.unpack_from("<f", b, data + off)[0])
    if mode in ("scale-plus-one", "nibbles-swapped") and types[name] in (39, 40):
        ne, off = info[name]
        nsc, size = (1, 17) if types[name] == 39 else (4, 36)
        for blk in range(ne[0] * ne[1] // (32 if types[name] == 39 else 64)):
            at = data + off + blk * size
            if mode == "scale-plus-one":  # every block scale one code up
                for k in range(nsc): b[at + k] = min(b[at + k] + 1, 0x7E if types[name] == 40 else 254)
            else:  # the two elements of every byte exchanged
                for k in range(at + nsc, at + size): b[k] = (b[k] >> 4) | ((b[k] & 0xF) << 4)
    if mode == "ssm-a-log" and name.endswith("ssm_a"):
        ne, off = info[name]  # A_log written where llama.cpp takes A = -exp(A_log)
        n = ne[0] * ne[1]
        a = struct.unpack_from(f"<{n}f", b, data + off)
        struct.pack_into(f"<{n}f", b, data + off, *[math.log(-v) for v in a])
open(dst, "wb").write(b)
PY
}
# must_disagree RUN MODE: on the corrupted copy the agreement check above fails.
must_disagree() {
  local run="$work/$1" mode=$2
  corrupt "$run/gguf/model.gguf" "$work/broken-$mode.gguf" "$mode" || fail "corrupting ($mode)"
  if ! node "$llama/llama_nll.mjs" "$work/broken-$mode.gguf" "$run/windows.json" "$work/broken-$mode.json" \
    > "$work/broken.txt" 2>&1; then
    # A non-finite distribution (llama_nll finds no probability for a token) fails the check too.
    grep -q "no probability for token" "$work/broken.txt" || { cat "$work/broken.txt"; fail "llama.cpp on the broken copy ($mode)"; }
    echo "$mode: llama.cpp's output is not finite ($(cat "$work/broken.txt"))"
    return
  fi
  python3 - "$run/eval.json" "$work/broken-$mode.json" "$mode" <<'PY' || fail "$mode went unnoticed"
import json, sys
policy, ours = next(iter(json.load(open(sys.argv[1]))["results"].items()))
theirs = json.load(open(sys.argv[2]))
rel = lambda a, b: abs(a - b) / abs(a)
worst = max(rel(a, b) for a, b in zip(ours["window_nll"], theirs["window_nll"]))
mean = rel(ours["nats_per_token"], theirs["nats_per_token"])
print(f"{sys.argv[3]}: fp4train {ours['nats_per_token']:.6f}, llama.cpp {theirs['nats_per_token']:.6f}; "
      f"relative {mean:.2e}, worst window {worst:.2e}")
window_tol = 1e-4 if policy == "none" else 5e-4
assert mean > 1e-4 or worst > window_tol  # the agreement check above would fail
PY
}
must_disagree swiglu gate-up
must_disagree relu2 rope-halves
must_disagree hybrid ssm-a-log
must_disagree mxfp4 scale-plus-one
must_disagree mxfp4 nibbles-swapped
must_disagree nvfp4 scale2-inverted
must_disagree nvfp4 nibbles-swapped
echo "llama_cpp: ok"
