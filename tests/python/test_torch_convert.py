"""fp4train.torch.convert and the nn.Linear-like defaults of fp4train.torch.Linear
(docs/python.md "Converting a PyTorch model: convert"): a model with biases converts and keeps its
outputs (fp32 recipe) and its Parameters; the recipe's high-precision blocks and overrides land
on the modules fp4train's own model gives them; MultiheadAttention and direct weight reads are
named in warnings; the optimizer hook advances the step (new SR draws), and a forgotten advance
without it is an error; bias=True by default, added in FP32 after the GEMM, its gradient exact."""
import os
import subprocess
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fp4train as fp  # noqa: E402
import fp4train.torch as ft  # noqa: E402
from conftest import SRC, bits  # noqa: E402

torch.set_num_threads(2)
F = torch.nn.functional


class Attn(torch.nn.Module):
    def __init__(self, d, heads=2):
        super().__init__()
        self.h = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (p(x).view(B, T, self.h, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        a = torch.softmax(q @ k.transpose(-1, -2) / (D // self.h) ** 0.5, -1) @ v
        return x + self.o_proj(a.transpose(1, 2).reshape(B, T, D))


class Mlp(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up_proj, self.down_proj = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down_proj(F.gelu(self.up_proj(x)))


class Net(torch.nn.Module):
    """fp4train's block layout: attention and MLP blocks alternate in `layers`; a head outside."""

    def __init__(self, d=16, n_layers=2, vocab=32):
        super().__init__()
        self.layers = torch.nn.ModuleList(m for _ in range(n_layers) for m in (Attn(d), Mlp(d)))
        self.lm_head = torch.nn.Linear(d, vocab)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.lm_head(x)


def converted(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, ft.Linear)}


def test_linear_bias_default_true_fp32_after_gemm_exact_grad():
    assert ft.Linear(16, 8).bias is not None and ft.Linear(16, 8).bias.shape == (8,)
    assert ft.Linear(16, 8, bias=False).bias is None
    torch.manual_seed(1)
    with_b, no_b = ft.Linear(32, 16, "ue5m3-b16", layer=2), ft.Linear(32, 16, "ue5m3-b16", layer=2, bias=False)
    with torch.no_grad():
        no_b.weight.copy_(with_b.weight)
    x = torch.randn(2, 16, 32)
    dy = torch.randn(2, 16, 16)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = with_b(xa), no_b(xb)
    # the FP4 GEMM's output plus the bias in FP32: the same bits as adding it by hand
    assert torch.equal(ya, yb + with_b.bias)
    ya.backward(dy)
    yb.backward(dy)
    assert np.array_equal(bits(with_b.bias.grad.numpy()), bits(dy.sum((0, 1)).numpy()))  # exact: dy summed
    assert torch.equal(with_b.weight.grad, no_b.weight.grad) and torch.equal(xa.grad, xb.grad)


def test_round_trip_fp32_keeps_outputs_and_parameters():
    torch.manual_seed(0)
    model = Net()
    params = {n: p for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    values = {n: p.detach().clone() for n, p in params.items()}
    x = torch.randn(2, 8, 16)
    ref = model(x)
    ref.square().mean().backward()
    ref_grads = {n: p.grad.clone() for n, p in params.items()}
    model.zero_grad()
    rng = torch.get_rng_state()
    assert ft.convert(model, "fp32") is model
    assert torch.equal(torch.get_rng_state(), rng)  # the new modules' init leaves the RNG alone
    conv = converted(model)
    assert sorted(conv) == sorted(n for n, m in Net().named_modules()
                                  if isinstance(m, torch.nn.Linear) and n != "lm_head")
    assert type(model.lm_head) is torch.nn.Linear  # outside the blocks: kept, as fp4train's LM head
    assert [m.layer for m in conv.values()] == list(range(len(conv)))
    for n, p in model.named_parameters():  # the same Parameter objects, values untouched
        assert p is params[n] and torch.equal(p, values[n]), n
    assert list(model.state_dict()) == keys  # the original model's checkpoints still load
    assert all(m.bias is not None and m.mode == "fp32" for m in conv.values())
    out = model(x)
    # fp32: oneDNN's and torch's FP32 GEMMs sum in different orders; nothing is quantized
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6), (out - ref).abs().max()
    out.square().mean().backward()
    for n, p in params.items():
        assert torch.allclose(p.grad, ref_grads[n], rtol=1e-4, atol=1e-6), n


def test_plans_match_fp4train_model():
    """High-precision final blocks and an override land where fp4train's own model puts them:
    the tiny config with 2 layers (blocks attn, mlp, attn, mlp) under Recipe.plan."""
    cfg = fp.Config.load(os.path.join(SRC, "configs", "tiny.toml"), sets=["model.n_layers=2"])
    for name, sets in (("nvfp4-te", []), ("ue5m3-b16-t2048-last1", ["high_precision.blocks=[0]"])):
        recipe = fp.Recipe.load(name, sets=sets)
        model = ft.convert(Net(), recipe)
        conv = converted(model)
        plan = recipe.plan(cfg)
        want = {(p["block"], p["kind"]): p for p in plan if p["name"] != "lm_head"}
        got = {(m.block, m.kind): m for m in conv.values()}
        assert set(got) == set(want)
        # fp4train's LM head (block -1) is FP32; convert keeps the head outside the blocks
        assert [p["mode"] for p in plan if p["name"] == "lm_head"] == ["fp32"]
        assert type(model.lm_head) is torch.nn.Linear
        for key, m in got.items():
            assert m.mode == want[key]["mode"], (name, key)
            assert (m.plan.specs == want[key]["specs"]), (name, key)
    # the checks above saw BF16 and overridden linears: nvfp4-te keeps the final block (3) in BF16
    bf16 = ft.convert(Net(), "nvfp4-te")
    assert {n: m.mode for n, m in converted(bf16).items()} == {
        n: ("bf16" if n.startswith("layers.3.") else "fp4") for n in converted(bf16)}
    last1 = converted(ft.convert(Net(), "ue5m3-b16-t2048-last1"))
    assert {n for n, m in last1.items() if m.plan.specs["wgrad"]["dy"]["target"] == 2048.0} == {"layers.3.down_proj"}


def test_blocks_kinds_exclude_arguments():
    model = ft.convert(Net(), "ue5m3-b16", blocks=["layers.0", "layers.1"], exclude="*.v_proj",
                       kinds={"layers.1.up_proj": "q_proj"})
    conv = converted(model)
    assert sorted(conv) == ["layers.0.k_proj", "layers.0.o_proj", "layers.0.q_proj", "layers.1.down_proj",
                            "layers.1.up_proj"]
    assert conv["layers.1.up_proj"].kind == "q_proj" and conv["layers.1.down_proj"].block == 1
    with pytest.raises(ValueError, match="no module 'layers.9'"):
        ft.convert(Net(), "fp32", blocks=["layers.9"])
    with pytest.raises(ValueError, match="exclude pattern 'head'"):
        ft.convert(Net(), "fp32", exclude=["head"])
    with pytest.raises(ValueError, match=r"kinds\['\*.up_proj'\]: unknown linear kind 'mlp'"):
        ft.convert(Net(), "fp32", kinds={"*.up_proj": "mlp"})
    with pytest.raises(TypeError, match=r"'layers.0.q_proj'.weight is torch.float64"):
        ft.convert(Net().double(), "fp32")
    with pytest.raises(ValueError, match="no torch.nn.ModuleList"):
        ft.convert(torch.nn.Sequential(torch.nn.Linear(4, 4)), "fp32")
    with pytest.raises(fp.UserError, match="final_blocks"):  # the C++ rule's own error
        ft.convert(Net(), fp.Recipe.load("ue5m3-b16", sets=["high_precision.final_blocks=5"]))


class EncoderNet(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
            for _ in range(2))

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return x


def test_multihead_attention_is_named_and_left_whole():
    with pytest.warns(ft.ConvertWarning, match=r"'layers.0.self_attn' is a torch.nn.MultiheadAttention") as rec:
        model = ft.convert(EncoderNet(), "ue5m3-b16")
    assert any("'layers.1.self_attn'" in str(w.message) for w in rec)
    assert sorted(converted(model)) == ["layers.0.linear1", "layers.0.linear2", "layers.1.linear1",
                                        "layers.1.linear2"]
    assert type(model.layers[0].self_attn.out_proj) is not ft.Linear
    assert any("'layers.0' is a torch.nn.TransformerEncoderLayer" in str(w.message) for w in rec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every converted Linear runs its forward: no warning
        model(torch.randn(2, 8, 16)).sum().backward()
    # eval without gradients: the layer's fused fast path reads linear1/linear2.weight itself
    with pytest.warns(ft.ConvertWarning, match="'layers.0.linear1'.*did not run its forward"):
        with torch.no_grad():
            model.eval()(torch.randn(2, 8, 16))


class DirectRead(torch.nn.Module):
    """Reads proj.weight itself, as F.multi_head_attention_forward reads out_proj.weight."""

    def __init__(self, d=16):
        super().__init__()
        self.proj, self.other = torch.nn.Linear(d, d), torch.nn.Linear(d, d)

    def forward(self, x):
        return self.other(F.linear(x, self.proj.weight, self.proj.bias))


def test_bypassed_forward_warns_after_first_forward():
    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([DirectRead()])

        def forward(self, x):
            return self.blocks[0](x)

    model = ft.convert(Wrap(), "ue5m3-b16")
    with pytest.warns(ft.ConvertWarning, match=r"'blocks.0.proj' \(fp4train Linear\) did not run its forward") as rec:
        model(torch.randn(4, 16)).sum().backward()
    assert len(rec) == 1 and "'blocks.0' (DirectRead)" in str(rec[0].message)
    model.blocks[0].other.steps.advance()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the check runs once per mode
        model(torch.randn(4, 16)).sum().backward()
    with pytest.warns(ft.ConvertWarning, match="'blocks.0.proj'.*first forward in eval mode without"):
        with torch.no_grad():
            model.eval()(torch.randn(4, 16))


def _step(model, x, opt=None):
    model.zero_grad()
    model(x).square().mean().backward()
    if opt is not None:
        opt.step()
    return {n: m.weight.grad.clone() for n, m in converted(model).items()}


def test_optimizer_hook_advances_step():
    torch.manual_seed(3)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # built before convert: same Parameters
    steps = ft.StepContext(seed=5)
    ft.convert(model, "ue5m3-b16", steps=steps, optimizer=opt)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)  # torch 1.13 wraps step() again
    x = torch.randn(2, 16, 16)
    g1 = _step(model, x, opt)
    assert steps.step == 2
    g2 = _step(model, x, opt)
    sched.step()
    assert steps.step == 3
    # same weights (lr 0) and input: only the step's SR draws of dY differ
    assert all(not torch.equal(g1[n], g2[n]) for n in g1)
    steps.advance()  # a manual advance as well does not skip a step
    opt.step()
    assert steps.step == 4
    _step(model, x, opt)
    assert steps.step == 5


def test_forgotten_advance_without_hook_raises():
    model = ft.convert(Net(), "ue5m3-b16")
    x = torch.randn(2, 16, 16)
    _step(model, x)
    with pytest.raises(RuntimeError, match=r"'layers.0.q_proj': a second training forward at step 1"):
        _step(model, x)
    steps = converted(model)["layers.0.q_proj"].steps
    steps.advance()
    _step(model, x)
    with torch.no_grad():  # inference forwards are not training forwards
        model(x), model(x)
    steps.repeat = "warn"
    with pytest.warns(RuntimeWarning, match="second training forward at step 2"):
        _step(model, x)


def test_torch_convert_example_learns():
    p = subprocess.run([os.environ.get("FP4_TEST_PYTHON", "/usr/bin/python3"),
                        os.path.join(SRC, "examples", "torch_convert.py"), "--steps", "12"],
                       capture_output=True, text=True, check=True)
    losses = [float(l.split("loss")[1]) for l in p.stdout.splitlines() if l.startswith("step")]
    assert len(losses) == 12 and losses[-1] < losses[0], p.stdout
    assert "lm_head: kept torch.nn.Linear" in p.stdout and "self_attn" not in p.stdout
