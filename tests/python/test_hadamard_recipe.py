"""fp4.hadamard_size / hadamard_gemms / hadamard_signs through the Python Recipe binding
(docs/recipes.md "Hadamard transforms"): the properties, the defaults rht_wgrad implies, the
serialised keys, and the errors naming the key."""
import os

import pytest

import fp4train as fp
from conftest import SRC

RECIPES = os.path.join(SRC, "configs", "recipes")


def test_binding_exposes_the_hadamard_keys():
    r = fp.Recipe.load("nvfp4-te", sets=["fp4.hadamard_size=128", "fp4.hadamard_signs=per-step",
                                         'fp4.hadamard_gemms=["dgrad","wgrad"]'])
    assert (r.hadamard_size, r.hadamard_gemms, r.hadamard_signs) == (128, ["dgrad", "wgrad"], "per-step")
    assert r.rht_wgrad
    assert 'hadamard_gemms = ["dgrad", "wgrad"]\n' in r.toml
    back = fp.Recipe.from_toml(r.toml)
    assert (back.hadamard_size, back.hadamard_gemms, back.hadamard_signs) == (128, ["dgrad", "wgrad"], "per-step")
    # Every shipped recipe but quartet2 (Quartet II's own transform: test_quartet2.py): the
    # defaults rht_wgrad implies, and no hadamard key in its text.
    for name in sorted(os.listdir(RECIPES)):
        if name == "quartet2.toml":
            continue
        d = fp.Recipe.load(os.path.join(RECIPES, name))
        assert d.hadamard_size == 16 and d.hadamard_signs == "fixed", name
        assert d.hadamard_gemms == (["wgrad"] if d.rht_wgrad else []), name
        assert "hadamard" not in d.toml, name
    for bad in ("fp4.hadamard_size=48", "fp4.hadamard_signs=random", 'fp4.hadamard_gemms=["fprop"]'):
        with pytest.raises(fp.UserError, match=r"fp4\.hadamard_"):
            fp.Recipe.load("nvfp4-te", sets=[bad])
