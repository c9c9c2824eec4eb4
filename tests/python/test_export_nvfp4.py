"""`fp4train export --format nvfp4-safetensors` (docs/export.md "NVFP4 safetensors for vLLM and
TensorRT-LLM"), read back with the published field definitions and nothing of the exporter:

* ModelOpt's Hugging Face checkpoint: `weight` uint8 [N, K/2] (two E2M1 codes a byte, the even
  column in the low nibble), `weight_scale` float8_e4m3fn [N, K/16], `weight_scale_2` FP32 (the
  decode scale), `input_scale` FP32, hf_quant_config.json {"quantization": {"quant_algo":
  "NVFP4", "group_size": 16, "exclude_modules": [...]}};
* compressed-tensors' "nvfp4-pack-quantized": `weight_packed`, `weight_scale`,
  `weight_global_scale` = 1 / weight_scale_2, `input_global_scale`.

No engine that reads these files runs here (vLLM and TensorRT-LLM need a GPU), so the check is
against those definitions: every FP4 linear, decoded with an E2M1 table and an E4M3 decoder
written here, must give fp4train's own quantized weight (fp4train.quantize of the checkpoint's
FP32 parameter) bit for bit, row by row through the HF row order (found by matching the FP32
export's rows, not from the exporter). Decoding with the nibbles swapped or one scale code off
must fail the same comparison: the check can see those mistakes.
"""
import json
import struct

import numpy as np
import pytest

import fp4train as fp
from conftest import micro_config, run_cli

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def e2m1(codes):
    """E2M1 codes (sign in bit 3) as float32 values."""
    v = E2M1[codes & 7]
    return np.where(codes & 8, -v, v).astype(np.float32)


def e4m3(codes):
    """OCP float8_e4m3fn bytes as float32 (bias 7, subnormals below exponent 1; no NaN here)."""
    c = codes.astype(np.int64)
    e, m = (c >> 3) & 0xF, c & 7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.where(c & 0x80, -mag, mag).astype(np.float32)


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    data = b[8 + n:]
    dt = {"F32": np.float32, "U8": np.uint8, "F8_E4M3": np.uint8}
    out = {}
    for name, i in h.items():
        s, e = i["data_offsets"]
        out[name] = (i["dtype"], np.frombuffer(data[s:e], dtype=dt[i["dtype"]]).reshape(i["shape"]))
    return out, meta


def decode(packed, scales, gd, swap_nibbles=False):
    """The weight of one NVFP4 linear: q · (c_b · gd), fp4train's order (docs/numerics.md
    "Quantizing one operand"), from the packed bytes and scale codes."""
    lo, hi = packed & 0xF, packed >> 4
    if swap_nibbles:
        lo, hi = hi, lo
    q = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.float32)
    q[:, 0::2], q[:, 1::2] = e2m1(lo), e2m1(hi)
    d = (e4m3(scales) * np.float32(gd)).astype(np.float32)
    return (q * np.repeat(d, 16, axis=1)).astype(np.float32)


def source_rows(hf_rows, param):
    """The row of `param` each row of the FP32 export is (rows of a random init are distinct)."""
    index = {r.tobytes(): i for i, r in enumerate(param)}
    return np.array([index[r.tobytes()] for r in hf_rows])


