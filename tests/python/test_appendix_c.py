"""tools/appendix_c.py: its closed form for a snapped Gaussian residual against hand values and a
Monte Carlo of its own, and a small run that writes every list of docs/results.md "The
accumulator's statistics (Appendix C)"."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np

SRC = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(SRC, "tools", "appendix_c.py")
spec = importlib.util.spec_from_file_location("appendix_c", TOOL)
ac = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ac)


def test_closed_form_by_hand():
    s = 1 / 4096
    # d = 2048: the zero cell is |e| < 1/4096 = sigma, so P(zero) = P(|Z| < 1) = erf(1/sqrt 2).
    zf, g, r = ac.closed_form(2048, s)
    assert abs(zf - math.erf(1 / math.sqrt(2))) < 1e-12
    assert ac.closed_form(0, s) == (0.0, 1.0, 0.0)  # no snap: the identity
    # A grid far coarser than sigma maps (nearly) everything to 0: gain 0, RMSE sigma.
    zf, g, r = ac.closed_form(1, s)
    assert zf > 1 - 1e-12 and abs(g) < 1e-12 and abs(r - s) < 1e-12
    # A grid far finer than sigma: gain 1, RMSE h / sqrt(12) (uniform rounding error).
    zf, g, r = ac.closed_form(1 << 20, s)
    assert abs(g - 1) < 1e-6 and abs(r - 2.0 ** -20 / math.sqrt(12)) / r < 1e-3


def test_closed_form_matches_monte_carlo():
    rng = np.random.default_rng(5)
    s = 1 / 4096
    e = s * rng.standard_normal(1_000_000)
    for d in (512, 1024, 4096):
        q = np.rint(e * d) / d
        zf, g, r = ac.closed_form(d, s)
        z_hat = np.mean(q == 0)
        assert abs(z_hat - zf) < 5 * math.sqrt(zf * (1 - zf) / e.size) + 1e-9, d
        assert abs(np.dot(q, e) / np.dot(e, e) - g) < 0.01, d
        assert abs(math.sqrt(np.mean((q - e) ** 2)) - r) / r < 0.01, d


def test_small_run_writes_the_issue_lists(tmp_path):
    p = subprocess.run([sys.executable, TOOL, "--rows", "64", "--k", "64", "--boot", "100",
                        "--out", str(tmp_path), "--quiet"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / "accumulator.json").read_text())
    assert len(res["dots"]) == 5 * 2 * 2 * 4
    for key in ("distribution", "rho", "mode", "variant", "magnitude_bias_ppm", "gain_error_ppm",
                "cosine", "relative_l2", "rmse"):
        assert key in res["dots"][0], key
    assert {r["variant"] for r in res["dots"]} == {"rne", "rne_grid", "rtz", "rtz_grid"}
    assert len(res["input_quantization"]) == 10 and "relative_rms" in res["input_quantization"][0]
    assert {"distribution", "variant", "gain_error_ppm", "cosine"} <= set(res["regression"][0])
    assert {"distribution", "scale", "sigma", "variant", "rms", "zero_fraction", "gain"} <= set(res["cancellation"][0])
    assert {"d", "zero_fraction", "gain", "rmse", "zero_fraction_closed_form"} <= set(res["grid_sweep"][0])
    assert all(r["agrees_with_closed_form"] for r in res["grid_sweep"])
    # Without a snap, RNE additions of exact chunk sums are unbiased to well under 1 ppm here.
    assert all(abs(r["gain_error_ppm"]) < 1 for r in res["dots"] if r["variant"] == "rne")
    assert (tmp_path / "accumulator.md").read_text().startswith("# Appendix C")
    bad = subprocess.run([sys.executable, TOOL, "--k", "30"], capture_output=True, text=True)
    assert bad.returncode == 2 and "multiple of 16" in bad.stderr
