"""examples/teacher_student.py: a short run writes the lists of docs/results.md "The
teacher–student control (Appendix C.1)", a run is bit-reproducible, and the FP4 students train
through fp4train's Linear (their loss falls)."""
import json
import os
import subprocess
import sys

SRC = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
EX = os.path.join(SRC, "examples", "teacher_student.py")


def run(out, *extra):
    p = subprocess.run([sys.executable, EX, "--steps", "6", "--seeds", "41", "--grid", "0,1024",
                        "--out", str(out), "--quiet", *extra], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads((out / "teacher_student.json").read_text())


def test_short_run_lists_and_reproducibility(tmp_path):
    a = run(tmp_path / "a")
    assert [(r["seed"], r["student"]) for r in a["runs"]] == [(41, "bf16"), (41, "fp4_sr"), (41, "fp4_rne")]
    for r in a["runs"]:
        assert r["final_eval_mse"] > 0
        # 6 steps of AdamW from the perturbed teacher lower the error (exact float64 forward).
        assert r["final_eval_mse_fp64_forward"] < r["initial_eval_mse_fp64"], r
    g = a["grid_invariance"]
    assert g["compared"] == 2 and g["base_d"] == 0
    assert len(g["differing"]) == g["compared"] - g["bit_identical"]
    b = run(tmp_path / "b")
    assert [r["final_eval_mse"] for r in a["runs"]] == [r["final_eval_mse"] for r in b["runs"]]
    assert (tmp_path / "a" / "teacher_student.md").read_text().startswith("# The teacher-student")


def test_bad_arguments_exit_2(tmp_path):
    p = subprocess.run([sys.executable, EX, "--seeds", "x", "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "comma-separated integers" in p.stderr
