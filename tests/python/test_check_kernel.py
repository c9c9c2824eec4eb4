"""examples/check_kernel.py: fed fp4train's own output it reports nothing; with planted
mismatches of each class (chosen here, so the expected counts are known) it counts exactly
those, class by class."""
import importlib.util
import os

import numpy as np
import pytest

from conftest import SRC

spec = importlib.util.spec_from_file_location("check_kernel", os.path.join(SRC, "examples", "check_kernel.py"))
ck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ck)
import fp4train as fp  # noqa: E402

OPTS = {"scale_format": "e4m3", "block": 16}


def data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    x[0, :16] = 0.0                         # zero block (0, 0)
    x[5, 16:32] = -0.0                      # zero block (5, 1), negative zeros
    x[1, 0:4] = np.float32(-1e-6)           # four values rounding to -0
    q = fp.quantize(x, **OPTS)
    return x, q.codes.copy(), q.scale_codes.copy(), q.dequantize()


def test_clean_output_passes():
    x, codes, sc, xhat = data()
    r = ck.check(x, codes=codes, scale_codes=sc, xhat=xhat, **OPTS)
    assert r.ok and all(v == 0 for v in r.counts.values()), str(r)
    assert "PASS: bit-identical" in str(r)


def test_each_class_counted():
    x, codes, sc, xhat = data()
    assert (codes[1, 0:4] == 0x8).all()     # fp4train keeps -0 there
    sc[0, 0] = 0x00                         # zero block scale: floor(log2 0) clamped
    sc[5, 1] = 0x01
    sc[2, 1] ^= 0x01                        # two wrong scales of nonzero blocks
    sc[3, 3] ^= 0x08
    for c in (5, 6, 40):                    # three wrong element magnitudes
        codes[4, c] = (codes[4, c] & 0x8) | ((codes[4, c] & 0x7) ^ 0x1)
    codes[1, 0:3] = 0x0                     # three -0 codes written as +0
    xhat[1, 3] = 0.0                        # one -0 decoded as +0 (its code kept)
    xhat[2, 2] = np.nextafter(xhat[2, 2], np.float32(np.inf))   # two decodes off by one ulp
    xhat[3, 60] = -xhat[3, 60] if xhat[3, 60] != 0 else np.float32(1.0)
    r = ck.check(x, codes=codes, scale_codes=sc, xhat=xhat, **OPTS)
    assert r.counts == {"scale code": 2, "zero block": 2, "element code": 3,
                        "sign of zero": 4, "value": 2}, str(r)
    assert not r.ok and "FAIL" in str(r)
    assert r.examples["element code"][0][0].startswith("[4, 5]")


def test_only_zero_blocks_is_a_pass():
    x, codes, sc, xhat = data()
    sc[0, 0] = 0x00
    r = ck.check(x, scale_codes=sc, **OPTS)
    assert r.ok and r.counts["zero block"] == 1 and "harmless" in str(r)


def test_partial_and_errors():
    x, codes, sc, xhat = data()
    r = ck.check(x, codes=codes, **OPTS)
    assert r.compared == ["element codes"] and r.ok
    with pytest.raises(ValueError, match="shape"):
        ck.check(x, codes=codes[:, :32], **OPTS)
    with pytest.raises(TypeError, match="uint8"):
        ck.check(x, codes=codes.astype(np.int32), **OPTS)


def test_unpack_e2m1_and_mxfp4():
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    kw = {"scale_format": "ue8m0", "scale_rule": "mx-ocp", "block": 32}
    q = fp.quantize(x, **kw)
    flat = q.codes.ravel()
    packed = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    codes = ck.unpack_e2m1(packed, flat.size).reshape(q.shape)
    r = ck.check(x, codes=codes, scale_codes=q.scale_codes, xhat=q.dequantize(), **kw)
    assert r.ok and r.counts["zero block"] == 0


def test_demo_runs(capsys):
    r = ck.demo()
    assert r.counts == {"scale code": 1, "zero block": 1, "element code": 1, "sign of zero": 1, "value": 1}
    assert "FAIL" in capsys.readouterr().out
