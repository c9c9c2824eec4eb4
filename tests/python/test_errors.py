"""Argument errors of quantize(): wrong dtype, wrong shape, non-contiguous arrays, NaN, bad
names and values; C++ messages kept (compared with the CLI's for the same mistake); results
independent of the OpenMP thread count."""
import os
import subprocess
import sys

import numpy as np
import pytest

import fp4train as fp
from conftest import run_cli, write_matrix

X = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)


def test_dtype_shape_layout():
    with pytest.raises(TypeError, match="dtype float32, got float64"):
        fp.quantize(X.astype(np.float64))
    with pytest.raises(TypeError, match="float32"):
        fp.quantize(X.astype(np.float16))
    with pytest.raises(TypeError, match="numpy.ndarray"):
        fp.quantize(X.tolist())
    with pytest.raises(TypeError, match="float32"):
        fp.quantize(X.astype(">f4"))              # big-endian float32
    assert fp.quantize(X.astype("<f4")).shape == X.shape
    with pytest.raises(ValueError, match="2 dimensions"):
        fp.quantize(X.ravel())
    with pytest.raises(ValueError, match="2 dimensions"):
        fp.quantize(X.reshape(2, 2, 32))
    with pytest.raises(ValueError, match="C-contiguous"):
        fp.quantize(X.T)
    with pytest.raises(ValueError, match="C-contiguous"):
        fp.quantize(X[:, ::2])
    # a contiguous copy of the same view works
    assert fp.quantize(np.ascontiguousarray(X[:, ::2])).shape == (4, 16)


def test_nan_and_inf_refused():
    for bad in (np.nan, np.inf, -np.inf):
        x = X.copy()
        x[2, 7] = bad
        # the argument's name and its [row, column], not a kernel's flat index
        with pytest.raises(ValueError, match=r"^x: element \[2, 7\] is (NaN|\+Inf|-Inf) "):
            fp.quantize(x)
        with pytest.raises(ValueError, match=r"^x: element \[2, 7\]"):
            fp.quantize(x, reference=1.0)


@pytest.mark.parametrize("kw,opt,cli", [
    ({"scale_format": "fp8"}, "scale_format: ", ["--scale-format", "fp8"]),
    ({"scale_format": "e5m2"}, "scale_format: ", ["--scale-format", "e5m2"]),
    ({"element_format": "ue4m3"}, "element_format: ", ["--element-format", "ue4m3"]),
    ({"scale_rule": "mx"}, "scale_rule: ", ["--scale-rule", "mx"]),
])
def test_same_message_as_cli(tmp_path, kw, opt, cli):
    write_matrix(tmp_path / "x.txt", X)
    p = run_cli(["quant", tmp_path / "x.txt", *cli], check=False)
    assert p.returncode == 2
    with pytest.raises(ValueError) as e:
        fp.quantize(X, **kw)
    msg = str(e.value)
    assert msg.startswith(opt)
    assert msg[len(opt):] in p.stderr, (msg, p.stderr)


def test_bad_values():
    with pytest.raises(ValueError, match=r"block must be an integer in 1\.\.256 .*got 0"):
        fp.quantize(X, block=0)
    # the recipes' cap (fp4.block <= 256) holds here too
    with pytest.raises(ValueError, match=r"block must be an integer in 1\.\.256 .*got 1000"):
        fp.quantize(X, block=1000)
    with pytest.raises(ValueError, match="target"):
        fp.quantize(X, target=-1.0)
    with pytest.raises(ValueError, match="reference"):
        fp.quantize(X, reference=-1.0)
    with pytest.raises(ValueError, match="reference"):
        fp.quantize(X, reference=float("nan"))
    with pytest.raises(ValueError, match="reference"):
        fp.quantize(X, reference=1e39)
    with pytest.raises(ValueError, match="rounding: unknown value 'rtn'"):
        fp.quantize(X, rounding="rtn")
    with pytest.raises(ValueError, match="power-of-two"):
        fp.quantize(X, scale_rule="mx-te")
    with pytest.raises(ValueError, match="unknown key 'seed'"):
        fp.quantize(X, sr_key={"seed": 1})
    with pytest.raises(ValueError, match="micro"):
        fp.quantize(X, sr_key={"micro": 70000})
    with pytest.raises(TypeError):
        fp.quantize(X, 16)  # options are keyword-only
    with pytest.raises(fp.UserError) as e:
        fp.Recipe.load("no-such-recipe")
    assert isinstance(e.value, ValueError) and "no-such-recipe" in str(e.value)


