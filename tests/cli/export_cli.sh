#!/usr/bin/env bash
# `fp4train export` (HF style directory) and `fp4train eval --grad-out`: bad input named and
# refused; a micro fp32 run exported: config.json keys, model.safetensors names, shapes and
# values (against the checkpoint's params buffer, read here with plain Python), the RoPE row
# permutation of q/k; the gradient file's names, windows and loss. The numerical check of the
# export against PyTorch is tests/python/test_torch_model.py.
# Usage: export_cli.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" steps=3 warmup_steps=1 interval=100 windows=4 telemetry_interval=0

# --- bad input -------------------------------------------------------------------------
expect_error "checkpoint $work/nothing does not exist" export --checkpoint "$work/nothing" --out "$work/hf"
expect_error "--out is required" export --checkpoint "$work/nothing"
expect_error "--checkpoint is required" export --out "$work/hf"
# The help is captured first: `"$bin" ... --help | grep -q` under pipefail fails whenever grep
# exits before the program's second write (a help text over 4 KiB, e.g. eval's), a race.
help_export=$("$bin" export --help) || fail "export --help exited non-zero"
help_eval=$("$bin" eval --help) || fail "eval --help exited non-zero"
grep -q "model.embed_tokens.weight" <<<"$help_export" || fail "export --help lacks the name map"
grep -q "backbone.layers.N.mixer" <<<"$help_export" || fail "export --help lacks the Nemotron-H names"
grep -q -- "--grad-out" <<<"$help_eval" || fail "eval --help lacks --grad-out"
expect_error "--grad-windows goes with --grad-out" eval --config "$work/micro.toml" --init-seed 1 --grad-windows 2
expect_error "--grad-out $work/no/g.safetensors: directory" eval --config "$work/micro.toml" --init-seed 1 --grad-out "$work/no/g.safetensors"
expect_error "exceeds the 4 held-out windows" eval --config "$work/micro.toml" --init-seed 1 --policy none --grad-out "$work/g.safetensors" --grad-windows 5

# --- a micro fp32 run, exported ---------------------------------------------------------
"$bin" train --config "$work/micro.toml" --recipe fp32 --out "$work/run" --quiet --peak-gflops 1 \
  > "$work/train.txt" 2>&1 || { cat "$work/train.txt"; fail "train exited non-zero"; }
touch "$work/notadir"
expect_error "exists and is not a directory" export --checkpoint "$work/run" --out "$work/notadir"
"$bin" export --checkpoint "$work/run" --out "$work/hf" > "$work/export.txt" 2>&1 \
  || { cat "$work/export.txt"; fail "export exited non-zero"; }
grep -q "Llama layout" "$work/export.txt" || { cat "$work/export.txt"; fail "export summary"; }
for f in model.safetensors config.json tokenizer.model; do
  [ -s "$work/hf/$f" ] || fail "export wrote no $f"
done
"$bin" eval --checkpoint "$work/run" --policy none --grad-out "$work/grad.safetensors" --grad-windows 3 \
  > "$work/eval.txt" 2>&1 || { cat "$work/eval.txt"; fail "eval --grad-out exited non-zero"; }
