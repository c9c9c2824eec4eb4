"""fp4train.accumulate_partials and fp4train.chunked_dot (the probe-matched GEMM's accumulator,
docs/gemm.md "The accumulator"): hand-computed values, BF16 bit patterns, and bad input."""
import numpy as np
import pytest

import fp4train as fp

ULP1 = np.float32(2.0 ** -23)  # ulp of 1.0


def test_partials_rtz_rne_and_snap_by_hand():
    # Row 0: 0.5 + 0.5 + 0.75 ulp: RTZ -> 1, RNE -> 1 + ulp; row 1: the negative of it.
    p = np.array([[0.5, 0.5, 0.75 * ULP1], [-0.5, -0.5, -0.75 * ULP1]], np.float32)
    assert fp.accumulate_partials(p, "rtz", 0).tolist() == [1.0, -1.0]
    assert fp.accumulate_partials(p, "rne", 0).tolist() == [1.0 + ULP1, -(1.0 + ULP1)]
    assert fp.accumulate_partials(p, "rne", 1024).tolist() == [1.0, -1.0]  # snapped back to 1
    # The snap ties to even: 2.5/1024 -> 2/1024, 3.5/1024 -> 4/1024; d = 0 keeps them.
    q = np.array([[2.5 / 1024], [3.5 / 1024], [-2.5 / 1024]], np.float32)
    assert fp.accumulate_partials(q).tolist() == [2 / 1024, 4 / 1024, -2 / 1024]
    assert fp.accumulate_partials(q, snap=0).tolist() == [2.5 / 1024, 3.5 / 1024, -2.5 / 1024]


def test_chunked_dot_chunk_decides_and_bf16_bits_agree():
    # x[0] = 1, x[16] = 0.75 ulp, w = 1: chunk 16 gives partials 1 and 0.75 ulp (RTZ sum 1);
    # chunk 32 rounds the exact 1 + 0.75 ulp once, to 1 + ulp. No snap.
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 16] = 1.0, 0.75 * ULP1
    w = np.ones((1, 32), np.float32)
    assert fp.chunked_dot(x, w, 16, "rtz", 0)[0] == 1.0
    assert fp.chunked_dot(x, w, 32, "rtz", 0)[0] == np.float32(1.0) + ULP1
    # BF16 operands as uint16 bit patterns give the same as their float32 values.
    rng = np.random.default_rng(3)
    xf = rng.standard_normal((8, 200)).astype(np.float32)
    wf = rng.standard_normal((8, 200)).astype(np.float32)
    xb = (xf.view(np.uint32) >> 16).astype(np.uint16)  # truncated to BF16: exact values below
    wb = (wf.view(np.uint32) >> 16).astype(np.uint16)
    xv = (xb.astype(np.uint32) << 16).view(np.float32)
    wv = (wb.astype(np.uint32) << 16).view(np.float32)
    for chunk in (16, 32, 64, 128):
        got = fp.chunked_dot(xb, wb, chunk)
        assert got.dtype == np.float32 and got.shape == (8,)
        assert np.array_equal(got.view(np.uint32), fp.chunked_dot(xv, wv, chunk).view(np.uint32))
        # Within the rounding bound of the float64 dot product (snap 1/1024 dominates).
        assert np.all(np.abs(got - (xv.astype(np.float64) * wv).sum(1)) <= 1e-3)


def test_bad_input_is_named():
    w = np.ones((2, 4), np.float32)
    x = w.copy()
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match="row 1, element 2 is not finite"):
        fp.chunked_dot(x, w)
    with pytest.raises(ValueError, match="chunk: expected 16, 32, 64 or 128"):
        fp.chunked_dot(w, w, chunk=8)
    with pytest.raises(ValueError, match="snap: expected 0"):
        fp.accumulate_partials(w, snap=1000)
    with pytest.raises(ValueError, match='accumulate: expected "rne" or "rtz"'):
        fp.accumulate_partials(w, accumulate="rz")
    with pytest.raises(ValueError, match="same shape"):
        fp.chunked_dot(w, np.ones((2, 5), np.float32))
    with pytest.raises(TypeError, match="both be float32, or both uint16"):
        fp.chunked_dot(w, w.view(np.uint16)[:, :4].copy())
    with pytest.raises(TypeError, match="dtype float32"):
        fp.accumulate_partials(w.astype(np.float64))
    with pytest.raises(ValueError, match="decoded"):
        fp.gemm(w, w, "decoded", snap=0)


def test_chunk_partials_then_accumulate_is_chunked_dot():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 300)).astype(np.float32)
    w = (rng.standard_normal((16, 300)) * 1e-3).astype(np.float32)
    for chunk in (16, 64, 128):
        p = fp.chunk_partials(x, w, chunk)
        assert p.shape == (16, -(-300 // chunk)) and p.dtype == np.float32
        for acc in ("rtz", "rne"):
            for d in (0, 1024):
                assert np.array_equal(fp.accumulate_partials(p, acc, d).view(np.uint32),
                                      fp.chunked_dot(x, w, chunk, acc, d).view(np.uint32))
    # Each partial is its chunk's exact sum rounded once: within half an FP32 ulp of it, so of
    # the float64 sum of the products up to float64's own rounding (about 1e-16, allowed for).
    p = fp.chunk_partials(x, w, 64)
    exact = np.array([[(x[i, c:c + 64].astype(np.float64) * w[i, c:c + 64]).sum()
                       for c in range(0, 300, 64)] for i in range(16)])
    assert np.all(np.abs(p - exact) <= np.spacing(np.abs(p).astype(np.float32)) / 2 * (1 + 1e-6))
    with pytest.raises(ValueError, match="chunk: expected 16, 32, 64 or 128"):
        fp.chunk_partials(x, w, 0)
    # BF16 bit patterns give the partials of their float32 values.
    xb = (x.view(np.uint32) >> 16).astype(np.uint16)
    wb = (w.view(np.uint32) >> 16).astype(np.uint16)
    xv = (xb.astype(np.uint32) << 16).view(np.float32)
    wv = (wb.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(fp.chunk_partials(xb, wb, 64).view(np.uint32),
                          fp.chunk_partials(xv, wv, 64).view(np.uint32))
    # A misspelt keyword is one short TypeError naming it, not pybind's dump of the arrays.
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunks'"):
        fp.chunked_dot(x, w, chunks=16)
    # accumulate_partials follows IEEE for non-finite partials (as the GEMM does).
    assert np.isnan(fp.accumulate_partials(np.array([[1.0, np.nan]], np.float32))[0])
