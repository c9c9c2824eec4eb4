"""Four Over Six (docs/recipes.md "Four Over Six", docs/numerics.md "Four Over Six") through the
binding: the Recipe's 4/6 properties and specs, quantize(four_over_six=...) against `fp4train
quant --four-over-six` on the same numbers, and the errors."""
import numpy as np
import pytest

import fp4train as fp


def test_recipe_properties_and_specs():
    r = fp.Recipe.load("nvfp4-te-4over6")
    assert (r.four_over_six, r.four_over_six_error, r.four_over_six_scale_target) == ("all", "mae", 256.0)
    for role in ("x", "w", "dy"):
        s = r.spec(role)
        assert s["four_over_six"] == "mae" and s["target"] == 256.0, (role, s)
    base = fp.Recipe.load("nvfp4-te")
    assert base.four_over_six == "none" and base.four_over_six_scale_target == base.scale_target
    assert "four_over_six" not in base.spec("x")  # the dicts of recipes without 4/6 are unchanged
    w = fp.Recipe.load("ue5m3-b16", sets=["fp4.four_over_six=weights", "fp4.four_over_six_error=mse"])
    assert w.spec("w")["four_over_six"] == "mse" and "four_over_six" not in w.spec("x")
    assert 'four_over_six = "weights"\nfour_over_six_error = "mse"\n' in w.toml
    with pytest.raises(fp.UserError, match=r"fp4\.four_over_six"):
        fp.Recipe.load("ue5m3-b16", sets=["fp4.four_over_six=half"])


def test_quantize_matches_the_cli(cli_quant):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 48)).astype(np.float32)
    x[2, :16] = [6, 5, 1, 1, 1, 1] + [0] * 10  # the hand-computed block of test_four_over_six
    for mode in ("mae", "mse"):
        kw = dict(scale_format="e4m3", target=256.0, reference=1536.0, four_over_six=mode)
        q = fp.quantize(x, **kw)
        js = cli_quant(x, "--scale-format", "e4m3", "--target", "256", "--reference", "1536",
                       "--four-over-six", mode)
        assert js["spec"]["four_over_six"] == mode
        assert [b["scale"] for b in js["blocks"]] == q.scales.ravel().tolist()
        assert [c for e in js["elements"] for c in e["codes"]] == q.codes.ravel().tolist()
        assert q.facts["four_over_six"] == mode
    # Block 2 row 2 (index 2·3 = 6): MAE keeps scale 1, MSE picks 1.5.
    assert fp.quantize(x, scale_format="e4m3", target=256.0, reference=1536.0,
                       four_over_six="mse").scales.ravel()[6] == 1.5
    assert fp.quantize(x, scale_format="e4m3", target=256.0, reference=1536.0,
                       four_over_six="mae").scales.ravel()[6] == 1.0


def test_quantize_errors():
    x = np.ones((1, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="four_over_six"):
        fp.quantize(x, four_over_six="MAE")
    with pytest.raises(ValueError, match="tensor scale"):
        fp.quantize(x, scale_format="ue8m0", scale_rule="mx-te", four_over_six="mae")
