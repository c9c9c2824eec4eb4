"""tools/fidelity_calibration.py: Spearman's rho between a fidelity panel metric and a study's
mean loss, on hand-built panels and study directories whose expected figures are computed by
hand below."""
import json
import os
import subprocess
import sys

SRC = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(SRC, "tools", "fidelity_calibration.py")
sys.path.insert(0, os.path.join(SRC, "tools"))
import fidelity_calibration as fc  # noqa: E402


def test_ranks_average_ties_and_spearman_by_hand():
    assert fc.ranks([3.0, 1.0, 2.0]) == [3.0, 1.0, 2.0]
    assert fc.ranks([1.0, 2.0, 2.0, 3.0]) == [1.0, 2.5, 2.5, 4.0]
    # x ranks [1, 2.5, 2.5, 4] against y ranks [1, 2, 3, 4]: sxy = 4.5, sxx = 4.5, syy = 5.
    assert abs(fc.spearman([1, 2, 2, 3], [1, 2, 3, 4]) - 4.5 / (4.5 * 5) ** 0.5) < 1e-12
    assert fc.spearman([1, 2, 3], [30, 20, 10]) == -1.0
    assert fc.spearman([1, 1, 1], [1, 2, 3]) is None


def write(tmp, panel, losses):
    p = tmp / "fidelity.json"
    p.write_text(json.dumps({"format": "fp4train.fidelity.v1", "recipes": [
        {"name": n, "whole": {"rel_error": {"mean": v}, "loss_penalty": {"mean": -v}}} for n, v in panel.items()]}))
    for name, seeds in losses.items():
        for i, l in enumerate(seeds, 1):
            d = tmp / "study" / f"{name}-s{i}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"recipe": name, "status": "completed", "final_window_loss": l}))
    return str(p), str(tmp / "study")


def test_monotone_panel_gives_rho_one_with_a_point_interval(tmp_path):
    panel, study = write(tmp_path, {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4, "skip": 9.0},
                         {"a": [4.0, 4.2], "b": [4.3], "c": [4.35, 4.45], "d": [4.6]})
    out = tmp_path / "cal.json"
    r = subprocess.run([sys.executable, TOOL, panel, study, "--resamples", "500", "--json", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    j = json.load(open(out))
    rel, pen = j["rows"]
    assert rel["metric"] == "rel_error" and rel["recipes"] == 4  # "skip" has no study runs
    assert rel["spearman"] == 1.0 and rel["lo"] == 1.0 and rel["hi"] == 1.0
    assert pen["spearman"] == -1.0 and pen["lo"] == -1.0 and pen["hi"] == -1.0
    assert j["recipes"]["a"] == {"seeds": 2, "final_window_loss": 4.1}
    # --exclude leaves a recipe out.
    r = subprocess.run([sys.executable, TOOL, panel, study, "--resamples", "50", "--exclude", "a,b",
                        "--json", str(out)], capture_output=True, text=True)
    assert r.returncode != 0 and "only 2 recipes" in r.stderr


def test_bad_input_is_named(tmp_path):
    (tmp_path / "x.json").write_text('{"format": "other"}')
    r = subprocess.run([sys.executable, TOOL, str(tmp_path / "x.json"), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "is not a fidelity.json" in r.stderr
    panel, study = write(tmp_path, {"a": 0.1, "b": 0.2, "c": 0.3}, {"a": [4.0], "b": [4.1], "c": [4.2]})
    r = subprocess.run([sys.executable, TOOL, panel, study, "--metric", "nope"], capture_output=True, text=True)
    assert r.returncode != 0 and "'nope' is not in the panel" in r.stderr