ck=$(ls "$work/run/checkpoints/"step_*.safetensors | tail -1)
python3 - "$work/hf" "$ck" "$work/grad.safetensors" <<'PY' || fail "export check"
import json, struct, sys, math
hf, ck, grad = sys.argv[1:]
def st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); d = b[8 + n:]
    meta = h.pop("__metadata__", {})
    assert (8 + n) % 8 == 0
    def get(name):
        i = h[name]; s, e = i["data_offsets"]
        fmt = {"F32": "f", "I32": "i"}[i["dtype"]]
        return list(struct.unpack("<%d%s" % ((e - s) // 4, fmt), d[s:e]))
    return h, meta, get
c = json.load(open(hf + "/config.json"))
assert c["architectures"] == ["LlamaForCausalLM"] and c["model_type"] == "llama", c
assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["intermediate_size"],
        c["vocab_size"], c["max_position_embeddings"]) == (32, 2, 2, 64, 512, 32), c
assert c["hidden_act"] == "relu2" and c["fp4train"]["mlp_gated"] is False and c["tie_word_embeddings"] is False
assert c["rms_norm_eps"] == struct.unpack("<f", struct.pack("<f", 1e-5))[0]
assert c["fp4train"]["rope"] is True and c["fp4train"]["layout"] == "llama"
h, meta, get = st(hf + "/model.safetensors")
assert meta["format"] == "pt", meta
want = {"model.embed_tokens.weight": [512, 32], "model.norm.weight": [32], "lm_head.weight": [512, 32]}
for i in range(2):
    p = f"model.layers.{i}."
    want.update({p + "input_layernorm.weight": [32], p + "post_attention_layernorm.weight": [32],
                 p + "self_attn.q_proj.weight": [32, 32], p + "self_attn.k_proj.weight": [32, 32],
                 p + "self_attn.v_proj.weight": [32, 32], p + "self_attn.o_proj.weight": [32, 32],
                 p + "mlp.up_proj.weight": [64, 32], p + "mlp.down_proj.weight": [32, 64]})
assert {k: v["shape"] for k, v in h.items()} == want, sorted(h)
assert all(v["dtype"] == "F32" for v in h.values())
# Values: the checkpoint's params buffer in fp4train order (model.h): embeddings; per block
# norm, then the mixer's linears; norm_f; lm_head.
ch, cmeta, cget = st(ck)
P = cget("params")
order = [("embeddings", 512 * 32)]
for b in range(4):
    order.append((f"layers.{b}.norm", 32))
    order += ([(f"layers.{b}.mixer.{k}", 32 * 32) for k in ("q_proj", "k_proj", "v_proj", "o_proj")]
              if b % 2 == 0 else [(f"layers.{b}.mixer.up_proj", 64 * 32), (f"layers.{b}.mixer.down_proj", 32 * 64)])
order += [("norm_f", 32), ("lm_head", 512 * 32)]
off, flat = 0, {}
for name, n in order:
    flat[name] = P[off:off + n]; off += n
assert off == len(P), (off, len(P))
names = c["fp4train"]["names"]
hd = 16
for k in h:
    src = flat[names[k]]
    got = get(k)
    if k.endswith(("q_proj.weight", "k_proj.weight")):  # rows permuted within each head
        rows = [src[r * 32:(r + 1) * 32] for r in range(32)]
        perm = [2 * j if j < hd // 2 else 2 * (j - hd // 2) + 1 for j in range(hd)]
        src = [x for hh in range(2) for j in perm for x in rows[hh * hd + j]]
        assert src != flat[names[k]]
    assert [struct.pack("<f", x) for x in got] == [struct.pack("<f", x) for x in src], k
# The gradient file: same names and shapes, the first 3 windows, a finite loss near ln(512).
gh, gmeta, gget = st(grad)
assert {k: v["shape"] for k, v in gh.items() if k != "tokens"} == want
assert gh["tokens"]["shape"] == [3, 33] and gh["tokens"]["dtype"] == "I32"
assert gmeta["format"] == "fp4train.grad.v1" and gmeta["windows"] == "3", gmeta
loss = float(gmeta["loss"])
assert math.isfinite(loss) and 3 < loss < 8, loss
g = gget("lm_head.weight")
assert any(x != 0 for x in g) and all(math.isfinite(x) for x in g)
PY

# --- a micro hybrid (Mamba-2, attention, MLP), exported in the Nemotron-H layout ----------------
# config.json as nvidia's Nemotron-H configs have it: residual_in_fp32 false; time_step_limit
# [0.0, FLT_MAX] (nvidia's [0.0, Infinity] is Python's JSON dialect, not JSON: this file must
# parse as strict JSON). Everything else of the layout is checked by tests/python/test_torch_model.py.
"$bin" train --config "$work/micro.toml" --recipe fp32 --out "$work/hyb" --quiet \
  --set 'model.pattern="M-*-"' --set model.mamba_num_heads=2 --set model.mamba_head_dim=32 \
  --set model.mamba_state_size=16 --set model.mamba_chunk_size=16 --set model.rope=false \
  > "$work/hyb.txt" 2>&1 || { cat "$work/hyb.txt"; fail "hybrid train exited non-zero"; }
"$bin" export --checkpoint "$work/hyb" --out "$work/hyb_hf" > "$work/hyb_export.txt" 2>&1 \
  || { cat "$work/hyb_export.txt"; fail "hybrid export exited non-zero"; }
grep -q "Nemotron-H layout" "$work/hyb_export.txt" || { cat "$work/hyb_export.txt"; fail "hybrid export summary"; }
python3 - "$work/hyb_hf/config.json" <<'PY' || fail "Nemotron-H config.json"
import json, struct, sys
def no_constant(name):
    raise ValueError("not strict JSON: " + name)
c = json.loads(open(sys.argv[1]).read(), parse_constant=no_constant)
assert c["architectures"] == ["NemotronHForCausalLM"] and c["model_type"] == "nemotron_h", c
assert c["hybrid_override_pattern"] == "M-*-" and c["chunk_size"] == 16, c
assert c["residual_in_fp32"] is False, c["residual_in_fp32"]
flt_max = struct.unpack("<f", bytes.fromhex("ffff7f7f"))[0]  # 3.4028234663852886e+38
assert c["time_step_limit"] == [0.0, flt_max], c["time_step_limit"]
assert all(isinstance(x, float) for x in c["time_step_limit"]), c["time_step_limit"]
assert any(k.startswith("backbone.layers.0.mixer.") for k in c["fp4train"]["names"]), sorted(c["fp4train"]["names"])
PY
echo "export_cli: ok"
