"""tools/appendix_c.py: its closed form for a snapped Gaussian residual against hand values and a
Monte Carlo of its own, the regression probe's gradient and the input quantization's relative L2
on hand-computed cases, and a small run that writes every list of docs/results.md "The
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


def test_quantization_only_l2_by_hand():
    # Three dots of length 2. Unquantized u = [1, 2, 2] (||u|| = 3); quantized q = [1, 3, 0.5]:
    # errors [0, 1, -1.5], ||q - u|| = sqrt(3.25). One norm over all the dots: sqrt(3.25) / 3.
    # (Per-dot relative errors averaged would give (0 + 1/2 + 3/4) / 3; normalised by ||q||,
    # sqrt(3.25 / 10.25); both differ.)
    f = np.float32
    x = np.array([[1, 0], [1, 1], [2, 0]], f)
    w = np.array([[1, 0], [1, 1], [1, 0]], f)
    xq = np.array([[1, 0], [2, 1], [0.5, 0]], f)
    assert ac.quantization_only_l2(x, w, xq, w) == math.sqrt(3.25) / 3
    assert ac.relative_l2(np.array([1.0, 3.0, 0.5]), np.array([1.0, 2.0, 2.0])) == math.sqrt(3.25) / 3


def test_regression_gradient_by_hand():
    """128 examples x 128 features, chunks of 64, so both the forward (over the features) and the
    gradient (over the examples) add two chunk partials. Nonzero: X[0, 0] = 1,
    X[0, 64] = 3*2^-25, X[64, 0] = 1; beta = 1; y[0] = 1 - 2^-10, y[64] = 1 - 3*2^-35, the other
    examples' forward and target 0.
      forward 0: 1 + 3*2^-25 = 1 + 0.75 ulp(1): RTZ 1, RNE 1 + 2^-23;
      residual 0 (f - y in FP32): RTZ 2^-10, RNE 2^-10 + 2^-23 (exact: 2^-10 + 3*2^-25);
      residual 64: 3*2^-35 (forward exactly 1) = 0.75 ulp(2^-10);
      gradient 0 = r0 + r64 across the two example chunks: RTZ 2^-10 (truncates 0.75 ulp),
        RNE 2^-10 + 2^-23 + 2^-33 (rounds it up); exact 2^-10 + 3*2^-25 + 3*2^-35;
      gradient 64 = 3*2^-25 * r0 (one term, exact): RTZ 3*2^-35, RNE 3*2^-35 + 3*2^-48;
        exact 3*2^-35 + 9*2^-50;
      every other component 0."""
    n = p = 128
    X = np.zeros((n, p), np.float32)
    X[0, 0], X[0, 64], X[64, 0] = 1.0, 3 * 2.0 ** -25, 1.0
    b = np.ones(p, np.float32)
    y = np.zeros(n)
    y[0], y[64] = 1 - 2.0 ** -10, 1 - 3 * 2.0 ** -35
    want = {
        "rtz": ([1.0, 2.0 ** -10, 2.0 ** -10, 3 * 2.0 ** -35]),
        "rne": ([1 + 2.0 ** -23, 2.0 ** -10 + 2.0 ** -23, 2.0 ** -10 + 2.0 ** -23 + 2.0 ** -33,
                 3 * 2.0 ** -35 + 3 * 2.0 ** -48]),
    }
    for rnd, (f0, r0, g0, g64) in want.items():
        f, r, g = ac.regression_gradient(X, b, y, rnd, 0)
        assert f.dtype == r.dtype == g.dtype == np.float32
        assert f[0] == f0 and f[64] == 1.0, rnd
        assert r[0] == r0 and r[64] == 3 * 2.0 ** -35, rnd
        assert g[0] == g0 and g[64] == g64, rnd
        assert not np.any(np.delete(g, [0, 64])), rnd
    g_ref, f_ref = ac.regression_reference(X, b, y)
    assert f_ref[0] == 1 + 3 * 2.0 ** -25
    assert g_ref[0] == 2.0 ** -10 + 3 * 2.0 ** -25 + 3 * 2.0 ** -35
    assert g_ref[64] == 3 * 2.0 ** -35 + 9 * 2.0 ** -50
    assert not np.any(np.delete(g_ref, [0, 64]))
    # The grid acts on the forward (1 + 2^-23 snaps to 1, so r0 = 2^-10) and on the gradient
    # (2^-10 + 2^-33 snaps to 2^-10, one grid step; 3*2^-35 to 0).
    f, r, g = ac.regression_gradient(X, b, y, "rne", 1024)
    assert f[0] == 1.0 and r[0] == 2.0 ** -10 and g[0] == 2.0 ** -10 and not np.any(np.delete(g, 0))


def test_small_run_writes_the_issue_lists(tmp_path):
    p = subprocess.run([sys.executable, TOOL, "--rows", "64", "--k", "64", "--boot", "100", "--reg-draws",
                        "2", "--iq-draws", "2", "--out", str(tmp_path), "--quiet"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / "accumulator.json").read_text())
    assert len(res["dots"]) == 5 * 2 * 2 * 4
    for key in ("distribution", "rho", "mode", "variant", "magnitude_bias_ppm", "gain_error_ppm",
                "cosine", "relative_l2", "rmse"):
        assert key in res["dots"][0], key
    assert {r["variant"] for r in res["dots"]} == {"rne", "rne_grid", "rtz", "rtz_grid"}
    assert len(res["input_quantization"]) == 5 * 2 * 2
    assert {"distribution", "rho", "mode", "relative_l2", "relative_l2_ci"} <= set(res["input_quantization"][0])
    assert len(res["regression"]) == 3 * 2 * 4
    assert {r["distribution"] for r in res["regression"]} == {"gaussian", "student_t3", "contaminated_gaussian"}
    assert {"distribution", "mode", "variant", "gain_error_ppm", "cosine",
            "forward_gain_error_ppm"} <= set(res["regression"][0])
    assert [(r["distribution"], r["variant"], r["draws"]) for r in res["regression_draws"]] == [
        (d, v, 2) for d in ("gaussian", "student_t3", "contaminated_gaussian") for v in ("rne", "rtz")]
    main = {(r["distribution"], r["variant"]): r["gain_error_ppm"] for r in res["regression"] if r["mode"] == "bf16"}
    assert all(r["gain_error_ppm"][0] == main[(r["distribution"], r["variant"])] for r in res["regression_draws"])
    assert len(res["input_quantization_draws"]) == 5 and res["input_quantization_draws"][0]["draws"] == 2
    assert {"distribution", "scale", "sigma", "variant", "rms", "zero_fraction", "gain"} <= set(res["cancellation"][0])
    assert {"d", "zero_fraction", "gain", "rmse", "zero_fraction_closed_form"} <= set(res["grid_sweep"][0])
    assert all(r["agrees_with_closed_form"] for r in res["grid_sweep"])
    # Without a snap, RNE additions of exact chunk sums are unbiased to well under 1 ppm here.
    assert all(abs(r["gain_error_ppm"]) < 1 for r in res["dots"] if r["variant"] == "rne")
    assert (tmp_path / "accumulator.md").read_text().startswith("# Appendix C")
    bad = subprocess.run([sys.executable, TOOL, "--k", "30"], capture_output=True, text=True)
    assert bad.returncode == 2 and "multiple of 16" in bad.stderr
