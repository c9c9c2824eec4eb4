"""tools/fidelity_batch_sweep.py: the SGD-noise fraction against tokens per batch, its line fit
and crossover, on hand-built fidelity.json files whose expected figures are computed by hand."""
import json
import os
import subprocess
import sys

SRC = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(SRC, "tools", "fidelity_batch_sweep.py")


def panel(path, tokens, frac, bias2=0.03, variance=0.01):
    iv = lambda v: {"mean": v, "lo": v, "hi": v}
    path.write_text(json.dumps({"format": "fp4train.fidelity.v1", "run": "r", "tokens_per_batch": tokens,
                                "recipes": [{"name": "q", "whole": {"sgd_noise_fraction": iv(frac),
                                             "mse": iv(bias2 + variance), "bias2": iv(bias2), "variance": iv(variance)}}]}))
    return str(path)


def test_line_fit_and_crossover_by_hand(tmp_path):
    # fraction = 0.02 + 1e-5 * tokens at 1000, 4000, 16000 tokens: crossover (1 - 0.02) / 1e-5 = 98,000.
    files = [panel(tmp_path / f"p{n}.json", n, 0.02 + 1e-5 * n) for n in (4000, 1000, 16000)]
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, TOOL, *files, "--json", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    j = json.load(open(out))
    assert j["tokens_per_batch"] == [1000, 4000, 16000]
    fit = j["recipes"]["q"]["fit"]
    assert abs(fit["a"] - 0.02) < 1e-12 and abs(fit["b_per_token"] - 1e-5) < 1e-15
    assert abs(fit["crossover_tokens"] - 98000) < 1e-6
    pt = j["recipes"]["q"]["points"][0]  # bias share 0.03 / 0.04 of the fraction 0.03
    assert abs(pt["bias_part"] - 0.0225) < 1e-12 and abs(pt["variance_part"] - 0.0075) < 1e-12
    assert "98,000" in r.stdout


def test_a_falling_fraction_has_no_crossover_and_one_size_is_refused(tmp_path):
    files = [panel(tmp_path / f"p{n}.json", n, 0.1 - 1e-6 * n) for n in (1000, 2000)]
    r = subprocess.run([sys.executable, TOOL, *files], capture_output=True, text=True)
    assert r.returncode == 0 and "none (b <= 0)" in r.stdout
    same = [panel(tmp_path / "a.json", 1000, 0.1), panel(tmp_path / "b.json", 1000, 0.2)]
    r = subprocess.run([sys.executable, TOOL, *same], capture_output=True, text=True)
    assert r.returncode != 0 and "two different batch sizes" in r.stderr
