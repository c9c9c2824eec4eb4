"""gemm() against `fp4train gemm --json` bit for bit, both modes, with common and per-operand
options; QTensor operands; the K-mismatch error."""
import json

import numpy as np
import pytest

import fp4train as fp
from conftest import bits, f32, run_cli, write_matrix

RNG = np.random.default_rng(7)


def cli_gemm(tmp_path, a, b, args):
    write_matrix(tmp_path / "a.txt", a)
    write_matrix(tmp_path / "b.txt", b)
    js = json.loads(run_cli(["gemm", tmp_path / "a.txt", tmp_path / "b.txt", "--json", *args]).stdout)
    return np.array([[f32(v) for v in row] for row in js["c"]], np.float32), js


CASES = [
    ("probe", "probe-matched", {}, [], {}, {}),
    ("decoded", "decoded", {}, [], {}, {}),
    ("probe-2d-sr", "probe-matched", {"rounding": "sr8", "seed": 5}, ["--rounding", "sr8", "--seed", "5", "--b-2d"],
     {}, {"two_d": True}),
    ("decoded-e4m3-ref", "decoded", {"scale_format": "e4m3"}, ["--scale-format", "e4m3", "--reference-a", "2.5",
                                                              "--b-target", "1000"],
     {"reference": 2.5}, {"target": 1000.0}),
    ("probe-mx", "probe-matched", {"scale_format": "ue8m0", "scale_rule": "mx-te", "block": 32},
     ["--scale-format", "ue8m0", "--scale-rule", "mx-te", "--block", "32"], {}, {}),
    ("probe-k100", "probe-matched", {"block": 16}, ["--a-block", "32"], {"block": 32}, {}),
    ("probe-accumulator", "probe-matched", {"chunk": 16, "accumulate": "rne", "snap": 0},
     ["--chunk", "16", "--accumulate", "rne", "--snap", "0"], {}, {}),
    ("probe-snap256", "probe-matched", {"chunk": 128, "snap": 256}, ["--chunk", "128", "--snap", "256"], {}, {}),
]


@pytest.mark.parametrize("name,mode,kw,args,ao,bo", CASES, ids=[c[0] for c in CASES])
def test_gemm_matches_cli(tmp_path, name, mode, kw, args, ao, bo):
    K = 100 if name == "probe-k100" else 96
    a = RNG.standard_normal((9, K)).astype(np.float32)
    b = (RNG.standard_normal((17, K)) * 3).astype(np.float32)
    a[0, :16] = 0.0
    a[1, 5] = -0.0
    want, js = cli_gemm(tmp_path, a, b, ["--mode", mode, *args])
    got = fp.gemm(a, b, mode, a_options=ao, b_options=bo, **kw)
    assert got.shape == (9, 17) and got.dtype == np.float32
    assert np.array_equal(bits(got), bits(want))
    if mode == "probe-matched":
        acc = {k: kw[k] for k in ("chunk", "accumulate", "snap") if k in kw}  # the GEMM's, not quantize's
        qkw = {k: v for k, v in kw.items() if k not in acc}
        qa = fp.quantize(a, sr_key={"operand": 0}, **{**qkw, **ao})
        qb = fp.quantize(b, sr_key={"operand": 1}, **{**qkw, **bo})
        assert bits(fp.probe_gemm_alpha(qa, qb)) == bits(f32(js["alpha"]))
        assert np.array_equal(bits(fp.gemm(qa, qb, mode, **acc)), bits(want))
        assert js["chunk"] == acc.get("chunk", 64) and js["accumulate"] == acc.get("accumulate", "rtz")
        assert js["snap"] == (1.0 / acc.get("snap", 1024) if acc.get("snap", 1024) else 0.0)


def test_gemm_default_mode_is_the_cli_default(tmp_path):
    a = RNG.standard_normal((4, 64)).astype(np.float32)
    b = RNG.standard_normal((5, 64)).astype(np.float32)
    want, js = cli_gemm(tmp_path, a, b, [])
    assert js["mode"] == "probe-matched"
    assert np.array_equal(bits(fp.gemm(a, b)), bits(want))


def test_loaded_qtensor_operands(tmp_path):
    a = RNG.standard_normal((8, 64)).astype(np.float32)
    b = RNG.standard_normal((8, 64)).astype(np.float32)
    qa = fp.quantize(a, sr_key={"operand": 0})
    qb = fp.quantize(b, two_d=True, sr_key={"operand": 1})
    qa.save(tmp_path / "a.st")
    qb.save(tmp_path / "b.st")
    la, lb = fp.load_qtensor(tmp_path / "a.st"), fp.load_qtensor(tmp_path / "b.st")
    for mode in ("decoded", "probe-matched"):
        assert np.array_equal(bits(fp.gemm(la, lb, mode)), bits(fp.gemm(qa, qb, mode)))


def test_gemm_errors(tmp_path):
    a = np.ones((2, 32), np.float32)
    b = np.ones((3, 16), np.float32)
    write_matrix(tmp_path / "a.txt", a)
    write_matrix(tmp_path / "b.txt", b)
    p = run_cli(["gemm", tmp_path / "a.txt", tmp_path / "b.txt"], check=False)
    assert p.returncode == 2 and "K mismatch" in p.stderr
    with pytest.raises(ValueError, match="K mismatch"):
        fp.gemm(a, b)
    with pytest.raises(ValueError, match="mode"):
        fp.gemm(a, a, "fast")
    with pytest.raises(ValueError, match="unknown key"):
        fp.gemm(a, a, a_options={"blok": 32})
    with pytest.raises(ValueError, match="E2M1|e2m1"):
        fp.gemm(fp.quantize(a, element_format="int4"), fp.quantize(a), "probe-matched")
    with pytest.raises(TypeError, match="float32"):
        fp.gemm(a.astype(np.float64), a)
