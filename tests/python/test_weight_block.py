"""fp4.weight_block (docs/recipes.md "Weight tiles apart from the blocks"): the Recipe binding's
weight_block and W specs against the plans the CLI resolves (FP4_RESOLVED_RUN_LOG), `fp4train
quant --block 32 --2d` as the weights' tiles, and a tiny `train --set fp4.weight_block=32` run
that writes the key to its recipe.toml, trains differently from block-16 tiles, and resumes
bit for bit from a checkpoint."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

import fp4train as fp
from conftest import BIN, SRC, bits, micro_config, run_cli

TINY = os.path.join(SRC, "configs", "tiny.toml")
RECIPES = os.path.join(SRC, "configs", "recipes")


def test_binding_exposes_weight_block():
    r = fp.Recipe.load("ue5m3-b16", sets=["fp4.weight_block=32"])
    assert r.name == "ue5m3-b16+fp4.weight_block=32"
    assert (r.block, r.weight_block, r.weight_2d) == (16, 32, True)
    assert r.spec("w")["block"] == 32 and r.spec("w")["two_d"]
    assert r.spec("x")["block"] == 16 and r.spec("dy")["block"] == 16
    assert "block = 16\nweight_block = 32\n" in r.toml
    assert fp.Recipe.from_toml(r.toml).weight_block == 32
    assert "weight block 32" in repr(r)
    # The default is the block, and recipes without the key serialise without it.
    for name in sorted(os.listdir(RECIPES)):
        d = fp.Recipe.load(os.path.join(RECIPES, name))
        assert d.weight_block == d.block, name
        assert "weight_block" not in d.toml, name
    assert fp.Recipe.load("ue5m3-b16", sets=["fp4.block=32"]).weight_block == 32
    for bad in ("0", "-1", "257", "16.5", "x"):
        with pytest.raises(fp.UserError, match=r"fp4\.weight_block"):
            fp.Recipe.load("ue5m3-b16", sets=[f"fp4.weight_block={bad}"])


def test_plan_specs_match_the_cli(tmp_path):
    """Every W spec of every FP4 linear has blocks of 32, every X and dY spec blocks of 16, as
    Recipe.plan and as the CLI resolves the same run (its FP4_RESOLVED_RUN_LOG line)."""
    sets = ["fp4.weight_block=32"]
    log = tmp_path / "resolved.jsonl"
    env = dict(os.environ, FP4_RESOLVED_RUN_LOG=str(log))
    subprocess.run([BIN, "info", "--config", TINY, "--recipe", "ue5m3-b16", "--set", sets[0], "--json"],
                   check=True, capture_output=True, env=env)
    cli = json.loads(log.read_text().splitlines()[-1])
    assert "weight_block = 32" in cli["recipe"]
    plan = fp.Recipe.load("ue5m3-b16", sets=sets).plan(fp.Config.load(TINY))
    fp4 = [p for p in plan if p["mode"] == "fp4"]
    assert len(fp4) == len(cli["plans"]) > 0
    for p, c in zip(fp4, cli["plans"]):
        for gemm, ops in p["specs"].items():
            for op, s in ops.items():
                want_block = 32 if op == "w" else 16
                assert s["block"] == want_block, (p["name"], gemm, op)
                assert s["two_d"] == (op == "w"), (p["name"], gemm, op)
                # the CLI's spec: [element, scale format, block, two_d, target, rounding]
                assert c[f"{gemm}.{op}"][2:4] == [want_block, op == "w"], (p["name"], gemm, op)


def test_quant_cli_weight_tiles(cli_quant):
    """`quant --block 32 --2d` quantizes in 32 x 32 tiles: one scale per tile (a 40 x 72 matrix
    has a 2 x 3 grid), the tiles of the recipe's W spec (fp.quantize with r.spec("w"))."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 72)).astype(np.float32)
    x[33, :16] *= 50
    out = cli_quant(x, "--block", "32", "--2d")
    assert (out["block_rows"], out["block_cols"]) == (2, 3)
    w = fp.Recipe.load("ue5m3-b16", sets=["fp4.weight_block=32"]).spec("w")
    q = fp.quantize(x, scale_format=w["scale_format"], block=w["block"], two_d=w["two_d"],
                    target=w["target"], rounding=w["rounding"])
    deq = np.array([row["values"] for row in out["elements"]], dtype=np.float32)
    assert np.array_equal(bits(q.dequantize()), bits(deq))
    # tiles of 16 give other values (the check can fail)
    q16 = fp.quantize(x, scale_format=w["scale_format"], block=16, two_d=True, target=w["target"])
    assert not np.array_equal(bits(q16.dequantize()), bits(deq))


def _micro(work):
    return micro_config(work, steps=6)


def _metrics(run):
    keys = ("step", "tokens", "loss", "lr", "grad_norm", "val_nll", "val_nll_quant", "telemetry")
    return [{k: x.get(k) for k in keys} for x in map(json.loads, open(run / "metrics.jsonl"))]


def _tensors(path):
    """The raw bytes of every tensor of a safetensors file (8-byte length, JSON header, data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def test_train_and_resume_bit_exact(tmp_path, fp4train_bin):
    cfg = _micro(tmp_path)
    run, plain = tmp_path / "run", tmp_path / "plain"
    run_cli(["train", "--config", cfg, "--recipe", "ue5m3-b16", "--set", "fp4.weight_block=32",
             "--out", run, "--save-every", "3", "--quiet"])
    recipe = (run / "recipe.toml").read_text()
    assert 'name = "ue5m3-b16+fp4.weight_block=32"' in recipe and "weight_block = 32\n" in recipe
    full = _metrics(run)
    assert [m["step"] for m in full] == list(range(1, 7))
    final = run / "checkpoints" / "step_00000006.safetensors"
    want = _tensors(final)

    # Block-16 weight tiles train differently from the first step on.
    run_cli(["train", "--config", cfg, "--recipe", "ue5m3-b16", "--out", plain, "--quiet"])
    assert _metrics(plain)[0]["loss"] != full[0]["loss"]

    # Resume from the step-3 checkpoint: the same steps 4..6 and final tensors, bit for bit.
    final.unlink()
    (run / "summary.json").unlink()
    p = run_cli(["train", "--resume", run, "--quiet"])
    assert (run / "summary.json").exists(), p.stdout + p.stderr
    assert json.load(open(run / "summary.json"))["resumed_from_step"] == 3
    assert _metrics(run) == full
    assert _tensors(final) == want
    shutil.rmtree(plain)
