"""Recipe.load and its per-linear plan against `fp4train info --json`; Config; load_run of a
micro run trained by `fp4train train` (config, recipe, metrics.jsonl, checkpoint tensors by
parameter name, checked against the checkpoint file's flat buffer read independently)."""
import json
import os
import struct

import numpy as np
import pytest

import fp4train as fp
from conftest import SRC, micro_config, run_cli

TINY = os.path.join(SRC, "configs", "tiny.toml")


@pytest.mark.parametrize("recipe", ["ue5m3-b16", "nvfp4-te", "mxfp4", "ue5m3-b16-t2048", "fp32"])
def test_plan_matches_info(recipe):
    info = json.loads(run_cli(["info", "--config", TINY, "--recipe", recipe, "--json"]).stdout)
    r = fp.Recipe.load(recipe)
    plan = r.plan(fp.Config.load(TINY))
    got = [(p["name"], p["block"], p["kind"], list(p["shape"]), p["mode"], p["overrides"]) for p in plan]
    want = [(l["name"], l["block"], l["kind"], l["shape"], l["mode"], l["overrides"]) for l in info["linears"]]
    assert got == want


def test_resolve_run_as_the_commands_do():
    sets = ["train.lr=1e-3", "fp4.block=32", "high_precision.final_blocks=1"]
    run = fp.resolve_run(TINY, "ue5m3-b16", sets)
    # the label train gives the run directory: the config's stem and its config overrides
    assert run.label == "tiny+train.lr=1e-3"
    assert run.recipe.name == "ue5m3-b16+fp4.block=32+high_precision.final_blocks=1"
    assert run.recipe.block == 32 and run.config.as_dict()["train"]["lr"] == 1e-3
    # the plans resolved with the run are Recipe.plan's on the same config, and info's
    want = fp.Recipe.load("ue5m3-b16", sets=sets[1:]).plan(fp.Config.load(TINY, sets=sets[:1]))
    assert run.plan() == want
    modes = [p["mode"] for p in run.plan()]
    assert modes[-3:] == ["bf16", "bf16", "fp32"], modes  # the final block (up, down_proj), lm_head
    with pytest.raises(fp.UserError, match="train.bogus"):
        fp.resolve_run(TINY, "ue5m3-b16", ["train.bogus=1"])
    with pytest.raises(fp.UserError, match="does not exist"):
        fp.resolve_run(TINY, "ue5m3-b16", [], data="/nonexistent/corpus")


def test_plan_specs_by_hand():
    cfg = fp.Config.load(TINY)
    plan = {p["name"]: p for p in fp.Recipe.load("ue5m3-b16-t2048").plan(cfg)}
    down = plan["layers.7.mixer.down_proj"]["specs"]
    # the recipe file: T = 2048 only for dY of wgrad in the final four down_proj linears
    assert down["wgrad"]["dy"]["target"] == 2048.0
    assert down["dgrad"]["dy"]["target"] == 448.0
    assert down["wgrad"]["dy"]["rounding"] == "sr8" and down["fprop"]["x"]["rounding"] == "rne"
    assert down["fprop"]["w"]["two_d"] and not down["fprop"]["x"]["two_d"]
    assert set(down) == {"fprop", "dgrad", "wgrad"}
    assert set(down["fprop"]) == {"x", "w"} and set(down["wgrad"]) == {"dy", "x"}
    q = plan["layers.0.mixer.q_proj"]["specs"]
    assert q["wgrad"]["dy"]["target"] == 448.0
    assert plan["lm_head"]["mode"] == "fp32" and plan["lm_head"]["specs"] is None
    nv = {p["name"]: p for p in fp.Recipe.load("nvfp4-te").plan(cfg)}
    # round(0.15 * 8 blocks) = 1: the last MLP block in BF16 (docs/models.md "Models: Llama-style
    # and the Nemotron-H hybrid")
    assert nv["layers.7.mixer.up_proj"]["mode"] == "bf16" and nv["layers.6.mixer.q_proj"]["mode"] == "fp4"
    assert nv["layers.0.mixer.q_proj"]["specs"]["fprop"]["x"]["scale_format"] == "e4m3"
    mx = fp.Recipe.load("mxfp4")
    assert mx.spec("x")["scale_format"] == "ue8m0" and mx.block == 32