def test_sr_key_changes_bits():
    a = fp.quantize(X, rounding="sr8", seed=1)
    b = fp.quantize(X, rounding="sr8", seed=1, sr_key={"step": 1, "layer": 0, "operand": 2, "gemm": 0})
    c = fp.quantize(X, rounding="sr8", seed=1, sr_key={"step": 2})
    assert np.array_equal(a.codes, b.codes)
    assert not np.array_equal(a.codes, c.codes)


SCRIPT = r"""
import hashlib, numpy as np, fp4train as fp
x = (np.random.default_rng(3).standard_normal((96, 256)) * 4).astype(np.float32)
w = np.random.default_rng(4).standard_normal((80, 256)).astype(np.float32)
h = hashlib.sha256()
for kw in ({}, {"two_d": True, "rounding": "sr8", "seed": 2}, {"scale_format": "ue8m0", "scale_rule": "mx-ocp", "block": 32}):
    q = fp.quantize(x, **kw)
    h.update(q.codes.tobytes()); h.update(q.scale_codes.tobytes()); h.update(q.dequantize().tobytes())
for mode in ("decoded", "probe-matched"):
    h.update(fp.gemm(x, w, mode).tobytes())
print(h.hexdigest())
"""


def test_thread_count_does_not_change_bits():
    outs = []
    for n in ("1", "2", "3"):
        env = dict(os.environ, OMP_NUM_THREADS=n)
        outs.append(subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                                   text=True, check=True).stdout)
    assert outs[0] == outs[1] == outs[2] and len(outs[0]) == 65


def test_gil_released_during_quantize():
    # While one thread is inside a long quantize() call, another Python thread keeps running:
    # the largest pause of its loop is far below the call's duration (a held GIL would stall
    # it for the whole call).
    import threading
    import time
    x = np.random.default_rng(0).standard_normal((2048, 4096)).astype(np.float32)
    fp.quantize(x[:64].copy())  # warm up
    span = {}

    def work():
        t0 = time.perf_counter()
        fp.quantize(x, rounding="sr8", two_d=True)
        span["t"] = time.perf_counter() - t0

    th = threading.Thread(target=work)
    stamps = [time.perf_counter()]
    th.start()
    while th.is_alive():
        stamps.append(time.perf_counter())
    th.join()
    gap = max(b - a for a, b in zip(stamps, stamps[1:]))
    if span["t"] < 0.05:
        pytest.skip(f"quantize took only {span['t']:.3f} s: too short to tell")
    assert gap < 0.5 * span["t"], (gap, span["t"])


def test_misspelt_keyword_is_named_without_dumping_the_array():
    big = np.ones((64, 64), np.float32)
    with pytest.raises(TypeError) as e:
        fp.quantize(big, blok=32)
    msg = str(e.value)
    assert "unexpected keyword argument 'blok'" in msg, msg
    assert "did you mean 'block'" in msg, msg
    assert "array(" not in msg and len(msg) < 600, msg


def test_reprs_show_what_they_hold():
    r = fp.Recipe.load("ue5m3-b16")
    assert repr(r).startswith("<fp4train.Recipe ue5m3-b16: fp4 e2m1, ue5m3 scales, block 16"), repr(r)
    assert "D 50" in repr(r) and "RHT off" in repr(r), repr(r)
    import os
    src = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    c = fp.Config.load(os.path.join(src, "configs", "tiny.toml"))
    assert "pattern *-*-*-*-," in repr(c) and "d_model 256" in repr(c), repr(c)
    assert "16 x 256 tokens per step" in repr(c), repr(c)


def test_linear_names_a_non_finite_operand_where_fp4_refuses_it():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = rng.standard_normal((8, 32)).astype(np.float32)
    lin = fp._core.Linear(32, 8, fp.Recipe.load("ue5m3-b16"))
    bad = x.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^x: element \[1, 2\] is NaN "):
        lin.forward(bad, w, 1)
    badw = w.copy()
    badw[0, 5] = np.inf
    with pytest.raises(ValueError, match=r"^weight: element \[0, 5\] is \+Inf "):
        lin.forward(x, badw, 1)
    lin.forward(x, w, 1)
    dy = np.ones((4, 8), np.float32)
    dy[2, 3] = -np.inf
    with pytest.raises(ValueError, match=r"^dy: element \[2, 3\] is -Inf "):
        lin.backward(dy)
    # FP32 mode quantizes nothing and refuses nothing: NaN propagates, as in the C++ Linear.
    lin32 = fp._core.Linear(32, 8, fp.Recipe.load("fp32"))
    y = lin32.forward(bad, w, 1)
    assert np.isnan(y[1]).all() and np.isfinite(np.delete(y, 1, axis=0)).all()
