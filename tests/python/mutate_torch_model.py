"""Mutation check of tests/python/test_torch_model.py (run by hand, not by CTest): plausible
bugs are put into a copy of python/fp4train/torch/models.py, one at a time, and the held-out
NLL and gradient checks are run against fp4train's real output with the mutant in place of
the model. Every mutant must be caught by at least one of them (docs/export.md lists which).
Exit status 1 if one survives both.

    /usr/bin/python3 tests/python/mutate_torch_model.py      # ~30 s on 2 idle cores
"""
import os
import pathlib
import shutil
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_torch_model as T  # noqa: E402

SRC = open(os.path.join(T.ROOT, "python", "fp4train", "torch", "models.py")).read()
BASE = tempfile.mkdtemp(prefix="fp4train-mutants-")


class TmpDirs:
    def mktemp(self, n):
        return pathlib.Path(tempfile.mkdtemp(prefix=n, dir=BASE))
runs = {n: T._make_run(TmpDirs(), n) for n in ("tiny_llama", "tiny_relu2", "tiny_hybrid")}
MUTS = [
 ("RMSNorm eps x10", "self.eps = float(config.get(", "self.eps = 10 * float(config.get(", None),
 ("RoPE theta x1.001", "inv = torch.pow(torch.tensor(float(theta)", "inv = torch.pow(torch.tensor(1.001 * float(theta)", ["tiny_llama", "tiny_hybrid"]),
 ("rotate_half without the sign", "return torch.cat([-x[..., h:], x[..., :h]], -1)", "return torch.cat([x[..., h:], x[..., :h]], -1)", ["tiny_llama", "tiny_hybrid"]),
 ("GQA: kv head h % Hkv (repeat)", "k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)", "k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)", ["tiny_llama", "tiny_hybrid"]),
 ("softmax scale 1/hd", "scale = 1.0 / math.sqrt(hd)", "scale = 1.0 / hd", None),
 ("SwiGLU gate/up swapped", "a = F.silu(g) * u", "a = F.silu(u) * g", ["tiny_llama"]),
 ("ReLU^2 -> ReLU", "a = torch.relu(h).square()", "a = torch.relu(h)", ["tiny_relu2", "tiny_hybrid"]),
 ("conv1d taps reversed", "pre = F.conv1d(xbc.transpose(1, 2), m.conv1d.weight,", "pre = F.conv1d(xbc.transpose(1, 2), m.conv1d.weight.flip(-1),", ["tiny_hybrid"]),
 ("Mamba D skip dropped", "Dx = m.D[:, None] * xs", "Dx = 0 * m.D[:, None] * xs", ["tiny_hybrid"]),
 ("gated norm over all d_inner (G=1)", "gs = di // G\n", "gs = di; G = 1\n", ["tiny_hybrid"]),
 ("A = -A_log (no exp)", "A = -torch.exp(m.A_log)", "A = -m.A_log", ["tiny_hybrid"]),
 ("B/C groups: repeat instead of interleave", "Bm = xc[..., di:di + G * N].reshape(B, T, G, N).repeat_interleave(H // G, dim=2)", "Bm = xc[..., di:di + G * N].reshape(B, T, G, N).repeat(1, 1, H // G, 1)", ["tiny_hybrid"]),
]
survivors = []
for label, a, b, which in MUTS:
    assert a in SRC, label
    mod = types.ModuleType("mut"); exec(compile(SRC.replace(a, b), "mut", "exec"), mod.__dict__)
    orig = T.M; T.M = mod
    for n in (which or list(runs)):
        res = []
        for f in (T.test_heldout_nll, T.test_gradients):
            try: f(runs[n]); res.append("-")
            except AssertionError: res.append("caught")
        print(f"{label:42s} {n:12s} NLL {res[0]:7s} grad {res[1]}", flush=True)
        if res == ["-", "-"]:
            survivors.append((label, n))
    T.M = orig
shutil.rmtree(BASE, ignore_errors=True)
if survivors:
    print("SURVIVED:", survivors)
    sys.exit(1)
print("every mutant caught")