def test_recipe_fields_and_sets():
    r = fp.Recipe.load("nvfp4-te")
    assert r.rht_wgrad and r.scale_format == "e4m3" and r.mode == "fp4"
    r2 = fp.Recipe.load(os.path.join(SRC, "configs", "recipes", "ue5m3-b16.toml"), sets=["fp4.block=32"])
    assert r2.block == 32 and r2.name == "ue5m3-b16+fp4.block=32"
    assert fp.Recipe.from_toml(r2.toml).block == 32
    with pytest.raises(fp.UserError, match="fp4.block"):
        fp.Recipe.load("ue5m3-b16", sets=["fp4.block=-1"])
    c = fp.Config.load(TINY, sets=["model.d_model=128"])
    assert "d_model = 128" in c.toml and c.pattern == "*-*-*-*-"


def read_safetensors(path):
    """Independent reader of the safetensors layout (8-byte length, JSON header, raw data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        dt = {"F32": np.float32, "F64": np.float64, "U8": np.uint8}[v["dtype"]]
        out[k] = np.frombuffer(data[b:e], dt).reshape(v["shape"])
    return out


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory, fp4train_bin):
    work = tmp_path_factory.mktemp("run")
    cfg = micro_config(work, steps=3)
    out = work / "out"
    run_cli(["train", "--config", cfg, "--recipe", "ue5m3-b16", "--out", out, "--quiet"])
    return out


def test_load_run(micro_run):
    run = fp.load_run(micro_run)
    assert run.recipe.name == "ue5m3-b16" and run.config.pattern == "*-"
    assert [m["step"] for m in run.metrics] == [1, 2, 3]
    lines = [json.loads(l) for l in open(micro_run / "metrics.jsonl")]
    assert run.metrics == lines
    assert "telemetry" in run.metrics[0]
    assert run.summary["status"] == "completed"
    ck = run.checkpoint
    assert ck.step == 3
    flat = read_safetensors(ck.file)["params"]
    names = ck.param_names
    assert names[0] == "embeddings" and names[-2:] == ["norm_f", "lm_head"]
    assert "layers.0.mixer.q_proj" in names and "layers.1.mixer.down_proj" in names
    params = run.params
    assert list(params) == names
    assert params["embeddings"].shape == (512, 32)
    assert params["layers.1.mixer.up_proj"].shape == (64, 32)
    assert params["layers.0.norm"].shape == (1, 32)
    # the named tensors tile the flat buffer in order
    cat = np.concatenate([params[n].ravel() for n in names])
    assert np.array_equal(cat.view(np.uint32), flat.view(np.uint32))
    assert np.array_equal(np.asarray(ck.losses), [m["loss"] for m in run.metrics])
    assert set(ck.adam_m) == set(names)
    # D = 50: every FP4 linear holds its references (x, w, dy) after step 1
    held = {(r["linear"], r["role"]) for r in ck.references if r["has_value"]}
    assert ("layers.0.mixer.q_proj", 0) in held and ("layers.1.mixer.down_proj", 2) in held
    assert fp.load_run(micro_run, checkpoint=False).checkpoint is None


def test_load_run_of_a_compacted_run(micro_run, tmp_path):
    """`fp4train compact` replaces metrics.jsonl by metrics.jsonl.zst; load_run reads the same
    metrics from it, and refuses a truncated archive or a directory holding both files."""
    import shutil
    d = tmp_path / "run"
    shutil.copytree(micro_run, d, ignore=shutil.ignore_patterns("checkpoints", ".fp4train.lock"))
    plain = fp.load_run(d, checkpoint=False).metrics
    out = run_cli(["compact", d]).stdout
    assert "metrics.jsonl.zst" in out, out
    assert not (d / "metrics.jsonl").exists() and (d / "metrics.jsonl.zst").exists()
    assert fp.load_run(d, checkpoint=False).metrics == plain
    z = (d / "metrics.jsonl.zst").read_bytes()
    (d / "metrics.jsonl.zst").write_bytes(z[: len(z) // 2])
    with pytest.raises(fp.UserError, match="metrics.jsonl.zst: truncated zstd data"):
        fp.load_run(d, checkpoint=False)
    (d / "metrics.jsonl.zst").write_bytes(z)
    shutil.copy(micro_run / "metrics.jsonl", d / "metrics.jsonl")
    with pytest.raises(fp.UserError, match="holds both metrics.jsonl and metrics.jsonl.zst"):
        fp.load_run(d, checkpoint=False)


def test_load_run_errors(tmp_path):
    with pytest.raises(fp.UserError, match="not a run directory"):
        fp.load_run(tmp_path / "missing")
    with pytest.raises(fp.UserError, match="config.toml"):
        fp.load_run(tmp_path)
