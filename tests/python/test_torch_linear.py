"""fp4train.torch.Linear: Y, dX and dW bit-identical to the C++ Linear run directly by
fp4_linear_ref (tests/python/linear_ref.cpp, not the binding) over several steps, for
ue5m3-b16 (held references, D = 50), nvfp4-te (RHT on the wgrad operands), mxfp4 and fp32;
gradients of the fp32 recipe against double-precision central differences; the errors."""
import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fp4train as fp  # noqa: E402
import fp4train.torch as ft  # noqa: E402
from conftest import SRC, bits  # noqa: E402

REF = os.environ.get("FP4_LINEAR_REF") or os.path.join(SRC, "build", "fp4_linear_ref")
torch.set_num_threads(2)


@pytest.mark.parametrize("recipe", ["ue5m3-b16", "nvfp4-te", "mxfp4", "fp32"])
def test_bit_identical_to_cpp_linear(tmp_path, recipe):
    if not os.path.exists(REF):
        pytest.skip(f"{REF} not built")
    B, T, K, N, layer, seed, steps = 2, 16, 64, 48, 3, 11, 3
    rng = np.random.default_rng(4)
    data = []
    for s in range(1, steps + 1):
        x = rng.standard_normal((B, T, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) * 0.1).astype(np.float32)
        dy = (rng.standard_normal((B, T, N)) * 1e-3).astype(np.float32)
        for name, a in (("x", x), ("w", w), ("dy", dy)):
            a.tofile(tmp_path / f"{name}_{s}.f32")
        data.append((x, w, dy))
    rfile = os.path.join(SRC, "configs", "recipes", recipe + ".toml")
    subprocess.run([str(a) for a in (REF, rfile, B * T, K, N, layer, seed, steps, tmp_path)], check=True)
    ctx = ft.StepContext(seed=seed)
    lin = ft.Linear(K, N, fp.Recipe.load(rfile), layer=layer, steps=ctx, bias=False)  # the C++ Linear has none
    assert lin.mode == ("fp32" if recipe == "fp32" else "fp4")
    for s, (x, w, dy) in enumerate(data, 1):
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
        lin.weight.grad = None
        xt = torch.from_numpy(x).requires_grad_(True)
        y = lin(xt)
        y.backward(torch.from_numpy(dy))
        ref = {n: np.fromfile(tmp_path / f"{n}_{s}.ref.f32", np.float32) for n in ("y", "dx", "dw")}
        assert np.array_equal(bits(y.detach().numpy().ravel()), bits(ref["y"])), (recipe, s, "y")
        assert np.array_equal(bits(xt.grad.numpy().ravel()), bits(ref["dx"])), (recipe, s, "dx")
        assert np.array_equal(bits(lin.weight.grad.numpy().ravel()), bits(ref["dw"])), (recipe, s, "dw")
        if recipe != "fp32":  # quantization is on: not the FP32 product
            assert not np.allclose(y.detach().numpy(), x @ w.T, rtol=1e-6, atol=0)
        ctx.advance()


def test_fp32_gradients_against_finite_differences():
    torch.manual_seed(0)
    lin = ft.Linear(5, 3, "fp32", layer=0, bias=False)
    x = torch.randn(4, 5, dtype=torch.float32, requires_grad=True)
    c = torch.randn(4, 3, dtype=torch.float64)

    def loss(xv, wv):
        with torch.no_grad():
            lin.weight.copy_(wv)
            return float((lin(xv).double() * c).sum())

    y = lin(x)
    (y.double() * c).sum().backward()
    w0, x0, h = lin.weight.detach().clone(), x.detach().clone(), 1e-2
    for t, grad, other in ((x0, x.grad, None), (w0, lin.weight.grad.clone(), None)):
        fd = torch.zeros_like(t, dtype=torch.float64)
        for i in range(t.numel()):
            tp, tm = t.clone(), t.clone()
            tp.view(-1)[i] += h
            tm.view(-1)[i] -= h
            if t is x0:
                fd.view(-1)[i] = (loss(tp, w0) - loss(tm, w0)) / (2 * h)
            else:
                fd.view(-1)[i] = (loss(x0, tp) - loss(x0, tm)) / (2 * h)
        # a linear map: central differences are exact up to the FP32 rounding of y (~1e-7 |y| / h)
        assert torch.allclose(grad.double(), fd, rtol=1e-4, atol=1e-4), (grad, fd)


def test_errors_and_inference():
    lin = ft.Linear(16, 8, "ue5m3-b16")
    with pytest.raises(TypeError, match="float32"):
        lin(torch.zeros(2, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\[\.\.\., 16\]"):
        lin(torch.zeros(2, 15))
    x = torch.randn(4, 16, requires_grad=True)
    y1 = lin(x)
    with pytest.raises(RuntimeError, match="second training forward"):
        lin(x)
    y1.sum().backward()
    with torch.no_grad():  # inference forwards need no backward
        a = lin(torch.ones(4, 16))
        b = lin(torch.ones(4, 16))
    assert torch.equal(a, b)
    nv = ft.Linear(16, 8, "nvfp4-te")
    y = nv(torch.randn(5, 16, requires_grad=True))
    with pytest.raises(ValueError, match="multiple of 16"):
        y.sum().backward()
    x = np.ones((4, 16), np.float32)
    core = fp._core.Linear(16, 8, fp.Recipe.load("fp32"))
    with pytest.raises(RuntimeError, match="without a training forward"):
        core.backward(np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match="step must be >= 1"):
        core.forward(x, np.ones((8, 16), np.float32), 0)


def test_torch_mlp_example_learns():
    p = subprocess.run([os.environ.get("FP4_TEST_PYTHON", "/usr/bin/python3"),
                        os.path.join(SRC, "examples", "torch_mlp.py"), "--steps", "30", "--hidden", "64",
                        "--no-reference"],
                       capture_output=True, text=True, check=True)
    losses = [float(l.split("loss")[1]) for l in p.stdout.splitlines() if l.startswith("step")]
    assert len(losses) >= 4 and losses[-1] < 0.75 * losses[0], p.stdout  # it learns


def test_telemetry_and_references():
    steps = ft.StepContext(seed=2, telemetry=True)
    lin = ft.Linear(32, 16, "ue5m3-b16", layer=1, steps=steps)
    x = torch.randn(16, 32, requires_grad=True)
    lin(x).sum().backward()
    tel = lin.telemetry
    assert set(tel) == {"x", "w", "dy", "dyt", "xt"}
    assert 0 < tel["x"]["rel_error"] < 1 and 0 <= tel["w"]["zeroed_nonzeros"] < 1
    # g of x is max|x| at step 1 (held for D = 50 steps afterwards)
    assert np.float32(lin.core.refs["x"]) == np.abs(x.detach().numpy()).max()
    steps.advance()
    steps.telemetry = False
    x2 = (x.detach() * 2).requires_grad_(True)
    lin(x2).sum().backward()
    assert np.float32(lin.core.refs["x"]) == np.abs(x.detach().numpy()).max()  # held, not 2x
