"""fp4train's model against an independent PyTorch implementation.

docs/export.md "The check (tests/python/test_torch_model.py)".

For two tiny Llama-style configs (SwiGLU + RoPE + GQA; squared ReLU without RoPE) and a tiny
Nemotron-H hybrid (Mamba-2, attention with RoPE, MLP; tests/python/tiny_*.toml), with
the ``fp32`` recipe: train 40 steps with ``fp4train train``, ``fp4train export`` the final
checkpoint, then check

* round trip: the exported tensors, loaded into ``fp4train.torch.models`` by HF name, are
  bit-identical to the checkpoint's parameters mapped by the Python implementation of the
  layout (``hf_state_dict_from_flat``, written apart from the C++ one);
* held-out NLL: the PyTorch model's NLL on the windows ``fp4train eval`` uses (re-derived
  here from the token shard) equals ``fp4train eval --policy none`` within a bound derived
  from FP32 rounding (``RoundingBound``: first-order, γ_n·Σ|terms| per operation, weighted by
  |∂L/∂v| from float64 autograd; see the docstring of ``test_heldout_nll``);
* gradients: ``fp4train eval --grad-out`` (fp4train's own backward) against torch.autograd in
  float64 and float32 (tolerance stated in ``test_gradients``).

Runs in ~30 s on 2 cores. tests/python/mutate_torch_model.py shows that both checks fail on
plausible bugs. Needs torch (CTest skips with 77 otherwise, see CMakeLists.txt)
and the fp4train binary: $FP4TRAIN_BIN, else build/fp4train.
"""
import glob
import importlib.util
import json
import math
import os
import shutil
import subprocess
import tomllib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("FP4TRAIN_BIN", os.path.join(ROOT, "build", "fp4train"))


