"""quantize() against `fp4train quant` bit for bit: tensor scales, block amax, block-scale codes
and values, element codes and dequantized values, on random and adversarial inputs for the
options of the CLI; QTensor.save() against `quant --save` byte for byte; load_qtensor of the
CLI's file."""
import numpy as np
import pytest

import fp4train as fp
from conftest import bits, f32, run_cli, write_matrix

RNG = np.random.default_rng(20261201)


def cli_args(kw):
    a = []
    names = {"element_format": "--element-format", "scale_format": "--scale-format",
             "scale_rule": "--scale-rule", "block": "--block", "target": "--target",
             "reference": "--reference", "rounding": "--rounding", "seed": "--seed"}
    for k, v in kw.items():
        if k == "two_d":
            if v:
                a.append("--2d")
        else:
            a += [names[k], repr(v) if isinstance(v, float) else str(v)]
    return a


def check_same(x, js, q):
    """Every number of the CLI's JSON equals the binding's, bit for bit."""
    assert (js["rows"], js["cols"]) == q.shape
    sp = js["spec"]
    assert (sp["element_format"], sp["scale_format"], sp["scale_rule"], sp["block"], sp["two_d"],
            sp["rounding"]) == (q.element_format, q.scale_format, q.scale_rule, q.block, q.two_d, q.rounding)
    assert bits(f32(sp["target"])) == bits(q.target)
    assert bits(f32(js["g"])) == bits(q.g)
    assert bits(f32(js["ge"])) == bits(q.ge)
    assert bits(f32(js["gd"])) == bits(q.gd)
    assert (js["block_rows"], js["block_cols"]) == q.scale_codes.shape
    blocks = js["blocks"]
    amax = np.array([f32(b["amax"]) for b in blocks], np.float32)
    sc = np.array([b["scale_code"] for b in blocks], np.uint8)
    scale = np.array([f32(b["scale"]) for b in blocks], np.float32)
    dscale = np.array([f32(b["decode_scale"]) for b in blocks], np.float32)
    assert np.array_equal(bits(amax), bits(q.block_amax.ravel()))
    assert np.array_equal(sc, q.scale_codes.ravel())
    assert np.array_equal(bits(scale), bits(q.scales.ravel()))
    assert np.array_equal(bits(dscale), bits(q.decode_scales.ravel()))
    codes = np.array([r["codes"] for r in js["elements"]], np.uint8)
    vals = np.array([[f32(v) for v in r["values"]] for r in js["elements"]], np.float32)
    assert np.array_equal(codes, q.codes)
    assert np.array_equal(bits(vals), bits(q.dequantize()))


def randn(r, c, scale=1.0):
    return (RNG.standard_normal((r, c)) * scale).astype(np.float32)


CASES = [
    ("default", randn(4, 32), {}),
    ("block32", randn(3, 64, 5.0), {"block": 32}),
    ("ragged", randn(3, 20), {"block": 16}),
    ("2d", randn(20, 36), {"two_d": True}),
    ("e4m3", randn(4, 48, 100.0), {"scale_format": "e4m3"}),
    ("ptx", randn(4, 32, 1e-3), {"scale_format": "ue5m3-ptx", "target": 2048.0}),
    ("mx-te", randn(4, 64, 30.0), {"scale_format": "ue8m0", "scale_rule": "mx-te", "block": 32}),
    ("mx-ocp", randn(4, 64, 30.0), {"scale_format": "ue8m0", "scale_rule": "mx-ocp", "block": 32}),
    ("sr8", randn(5, 32), {"rounding": "sr8", "seed": 7}),
    ("sr8-2d", randn(17, 33), {"rounding": "sr8", "seed": 123456789, "two_d": True}),
    ("reference", randn(3, 32), {"reference": 3.5, "target": 1000.0}),
    ("reference0", randn(2, 16), {"reference": 0.0}),
    ("int4", randn(3, 32), {"element_format": "int4", "reference": 448.0}),
    ("e2m3-ue4m3", randn(3, 32), {"element_format": "e2m3", "scale_format": "ue4m3"}),
    ("e3m2-ue6m2", randn(3, 32, 1e4), {"element_format": "e3m2", "scale_format": "ue6m2"}),
]


@pytest.mark.parametrize("name,x,kw", CASES, ids=[c[0] for c in CASES])
def test_random_matches_cli(cli_quant, name, x, kw):
    check_same(x, cli_quant(x, *cli_args(kw)), fp.quantize(x, **kw))


