"""Quartet II's quantizers (docs/recipes.md "Quartet II's quantizers") through the Python Recipe
binding: the quartet2 recipe's properties and serialised keys, and the refusals naming the
key."""
import pytest

import fp4train as fp


def test_quartet2_properties():
    r = fp.Recipe.load("quartet2")
    assert (r.forward_quantizer, r.backward_quantizer) == ("quartet2-rtn", "ms-eden")
    assert (r.hadamard_size, r.hadamard_gemms, r.hadamard_signs) == (128, ["dgrad", "wgrad"], "per-call")
    assert 'forward_quantizer = "quartet2-rtn"\n' in r.toml
    assert 'backward_quantizer = "ms-eden"\n' in r.toml
    back = fp.Recipe.from_toml(r.toml)
    assert (back.forward_quantizer, back.backward_quantizer) == ("quartet2-rtn", "ms-eden")
    plain = fp.Recipe.load("nvfp4-te")
    assert (plain.forward_quantizer, plain.backward_quantizer) == ("blocks", "blocks")
    assert "quantizer" not in plain.toml


@pytest.mark.parametrize("bad,key", [
    ("rounding.dy=sr8", "fp4.backward_quantizer"),
    ("fp4.weight_2d=true", "fp4.forward_quantizer"),
    ("fp4.backward_quantizer=eden", "fp4.backward_quantizer"),
    ('fp4.hadamard_gemms=["wgrad"]', "fp4.backward_quantizer"),
])
def test_quartet2_refusals_name_the_key(bad, key):
    with pytest.raises(fp.UserError, match=key.replace(".", r"\.")):
        fp.Recipe.load("quartet2", sets=[bad])
