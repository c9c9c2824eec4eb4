"""tools/plot_fidelity.py: the four plots of a fidelity panel from a hand-built fidelity.json,
the linear-kind grouping, and clear errors (exit status 2) for input that is not a panel."""
import json
import os
import subprocess
import sys

import pytest

SRC = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(SRC, "tools", "plot_fidelity.py")
sys.path.insert(0, os.path.join(SRC, "tools"))
import plot_fidelity as pf  # noqa: E402

PLOTS = ["fidelity_error.png", "fidelity_over_steps.png", "fidelity_bias_variance.png",
         "fidelity_sgd_noise.png"]


def stat(m):
    return {"mean": m, "lo": m * 0.9, "hi": m * 1.1}


def recipe(name, err, has_sr=True):
    metrics = {"rel_error": stat(err), "bias2": stat(err * err * 0.7),
               "variance": stat(err * err * 0.3 if has_sr else 0.0),
               "sgd_noise_fraction": stat(err / 4), "loss_penalty": stat(err / 30)}
    return {"name": name, "has_sr": has_sr, "whole": metrics, "linears": metrics,
            "params": {"layers.0.mixer.q_proj": {"rel_error": err},
                       "layers.1.mixer.q_proj": {"rel_error": err + 0.1},
                       "layers.1.mixer.down_proj": {"rel_error": err / 2},
                       "layers.0.norm": {"rel_error": 9.0}},
            "by_checkpoint": [{"step": s, "rel_error": err + s / 1e4, "loss_penalty": s / 1e5}
                              for s in (80, 160)]}


def panel(tmp_path, recipes):
    p = tmp_path / "fidelity.json"
    p.write_text(json.dumps({"format": "fp4train.fidelity.v1", "checkpoints": [80, 160],
                             "batches": 4, "draws": 2, "tokens_per_batch": 512,
                             "recipes": recipes}))
    return p


def test_kind_of_and_kind_means_group_linears_and_skip_norms():
    assert pf.kind_of("layers.3.mixer.q_proj") == "q_proj"
    assert pf.kind_of("lm_head") == "lm_head"
    assert pf.kind_of("layers.0.norm") is None
    assert pf.kind_of("embeddings") is None
    # q_proj: the mean of 0.2 and 0.3; down_proj 0.1; the norm's 9.0 is not a linear.
    means = pf.kind_means(recipe("r", 0.2))
    assert set(means) == {"q_proj", "down_proj"}
    assert abs(means["q_proj"] - 0.25) < 1e-12 and abs(means["down_proj"] - 0.1) < 1e-12


def test_writes_the_four_plots(tmp_path):
    p = panel(tmp_path, [recipe("ue5m3-b16", 0.22), recipe("ue5m3-b16-rne", 0.2, False),
                         recipe("bf16", 0.004, False)])
    out = tmp_path / "figs"
    r = subprocess.run([sys.executable, TOOL, str(p), "--out", str(out), "--title", "t"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in PLOTS:
        f = out / name
        assert f.exists(), name
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert r.stdout.split() == [str(out / n) for n in PLOTS]


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"),
    (json.dumps({"format": "fp4train.eval.v1"}), "is not a fidelity panel"),
    (json.dumps({"format": "fp4train.fidelity.v1", "recipes": []}), "no recipes"),
    (json.dumps({"format": "fp4train.fidelity.v1", "recipes": [{"name": "a"}]}),
     "recipes[0] has no 'whole'"),
])
def test_bad_input_exits_2_naming_the_problem(tmp_path, content, message):
    p = tmp_path / "fidelity.json"
    p.write_text(content)
    r = subprocess.run([sys.executable, TOOL, str(p), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert message in r.stderr and str(p) in r.stderr


def test_missing_file_exits_2(tmp_path):
    r = subprocess.run([sys.executable, TOOL, str(tmp_path / "absent.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cannot read" in r.stderr
