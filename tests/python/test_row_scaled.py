"""fp4.row_scaled_activation (docs/numerics.md "Per-row reference"): the Recipe binding's key
(parsed, written only when set, refused with a held reference), and `fp4train quant
--row-scaled` on the hand-computed case of tests/numerics/test_row_scaled.cpp: two rows 2^20
apart, the small one keeping its codes per row and losing them per tensor."""
import os

import numpy as np
import pytest

import fp4train as fp
from conftest import SRC, bits, f32, run_cli

RECIPES = os.path.join(SRC, "configs", "recipes")


def test_binding_exposes_the_key():
    r = fp.Recipe.load("nvfp4-te", sets=["fp4.row_scaled_activation=true"])
    assert r.row_scaled_activation
    assert "row_scaled_activation = true\n" in r.toml
    assert fp.Recipe.from_toml(r.toml).row_scaled_activation
    assert "row-scaled X" in repr(r)
    for name in sorted(os.listdir(RECIPES)):  # every shipped recipe: off, and not written
        d = fp.Recipe.load(os.path.join(RECIPES, name))
        assert not d.row_scaled_activation and "row_scaled" not in d.toml, name
    with pytest.raises(fp.UserError, match=r"fp4\.row_scaled_activation.*amax_interval = 50"):
        fp.Recipe.load("ue5m3-b16", sets=["fp4.row_scaled_activation=true"])


def test_quant_row_scaled_hand_computed(cli_quant):
    u = np.float32(448.0) * np.float32(2.0 ** -20)
    x = np.zeros((2, 16), np.float32)
    x[0, 0] = 2688.0
    x[1, :8] = -u * np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)
    per_row = cli_quant(x, "--scale-format", "e4m3", "--row-scaled")
    assert per_row["row_scaled"] and per_row["row_g"] == [2688.0, float(6 * u)]
    assert per_row["row_ge"] == [1.0, 2.0 ** 20] and per_row["row_gd"][1] == 2.0 ** -20
    assert per_row["elements"][1]["codes"][:8] == list(range(8, 16))
    assert per_row["blocks"][1]["scale_code"] == 0x7E and per_row["blocks"][1]["decode_scale"] == float(u)
    got = np.array([[f32(v) for v in e["values"]] for e in per_row["elements"]], np.float32)
    assert (bits(got) == bits(x)).all()  # every value on the grid: exact
    per_tensor = cli_quant(x, "--scale-format", "e4m3")
    assert per_tensor["elements"][1]["codes"][:8] == [8] * 8
    assert "row_g" not in per_tensor


def test_quant_row_scaled_errors(tmp_path):
    m = tmp_path / "m.txt"
    m.write_text("1 2\n3 4\n")
    for extra, what in ((["--reference", "4"], "--reference"), (["--2d"], "--2d"),
                        (["--scale-rule", "mx-te", "--scale-format", "ue8m0"], "mx")):
        p = run_cli(["quant", m, "--row-scaled", *extra], check=False)
        assert p.returncode == 2 and "--row-scaled" in p.stderr and what in p.stderr, p.stderr