def adversarial():
    out = []
    z = np.zeros((2, 32), np.float32)
    z[1, :16] = -0.0
    out.append(("zeros-and-negzero", z, {}))
    sub = randn(2, 32) * np.float32(1e-39)          # FP32 subnormals
    sub[0, 0] = np.float32(1.4e-45)
    out.append(("subnormals", sub.astype(np.float32), {}))
    out.append(("subnormals-mx", sub.astype(np.float32), {"scale_format": "ue8m0", "scale_rule": "mx-te"}))
    mixed = randn(2, 32)
    mixed[0, :16] = 0.0                              # a zero block next to others
    mixed[1, 3] = -0.0
    mixed[1, 4] = np.float32(-1e-30)                 # rounds to -0
    out.append(("zero-block", mixed, {}))
    lim = np.zeros((3, 16), np.float32)
    lim[0, :] = np.linspace(-6, 6, 16, dtype=np.float32)  # amax 6 = E2M1 max
    lim[1, :] = 61440.0 * np.float32(6 / 448)        # block scale exactly UE5M3 max
    lim[1, 0] = -lim[1, 0]
    lim[2, :] = np.float32(448.0)                    # amax = T
    out.append(("limits", lim, {}))
    out.append(("limits-ref", lim, {"reference": 448.0}))   # c_b = a_b exactly
    out.append(("saturated-scale", lim, {"reference": 1e-3}))  # c_b clips at scale max
    huge = randn(2, 32, 1e37)
    huge[0, 0] = np.float32(3.4e38)
    out.append(("huge", huge, {}))
    out.append(("huge-ocp", huge, {"scale_format": "ue8m0", "scale_rule": "mx-ocp", "block": 32}))
    ties = np.array([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0] * 2], np.float32)
    out.append(("ties", ties, {"reference": 448.0 * 6 / 6}))
    out.append(("ties-sr", ties, {"reference": 448.0, "rounding": "sr8", "seed": 3}))
    out.append(("ties-rna", ties, {"reference": 448.0, "rounding": "rna"}))
    tiny_g = randn(2, 16, 1e-30)
    out.append(("tiny-reference", tiny_g, {"reference": 1e-38}))
    return out


@pytest.mark.parametrize("name,x,kw", adversarial(), ids=[c[0] for c in adversarial()])
def test_adversarial_matches_cli(cli_quant, name, x, kw):
    check_same(x, cli_quant(x, *cli_args(kw)), fp.quantize(x, **kw))


def test_hand_computed_block():
    # docs/numerics.md with g = 448, T = 448: ge = (448*6)/448 = 6, c_b = a_b * (6 * fl(1/6)),
    # for a_b = 6: c_b = 6*fl(6*fl(1/6)) rounds to 6 in UE5M3; d_b = 6/6 = 1; x_hat = q.
    x = np.array([[6, -3, 1.5, 0.5, -0.0, 0.25, 2.5, 5] + [0] * 8], np.float32)
    q = fp.quantize(x, reference=448.0)
    assert q.ge == 6.0 and q.scales[0, 0] == 6.0
    assert q.codes[0, :8].tolist() == [0x7, 0xD, 0x3, 0x1, 0x8, 0x0, 0x4, 0x6]
    assert bits(q.dequantize()[0, :8]).tolist() == bits(np.array([6, -3, 1.5, 0.5, -0.0, 0, 2, 4], np.float32)).tolist()


def test_save_matches_cli_file(tmp_path):
    for kw in ({}, {"two_d": True, "scale_format": "e4m3"}, {"rounding": "sr8", "seed": 9},
               {"scale_format": "ue8m0", "scale_rule": "mx-te", "block": 32}):
        x = randn(32, 64)
        path = tmp_path / "x.txt"
        write_matrix(path, x)
        run_cli(["quant", path, "--save", tmp_path / "cli.safetensors", *cli_args(kw)])
        q = fp.quantize(x, **kw)
        q.save(tmp_path / "py.safetensors", facts={"source": "fp4train quant"})
        assert (tmp_path / "py.safetensors").read_bytes() == (tmp_path / "cli.safetensors").read_bytes(), kw
        t = fp.load_qtensor(tmp_path / "cli.safetensors")
        assert t.block_amax is None
        assert np.array_equal(t.codes, q.codes) and np.array_equal(t.scale_codes, q.scale_codes)
        assert np.array_equal(bits(t.scales), bits(q.scales))
        assert bits(t.gd) == bits(q.gd) and t.facts["source"] == "fp4train quant"
        assert (t.rounding, t.block, t.two_d, t.scale_format, t.scale_rule) == \
            (q.rounding, q.block, q.two_d, q.scale_format, q.scale_rule)
        assert np.array_equal(bits(t.dequantize()), bits(q.dequantize()))


def test_save_refuses_unpackable(tmp_path):
    q = fp.quantize(randn(2, 16), element_format="int4")
    with pytest.raises(ValueError, match="int4"):
        q.save(tmp_path / "x.safetensors")
    with pytest.raises(fp.UserError, match="nope.safetensors"):
        fp.load_qtensor(tmp_path / "nope.safetensors")


def test_mx_te_overflow_refused_like_cli(tmp_path):
    # docs/formats.md "`mx-te` and `mx-ocp` (MXFP4)", "Edge: overflow near FLT_MAX": an error,
    # not +-Inf.
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = np.float32(3.4e38)
    kw = {"scale_format": "ue8m0", "scale_rule": "mx-te", "block": 32}
    write_matrix(tmp_path / "x.txt", x)
    p = run_cli(["quant", tmp_path / "x.txt", *cli_args(kw)], check=False)
    assert p.returncode == 2
    with pytest.raises(ValueError) as e:
        fp.quantize(x, **kw)
    # the same message as the CLI's (which prefixes it with the program name)
    assert str(e.value).split(": ", 1)[1] in p.stderr
    q = fp.quantize(x, check_finite=False, **kw)
    assert np.isinf(q.dequantize()[0, 0])