def _load_models():
    # By file, so the check does not depend on the rest of the fp4train package (the compiled
    # extension) being built.
    spec = importlib.util.spec_from_file_location(
        "fp4train_torch_models", os.path.join(ROOT, "python", "fp4train", "torch", "models.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


M = _load_models()
U = 2.0 ** -24


def run(*args, cwd=None):
    r = subprocess.run([BIN, *args], capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        raise AssertionError(f"fp4train {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def read_shard(path):
    """fp4train token shard (docs/data.md "The token cache"), read here from the layout, not
    through fp4train: 8-byte magic "FP4TOK01", u32 version; version 2: u32 vocab, u32 bytes
    per id (2 or 4), u32 0, u64 count, the ids; version 1: u32 vocab, u64 count, uint16 ids."""
    b = open(path, "rb").read()
    assert b[:8] == b"FP4TOK01"
    version = int.from_bytes(b[8:12], "little")
    if version == 1:
        count, width, start = int.from_bytes(b[16:24], "little"), 2, 24
    else:
        assert version == 2, version
        width = int.from_bytes(b[16:20], "little")
        count, start = int.from_bytes(b[24:32], "little"), 32
    ids = np.frombuffer(b[start:], dtype="<u2" if width == 2 else "<u4")
    assert ids.size == count
    return ids.astype(np.int64)


class Run:
    pass


def _make_run(tmp_path_factory, config_name):
    if not os.path.exists(BIN):
        pytest.skip(f"fp4train binary {BIN} not built")
    work = tmp_path_factory.mktemp(config_name)
    text = work / "text"
    text.mkdir()
    docs = sorted(glob.glob(os.path.join(ROOT, "data", "brown", "text", "*.txt")))[:40]
    if not docs:
        pytest.skip("the Brown corpus (data/brown/text, scripts/setup) is missing")
    for d in docs:
        shutil.copy(d, text)
    cfg_text = open(os.path.join(ROOT, "tests", "python", config_name + ".toml")).read()
    cfg_text += f'\n[data]\npath = "{text}"\ncache = "{work / "cache"}"\n'
    (work / "config.toml").write_text(cfg_text)
    r = Run()
    r.work = str(work)
    r.run = str(work / "run")
    r.hf = str(work / "hf")
    run("train", "--config", str(work / "config.toml"), "--recipe", "fp32", "--out", r.run,
        "--quiet", "--peak-gflops", "1")
    run("export", "--checkpoint", r.run, "--out", r.hf)
    run("eval", "--checkpoint", r.run, "--policy", "none", "--json", str(work / "eval.json"),
        "--grad-out", str(work / "grad.safetensors"))
    r.eval = json.load(open(work / "eval.json"))
    r.grad, r.grad_meta = M.read_safetensors(str(work / "grad.safetensors"))
    ck = sorted(glob.glob(os.path.join(r.run, "checkpoints", "step_*.safetensors")))[-1]
    r.ck_tensors, r.ck_meta = M.read_safetensors(ck)
    r.cfg = tomllib.loads(r.ck_meta["config_toml"])
    shards = glob.glob(os.path.join(str(work / "cache"), "*", "heldout.bin"))
    assert len(shards) == 1, shards
    r.heldout = read_shard(shards[0])
    return r


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_relu2", "tiny_hybrid"])
def trained(request, tmp_path_factory):
    return _make_run(tmp_path_factory, request.param)


def test_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        M.from_pretrained(str(tmp_path))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match="exceeds the file"):
        M.read_safetensors(str(bad))
    M.write_safetensors(str(bad), {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    blob = bad.read_bytes()
    bad.write_bytes(blob[:-4])  # truncated data
    with pytest.raises(ValueError, match="truncated"):
        M.read_safetensors(str(bad))
    with pytest.raises(ValueError, match="unknown layout"):
        M.FP4TrainLM({"vocab_size": 8, "hidden_size": 4, "num_attention_heads": 1, "intermediate_size": 4,
                      "num_hidden_layers": 1, "fp4train": {"layout": "gpt2"}})


def windows(r):
    """The held-out windows of fp4train eval (heldout_windows, src/data/batches.cpp): starts
    0, seq_len, 2·seq_len, ... while start + seq_len + 1 ≤ tokens, at most eval.windows."""
    T = r.cfg["train"]["seq_len"]
    n = r.cfg["eval"]["windows"]
    starts = [s for s in range(0, len(r.heldout) - T, T)][:n]
    w = np.stack([r.heldout[s:s + T + 1] for s in starts])
    return torch.from_numpy(w[:, :-1].copy()), torch.from_numpy(w[:, 1:].copy()), w


def test_export_round_trip(trained):
    r = trained
    exported, meta = M.read_safetensors(os.path.join(r.hf, "model.safetensors"))
    assert meta.get("format") == "pt"
    conf = json.load(open(os.path.join(r.hf, "config.json")))
    if conf["model_type"] == "nemotron_h":
        # As nvidia's Nemotron-H configs: residual_in_fp32 false; time_step_limit with FLT_MAX
        # for their Infinity (no clamp; docs/export.md "config.json: two keys of the Nemotron-H
        # layout").
        assert conf["residual_in_fp32"] is False
        assert conf["time_step_limit"] == [0.0, float(np.finfo(np.float32).max)]
    mine = M.hf_state_dict_from_flat(r.cfg, r.ck_tensors["params"])
    assert sorted(mine) == sorted(exported)
    assert sorted(conf["fp4train"]["names"]) == sorted(exported)
    for k, v in mine.items():
        assert exported[k].dtype == np.float32 and exported[k].shape == v.shape, k
        assert exported[k].tobytes() == np.ascontiguousarray(v).tobytes(), f"{k} differs"
    # The PyTorch model holds exactly those bits, from the export and from the checkpoint.
    a = M.from_pretrained(r.hf).state_dict()
    b = M.from_checkpoint(sorted(glob.glob(os.path.join(r.run, "checkpoints", "*.safetensors")))[-1]).state_dict()
    assert sorted(a) == sorted(exported) == sorted(b)
    for k in a:
        assert a[k].numpy().tobytes() == exported[k].tobytes() == b[k].numpy().tobytes(), k
    # Back out through the writer: same tensors.
    out = os.path.join(r.work, "again.safetensors")
    M.write_safetensors(out, a)
    again, _ = M.read_safetensors(out)
    for k in a:
        assert again[k].tobytes() == exported[k].tobytes(), k


def test_heldout_nll(trained):
    """|NLL_fp4train − NLL_exact| ≤ B and |NLL_torch32 − NLL_exact| ≤ B + (γ_{BT} + 3u)·NLL, where B is
    the first-order rounding bound of RoundingBound (models.py: each operation's local FP32 error
    bound γ_n·Σ|terms| (dot products, sums) or k·u·|v| (elementwise), weighted by |∂L/∂v| from
    float64 autograd at the same point; γ_n = n·u/(1 − n·u), u = 2^−24). NLL_exact is the float64
    PyTorch model (its own error ~1e-16 relative, negligible). PyTorch FP32 also rounds each row's
    loss (log-softmax's final subtractions, ≤ 3u·|row|; the rows are positive, so 3u·NLL in the
    mean) and takes the mean of the B·T rows in FP32 (γ_{BT}·NLL), which fp4train does in double:
    hence its extra (γ_{BT} + 3u)·NLL. So fp4train and PyTorch FP32 differ by at most
    2B + (γ_{BT} + 3u)·NLL. Nothing here is tuned: B comes out of the model and the data."""
    r = trained
    x, y, _ = windows(r)
    fp4 = r.eval["results"]["none"]["nats_per_token"]
    assert r.eval["windows"] == x.shape[0] and r.eval["tokens"] == x.numel()
    m64 = M.from_pretrained(r.hf, torch.float64)
    bound = M.RoundingBound()
    l64 = M.mean_nll(m64, x, y, bound)
    B = bound.total(l64)
    l64 = float(l64)
    m32 = M.from_pretrained(r.hf, torch.float32)
    with torch.no_grad():
        l32 = float(M.mean_nll(m32, x, y))
    extra32 = (M.gamma(x.numel()) + 3 * U) * abs(l64)
    print(f"\n{r.cfg['model'].get('pattern', 'llama')}: fp4train {fp4:.12f} torch64 {l64:.12f} "
          f"torch32 {l32:.12f} | |fp4-64| {abs(fp4 - l64):.3e} |32-64| {abs(l32 - l64):.3e} "
          f"|fp4-32| {abs(fp4 - l32):.3e} bound B {B:.3e}")
    assert abs(fp4 - l64) <= B, (fp4, l64, B)
    assert abs(l32 - l64) <= B + extra32, (l32, l64, B)
    assert abs(fp4 - l32) <= 2 * B + extra32, (fp4, l32, B)
    # The bound means something: far below the NLL's scale (a wrong eps, RoPE pairing or
    # softplus would move the NLL by more; see docs/export.md for what was checked).
    assert B < 1e-3 * abs(l64)


def test_gradients(trained):
    """fp4train's FP32 backward (eval --grad-out: mean NLL of the windows, one batch) against
    torch.autograd of the same loss in float64 (the reference) and float32.

    Tolerance, per parameter tensor g (HF name and layout), with e(g) = ‖g − g64‖₂:
      e(g_fp4train) ≤ 16·e(g_torch32) + 64·u·‖g64‖₂.
    That is: fp4train's FP32 gradient is as close to the float64 gradient as PyTorch's own FP32
    autograd is, within a factor 16 (the two use different summation orders and GEMM kernels, so
    their errors differ by small factors, not orders of magnitude: at most 3.8 measured), plus
    64·u relative for
    tensors whose float32 error happens to be tiny. Both are also required to be within 1e-3 of
    the float64 gradient in relative norm (an FP32 backward through a few blocks loses at most a
    few digits; a wrong derivative is off by O(1))."""
    r = trained
    x, y, w = windows(r)
    tok = r.grad["tokens"]
    assert np.array_equal(tok, w.astype(np.int32)), "grad-out windows differ from the held-out windows"
    loss_fp4 = float(r.grad_meta["loss"])
    m64 = M.from_pretrained(r.hf, torch.float64)
    l64 = M.mean_nll(m64, x, y)
    l64.backward()
    m32 = M.from_pretrained(r.hf, torch.float32)
    l32 = M.mean_nll(m32, x, y)
    l32.backward()
    assert abs(loss_fp4 - float(l64)) < 1e-5
    g64 = {k: p.grad.numpy() for k, p in m64.named_parameters()}
    g32 = {k: p.grad.numpy().astype(np.float64) for k, p in m32.named_parameters()}
    names = sorted(g64)
    assert sorted(k for k in r.grad if k != "tokens") == names
    worst = []
    for k in names:
        ref = g64[k]
        n = np.linalg.norm(ref)
        e4 = np.linalg.norm(r.grad[k].astype(np.float64) - ref)
        e32 = np.linalg.norm(g32[k] - ref)
        worst.append((e4 / max(n, 1e-300), e32 / max(n, 1e-300), k))
        assert r.grad[k].shape == ref.shape, k
        assert e4 <= 16 * e32 + 64 * U * n, f"{k}: |fp4-64| {e4:.3e}, |t32-64| {e32:.3e}, |g| {n:.3e}"
        assert e4 <= 1e-3 * n and e32 <= 1e-3 * n, k
    worst.sort(reverse=True)
    print("\nlargest relative gradient errors (fp4train, torch32):",
          ", ".join(f"{k} {a:.2e} {b:.2e}" for a, b, k in worst[:4]))
