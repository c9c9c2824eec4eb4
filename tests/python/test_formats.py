"""Formats: decode of every code of every named format against the decoding formula and the
table of docs/formats.md (computed here by hand), encode round trips and hand-computed
rounding cases (RNE ties, SR8 thresholds, saturation, signed zero), and the argument errors."""
import math

import numpy as np
import pytest

import fp4train as fp
from conftest import bits

# docs/formats.md "Named formats": sign, E, M, bias, max finite, max code, reserved codes.
TABLE = {
    "e2m1": (True, 2, 1, 1, 6.0, 0x7, 0),
    "e1m2": (True, 1, 2, 1, 1.75, 0x7, 0),
    "e3m0": (True, 3, 0, 3, 16.0, 0x7, 0),
    "e2m3": (True, 2, 3, 1, 7.5, 0x1F, 0),
    "e3m2": (True, 3, 2, 3, 28.0, 0x1F, 0),
    "e4m3": (True, 4, 3, 7, 448.0, 0x7E, 1),
    "e5m2": (True, 5, 2, 15, 57344.0, 0x7B, 4),
    "ue4m3": (False, 4, 3, 7, 448.0, 0x7E, 1),
    "ue5m3": (False, 5, 3, 15, 61440.0, 0xF7, 8),
    "ue5m3-ptx": (False, 5, 3, 15, 114688.0, 0xFE, 1),
    "ue8m0": (False, 8, 0, 127, 2.0 ** 127, 0xFE, 1),
}


def hand_decode(mag, E, M, bias, subnormals=True):
    """docs/formats.md "The descriptor": f = 0 (with subnormals): m * 2^(1-bias-M), else
    (1 + m/2^M) * 2^(f-bias); UE8M0 (no subnormals) field 0 is 2^-127."""
    f, m = mag >> M, mag & ((1 << M) - 1)
    if f == 0 and subnormals:
        return m * 2.0 ** (1 - bias - M)
    return (1 + m / 2 ** M) * 2.0 ** (f - bias)


def test_named_formats_are_the_table():
    assert fp.named_formats() == list(TABLE)


@pytest.mark.parametrize("name", list(TABLE))
def test_decode_every_code(name):
    sign, E, M, bias, vmax, cmax, reserved = TABLE[name]
    info = fp.format_info(name)
    assert (info["signed"], info["exp_bits"], info["frac_bits"], info["bias"]) == (sign, E, M, bias)
    assert info["max_finite"] == vmax and info["max_code"] == cmax
    nbits = int(sign) + E + M
    sub = name != "ue8m0"
    valid = []
    for code in range(1 << nbits):
        mag = code & ((1 << (E + M)) - 1)
        neg = sign and code >> (E + M)
        if mag > cmax:
            with pytest.raises(ValueError):
                fp.decode(np.array([code], np.uint8), name)
            continue
        want = hand_decode(mag, E, M, bias, sub)
        want = -want if neg else want
        valid.append((code, want))
    codes = np.array([c for c, _ in valid], np.uint8)
    got = fp.decode(codes, name)
    want = np.array([w for _, w in valid], np.float32)
    assert np.array_equal(bits(got), bits(want)), name
    # encode of a decoded value gives the code back (signed zero included)
    assert np.array_equal(fp.encode(got, name), codes), name
    # the code above the format's width is refused
    if nbits < 8:
        with pytest.raises(ValueError, match="codes.flat"):
            fp.decode(np.array([1 << nbits], np.uint8), name)
    assert fp.decode(np.array([cmax], np.uint8), name)[0] == np.float32(vmax)


def test_e2m1_rne_hand_cases():
    # E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}; ties to the even significand (docs/numerics.md).
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 1e30, np.inf, -0.0, -0.1, -5.0,
                  1e-45, 0.2500001], np.float32)
    want = [0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0x7, 0x7, 0x8, 0x8, 0xE, 0x0, 0x1]
    assert fp.encode(x, "e2m1").tolist() == want
    assert bits(fp.round_to(x, "e2m1"))[10] == 0x80000000  # -0.0 stays -0


def test_e2m1_rna_hand_cases():
    # Round to nearest, ties away from zero (Quartet II's forward; docs/numerics.md).
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.0, -0.1, -5.0, -0.25,
                  np.nextafter(np.float32(0.25), np.float32(0)), 0.25 - 2.0 ** -26], np.float32)
    want = [0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x7, 0x8, 0x8, 0xF, 0x9, 0x0, 0x0]
    assert fp.encode(x, "e2m1", "rna").tolist() == want


def test_e2m1_sr8_threshold():
    # 0.75 = 1.5 units of 0.5: delta = 0.5, up iff 0.5 + (2r+1)/512 >= 1 iff r >= 128.
    x = np.full(4, 0.75, np.float32)
    r = np.array([0, 127, 128, 255], np.uint8)
    assert fp.encode(x, "e2m1", "sr8", r).tolist() == [1, 1, 2, 2]
    # 5 between 4 and 6: delta = 0.5 in units of 2 -> same threshold
    assert fp.encode(np.full(2, 5.0, np.float32), "e2m1", "sr8", np.array([127, 128], np.uint8)).tolist() == [6, 7]


