"""Shared helpers of the fp4train Python tests (tests/python, run by CTest `python`).

Expected values come from the fp4train CLI (FP4TRAIN_BIN, default build/fp4train) run on the
same numbers, or from hand calculation with the formulas of docs/formats.md and
docs/numerics.md -- never from the binding under test.
"""
import json
import os
import subprocess

import numpy as np
import pytest

SRC = os.environ.get("FP4_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("FP4TRAIN_BIN") or os.path.join(SRC, "build", "fp4train")


def write_matrix(path, x):
    """Write a float32 matrix as the CLI's text: each value as the shortest decimal of its
    (exact) double, which parses back to the same float32 (decimal -> double exactly ->
    float32 exactly); -0.0 stays -0.0."""
    x = np.asarray(x, dtype=np.float32)
    with open(path, "w") as f:
        for row in x:
            f.write(" ".join(repr(float(v)) for v in row) + "\n")


def run_cli(args, check=True):
    p = subprocess.run([BIN] + [str(a) for a in args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"fp4train {' '.join(map(str, args))} exited {p.returncode}: {p.stderr}")
    return p


def micro_config(work, steps):
    """A micro run config (d_model 32, 1 layer, vocab 512, 2 x 32 tokens a step, `steps` steps)
    reading the first 12 Brown documents, copied to work/text, with its cache in work/cache;
    written to work/micro.toml and returned. Skips the test without the default corpus."""
    brown = os.path.join(SRC, "data", "brown", "text")
    if not os.path.isdir(brown):
        pytest.skip("default corpus missing (scripts/setup installs it)")
    text = work / "text"
    text.mkdir()
    for name in sorted(os.listdir(brown))[:12]:
        if name.endswith(".txt"):
            (text / name).write_bytes(open(os.path.join(brown, name), "rb").read())
    cfg = work / "micro.toml"
    cfg.write_text(f"""[model]
vocab_size = 512
d_model = 32
n_layers = 1
n_heads = 2
mlp_hidden = 64
[train]
seq_len = 32
batch_size = 2
steps = {steps}
warmup_steps = 1
[data]
path = "{text}"
cache = "{work / 'cache'}"
[eval]
interval = 3
windows = 2
[log]
progress_seconds = 0.0
telemetry_interval = 1
""")
    return cfg


def f32(v):
    """A JSON number (a double that holds a float32 exactly) as float32; None (JSON null) as NaN."""
    return np.float32(np.nan if v is None else v)


def bits(a):
    """The raw bits of float32 values, for bit-for-bit comparisons (distinguishes -0 and +0)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32)).view(np.uint32)


@pytest.fixture
def cli_quant(tmp_path):
    """cli_quant(x, *args) -> dict: `fp4train quant FILE args...` JSON of matrix x."""
    counter = [0]

    def run(x, *args):
        counter[0] += 1
        path = tmp_path / f"m{counter[0]}.txt"
        write_matrix(path, x)
        return json.loads(run_cli(["quant", path, *args]).stdout)
    return run


@pytest.fixture(scope="session")
def fp4train_bin():
    if not os.path.exists(BIN):
        pytest.skip(f"{BIN} not built")
    return BIN