def nvfp4_quantized(param, target=448.0):
    """fp4train's NVFP4 weight: E4M3 scales over 16 x 16 tiles, T = 448, RNE."""
    return fp.quantize(np.ascontiguousarray(param, dtype=np.float32), scale_format="e4m3", block=16,
                       two_d=True, target=target).dequantize()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two micro SwiGLU runs with RoPE: nvfp4-d50 (held references) and ue5m3-b16."""
    work = tmp_path_factory.mktemp("nvfp4")
    cfg = micro_config(work, 4)
    cfg.write_text(cfg.read_text().replace("mlp_hidden = 64\n", "mlp_hidden = 64\nmlp = \"swiglu\"\n"))
    for recipe in ("nvfp4-d50", "ue5m3-b16", "nvfp4-all"):
        run_cli(["train", "--config", cfg, "--recipe", recipe, "--out", work / recipe, "--quiet",
                 "--peak-gflops", "1"])
    run_cli(["export", "--checkpoint", work / "nvfp4-d50", "--out", work / "hf"])
    return work


def check_linears(out_dir, hf_dir, run_dir, convention, swap_nibbles=False, scale_off=False):
    """Every FP4 linear of the export against fp4train.quantize; returns how many were checked."""
    ct = convention == "compressed-tensors"
    t, meta = read_safetensors(out_dir / "model.safetensors")
    f32, _ = read_safetensors(hf_dir / "model.safetensors")
    ck = fp.load_checkpoint(str(run_dir))
    names = json.load(open(hf_dir / "config.json"))["fp4train"]["names"]
    held = {r["linear"]: r["held"] for r in ck.references if r["role"] == 0}
    checked = 0
    for name, source in names.items():
        base = name[:-len(".weight")]
        key = base + (".weight_packed" if ct else ".weight")
        if key not in t or t[key][0] != "U8":
            continue
        packed, scales = t[key][1], t[base + ".weight_scale"][1].copy()
        assert t[base + ".weight_scale"][0] == "F8_E4M3"
        if ct:
            ge = t[base + ".weight_global_scale"][1].reshape(-1)[0]
            gd = np.float32(1) / ge
            g_in = np.float32(1) / t[base + ".input_global_scale"][1].reshape(-1)[0]
        else:
            gd = t[base + ".weight_scale_2"][1].reshape(-1)[0]
            g_in = t[base + ".input_scale"][1].reshape(-1)[0]
        if scale_off:
            scales[0, 0] += 1
        param = ck.params[source]
        rows = source_rows(f32[name][1], param)
        want = nvfp4_quantized(param)[rows]
        got = decode(packed, scales, gd, swap_nibbles)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{name}: weight differs"
        # The input scale: the activation's decode scale at the held reference g, 1 / ((448·6)/g).
        g = np.float32(held[source])
        assert g_in == np.float32(1) / (np.float32(448 * 6) / g), f"{name}: input scale"
        checked += 1
    return checked, meta


def test_modelopt_export_decodes_to_the_trained_weights(runs):
    out = runs / "mo"
    p = run_cli(["export", "--checkpoint", runs / "nvfp4-d50", "--out", out, "--format", "nvfp4-safetensors"])
    assert "7 NVFP4 linears" in p.stdout, p.stdout
    checked, meta = check_linears(out, runs / "hf", runs / "nvfp4-d50", "modelopt")
    assert checked == 7  # q, k, v, o, gate, up, down
    assert meta["fp4train_input_scale"] == "held reference of step 4"
    hq = json.load(open(out / "hf_quant_config.json"))["quantization"]
    assert hq["quant_algo"] == "NVFP4" and hq["group_size"] == 16
    assert hq["exclude_modules"] == ["lm_head"]
    assert (out / "tokenizer.model").exists()
    assert "quantization_config" not in json.load(open(out / "config.json"))


def test_compressed_tensors_convention_is_the_reciprocal(runs):
    mo, ct = runs / "mo2", runs / "ct"
    run_cli(["export", "--checkpoint", runs / "nvfp4-d50", "--out", mo, "--format", "nvfp4-safetensors"])
    run_cli(["export", "--checkpoint", runs / "nvfp4-d50", "--out", ct, "--format", "nvfp4-safetensors",
             "--convention", "compressed-tensors"])
    checked, _ = check_linears(ct, runs / "hf", runs / "nvfp4-d50", "compressed-tensors")
    assert checked == 7
    a, _ = read_safetensors(mo / "model.safetensors")
    b, _ = read_safetensors(ct / "model.safetensors")
    base = "model.layers.0.self_attn.q_proj"
    assert np.array_equal(a[base + ".weight"][1], b[base + ".weight_packed"][1])
    # weight_scale_2 = fl(1 / weight_global_scale): fp4train's gd = fl(1 / ge).
    assert a[base + ".weight_scale_2"][1].reshape(-1)[0] == np.float32(1) / b[base + ".weight_global_scale"][1][0]
    q = json.load(open(ct / "config.json"))["quantization_config"]
    assert q["format"] == "nvfp4-pack-quantized" and q["ignore"] == ["lm_head"]
    assert q["config_groups"]["group_0"]["weights"]["group_size"] == 16
    assert not (ct / "hf_quant_config.json").exists()
    # Over an earlier ModelOpt export: its hf_quant_config.json is not left behind.
    run_cli(["export", "--checkpoint", runs / "nvfp4-d50", "--out", mo, "--format", "nvfp4-safetensors",
             "--convention", "compressed-tensors"])
    assert not (mo / "hf_quant_config.json").exists()


@pytest.mark.parametrize("mistake", ["swap_nibbles", "scale_off"])
def test_the_check_sees_a_misread_weight(runs, mistake):
    out = runs / ("mo_" + mistake)
    run_cli(["export", "--checkpoint", runs / "nvfp4-d50", "--out", out, "--format", "nvfp4-safetensors"])
    with pytest.raises(AssertionError, match="weight differs"):
        check_linears(out, runs / "hf", runs / "nvfp4-d50", "modelopt", **{mistake: True})


def test_ue5m3_run_is_refused_unless_requantized(runs):
    out = runs / "ue"
    p = run_cli(["export", "--checkpoint", runs / "ue5m3-b16", "--out", out, "--format", "nvfp4-safetensors"],
                check=False)
    assert p.returncode == 2 and "--requantize" in p.stderr and "ue5m3" in p.stderr, p.stderr
    assert not out.exists()
    run_cli(["export", "--checkpoint", runs / "ue5m3-b16", "--out", out, "--format", "nvfp4-safetensors",
             "--requantize"])
    t, meta = read_safetensors(out / "model.safetensors")
    assert meta["fp4train_weights"] == "re-quantized to NVFP4"
    ck = fp.load_checkpoint(str(runs / "ue5m3-b16"))
    base = "model.layers.0.mlp.down_proj"  # no row permutation: HF rows are the parameter's
    want = nvfp4_quantized(ck.params["layers.1.mixer.down_proj"])
    got = decode(t[base + ".weight"][1], t[base + ".weight_scale"][1], t[base + ".weight_scale_2"][1])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_current_scaling_run_takes_calibrated_input_scales(runs):
    out = runs / "cal"
    p = run_cli(["export", "--checkpoint", runs / "nvfp4-all", "--out", out, "--format", "nvfp4-safetensors",
                 "--input-scale", "held"], check=False)
    assert p.returncode == 2 and "--input-scale calibrated" in p.stderr, p.stderr
    run_cli(["export", "--checkpoint", runs / "nvfp4-all", "--out", out, "--format", "nvfp4-safetensors",
             "--calib-batches", "2"])
    t, meta = read_safetensors(out / "model.safetensors")
    assert meta["fp4train_input_scale"] == "calibration on 128 training tokens (2 batches)", meta
    s = t["model.layers.0.self_attn.q_proj.input_scale"][1]
    assert s.shape == () and np.isfinite(s) and s > 0


def test_options_out_of_place_are_refused(runs):
    for args, msg in ((["--convention", "compressed-tensors"], "go with --format nvfp4-safetensors"),
                      (["--calib-batches", "3"], "go with --format nvfp4-safetensors"),
                      (["--format", "nvfp4-safetensors", "--input-scale", "held", "--calib-batches", "3"],
                       "--calib-batches goes with"),
                      (["--requantize"], "--requantize goes with"),
                      (["--format", "nvfp4-safetensors", "--weights", "mxfp4"], "--weights goes with")):
        p = run_cli(["export", "--checkpoint", runs / "nvfp4-d50", "--out", runs / "x"] + args, check=False)
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)


def test_hybrid_export_decodes_to_the_trained_weights(tmp_path):
    """The Nemotron-H layout (Mamba-2 in_proj/out_proj, attention with RoPE rows, MLP)."""
    micro = micro_config(tmp_path, 3)
    data = micro.read_text().split("[data]")[1].split("[eval]")[0]
    hybrid = open(__file__.replace("test_export_nvfp4.py", "tiny_hybrid.toml")).read()
    cfg = tmp_path / "hybrid.toml"
    cfg.write_text(hybrid.replace("steps = 40", "steps = 3") + "\n[data]" + data)
    run_cli(["train", "--config", cfg, "--recipe", "nvfp4-d50", "--out", tmp_path / "run", "--quiet",
             "--peak-gflops", "1"])
    run_cli(["export", "--checkpoint", tmp_path / "run", "--out", tmp_path / "hf"])
    run_cli(["export", "--checkpoint", tmp_path / "run", "--out", tmp_path / "nv", "--format", "nvfp4-safetensors"])
    checked, _ = check_linears(tmp_path / "nv", tmp_path / "hf", tmp_path / "run", "modelopt")
    assert checked == 12  # 2 Mamba-2 blocks (in_proj, out_proj), 1 attention (q, k, v, o), 2 MLPs