def test_ue8m0_and_unsigned():
    # UE8M0: powers of two, RNE tie 1.5*2^k rounds up (docs/formats.md), no zero.
    assert fp.encode(np.array([1.0, 1.5, 2.0 ** -127, 3.0], np.float32), "ue8m0").tolist() == [127, 128, 0, 129]
    with pytest.raises(ValueError, match=r"x.flat\[0\]"):
        fp.encode(np.array([0.0], np.float32), "ue8m0")
    with pytest.raises(ValueError, match=r"x.flat\[1\]"):
        fp.encode(np.array([1.0, -1.0], np.float32), "ue5m3")
    # UE5M3 saturates at 61440 (0xF7); the PTX convention at 114688 (0xFE)
    assert fp.encode(np.array([1e6], np.float32), "ue5m3").tolist() == [0xF7]
    assert fp.encode(np.array([1e6], np.float32), "ue5m3-ptx").tolist() == [0xFE]
    # UE5M3 min subnormal 2^-17; half of it ties to 0 (even)
    assert fp.encode(np.array([2.0 ** -17, 2.0 ** -18], np.float32), "ue5m3").tolist() == [1, 0]


def test_spelled_and_integer_formats():
    i = fp.format_info("ue6m2")
    assert i["bias"] == 31 and i["max_finite"] == 1.75 * 2.0 ** 32
    # int4: two's complement nibble, -8..7, saturating at +7 / -8, no -0
    x = np.array([7.6, -7.6, -8.4, 2.5, 3.5, -0.0, -0.4], np.float32)
    assert fp.encode(x, "int4").tolist() == [7, 8, 8, 2, 4, 0, 0]
    assert fp.decode(np.array([8, 15, 7], np.uint8), "int4").tolist() == [-8.0, -1.0, 7.0]
    with pytest.raises(ValueError):
        fp.decode(np.array([8], np.uint8), "int4-sym")  # -8 is not on the symmetric grid
    assert fp.encode(np.array([-9.0], np.float32), "int4-sym").tolist() == [9]  # -7


def test_format_errors():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="fp8"):
        fp.encode(x, "fp8")
    with pytest.raises(ValueError, match="e0m3"):
        fp.format_info("e0m3")
    with pytest.raises(TypeError, match="float32"):
        fp.encode(np.ones(4), "e2m1")          # float64
    with pytest.raises(TypeError, match="ndarray"):
        fp.encode([1.0, 2.0], "e2m1")          # a list
    with pytest.raises(TypeError, match="uint8"):
        fp.decode(np.ones(4, np.int32), "e2m1")
    with pytest.raises(ValueError, match="C-contiguous"):
        fp.encode(np.ones((4, 4), np.float32)[:, ::2], "e2m1")
    with pytest.raises(ValueError, match=r"x.flat\[2\].*NaN|NaN.*"):
        fp.encode(np.array([1, 2, np.nan], np.float32), "e2m1")
    with pytest.raises(ValueError, match="sr8"):
        fp.encode(x, "e2m1", "sr8")
    with pytest.raises(ValueError, match="rounding"):
        fp.encode(x, "e2m1", "rtz")
    with pytest.raises(ValueError, match="shape"):
        fp.encode(x, "e2m1", "sr8", np.zeros(3, np.uint8))


def test_sr_bytes_are_the_quantizer_stream():
    # With g = T = 448 and every block amax 6: ge = 6, c_b = 6*fl(6*fl(1/6)) = 6, d_b = 1
    # (docs/numerics.md "Quantizing one operand"), so element i is x_i rounded by SR8 with
    # byte i of the key (seed, step 1, layer 0, operand 2, gemm 0): the CLI's key.
    rng = np.random.default_rng(5)
    x = rng.uniform(-5.9, 5.9, (3, 32)).astype(np.float32)
    x[:, ::16] = 6.0
    q = fp.quantize(x, reference=448.0, rounding="sr8", seed=42)
    assert (q.scales == 6.0).all() and (q.decode_scales == 1.0).all()
    r = fp.sr_bytes(42, 1, 0, 2, 0, 0, 0, x.size).reshape(x.shape)
    assert np.array_equal(q.codes, fp.encode(x, "e2m1", "sr8", r))
    assert not np.array_equal(q.codes, fp.encode(x, "e2m1"))  # SR changed some codes
    a = fp.sr_bytes(1, 1, 0, 2, 0, 0, 0, 64)
    assert np.array_equal(a[16:], fp.sr_bytes(1, 1, 0, 2, 0, 0, 16, 48))
    assert not np.array_equal(a, fp.sr_bytes(2, 1, 0, 2, 0, 0, 0, 64))
