"""tools/plot_rollout.py: the plots of a rollout set from hand-built rollout.json files (with
and without the optional stability counts, with a diverged rollout) and from the committed
docs/results/rollout-study; the ordering of recipes; clear errors (exit status 2). The plots
need matplotlib (skipped without it); the errors do not."""
import json
import os
import subprocess
import sys

import pytest

SRC = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(SRC, "tools", "plot_rollout.py")
sys.path.insert(0, os.path.join(SRC, "tools"))
import plot_rollout as pr
import rollout_stats as rs  # noqa: E402

PLOTS = ["rollout_gap_by_step.png", "rollout_nll.png", "rollout_divergence.png"]
PNG = b"\x89PNG\r\n\x1a\n"


def rollout(counts=None, K=2, O=2, N=4):
    """fp32 and three recipes; recipe r's loss and NLLs are fp32's + 0.01 r (+ a little per
    rollout); `counts` adds {name: value} to every trace."""
    recipes = ["fp32 (reference)", "x", "y", "z"]
    traces = []
    for r in range(len(recipes)):
        by_c = []
        for c in range(K):
            by_o = []
            for o in range(O):
                e = 0.01 * r + 0.001 * (c + o) * (r > 0)
                t = {"loss": [4.0 - 0.01 * k + e for k in range(N)], "nll": 4.5 + e,
                     "nll_fp32": 4.5 + e / 2, "divergence": 0.1 * r, "diverged": ""}
                t.update(counts or {})
                by_o.append(t)
            by_c.append(by_o)
        traces.append(by_c)
    return {"format": "fp4train.rollout.v1", "run": "runs/x", "steps": [100, 200][:K],
            "recipes": recipes, "length": N, "orders": O, "windows": 8, "seed": 1,
            "machine": "test", "traces": traces}


def run(*args):
    return subprocess.run([sys.executable, TOOL] + [str(a) for a in args], capture_output=True,
                          text=True)


def write(tmp_path, d):
    p = tmp_path / "rollout.json"
    p.write_text(d if isinstance(d, str) else json.dumps(d))
    return p


def test_ordered_puts_recipes_by_mean_and_the_non_finite_last():
    stats = {1: {"mean": 0.3}, 2: None, 3: {"mean": -0.1}, 4: {"mean": 0.2}}
    assert pr.ordered(stats) == [3, 4, 1, 2]


def test_counts_present_only_when_every_trace_has_grad_norms():
    d = rollout(counts={"grad_norm": [0.5] * 4})
    assert pr.counts_present(d) == ["spikes", "gnorm_excursions", "nonfinite"]
    del d["traces"][2][1][0]["grad_norm"]
    assert pr.counts_present(d) == []


def test_stability_counts_as_rollout_md_counts_them():
    # fp32 losses L, the recipe's L + gap: gaps 0.05, 0.2, -0.3, 0.15 nats; grad norms 0.5, 1.5,
    # 1.0, 2.0. Spikes above 0.1: steps 2 and 4 -> 2; norms above 1: steps 2 and 4 -> 2 (1.0 is
    # not above); not diverged -> 0. With the threshold 0.16: only step 2 -> 1.
    ref = {"loss": [5.0, 5.0, 5.0, 5.0]}
    t = {"loss": [5.05, 5.2, 4.7, 5.15], "grad_norm": [0.5, 1.5, 1.0, 2.0], "diverged": ""}
    assert rs.stability_counts(t, ref, 0.1, 1.0) == {"spikes": 2, "gnorm_excursions": 2, "nonfinite": 0}
    assert rs.stability_counts(t, ref, 0.16, 1.0)["spikes"] == 1
    # A diverged rollout: nulls after its stop count nothing; non-finite 1.
    t = {"loss": [5.3, None, None, None], "grad_norm": [3.0, None, None, None], "diverged": "step 2: x"}
    assert rs.stability_counts(t, ref, 0.1, 1.0) == {"spikes": 1, "gnorm_excursions": 1, "nonfinite": 1}


def test_writes_the_three_plots(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figs"
    r = run(write(tmp_path, rollout()), "--out", out, "--title", "t")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(out / n) for n in PLOTS]
    for n in PLOTS:
        assert (out / n).read_bytes()[:8] == PNG, n
    assert not (out / "rollout_stability.png").exists()


def test_stability_counts_when_present(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figs"
    r = run(write(tmp_path, rollout(counts={"grad_norm": [0.5, 1.5, 0.7, 2.0]})), "--out", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == str(out / "rollout_stability.png")
    assert (out / "rollout_stability.png").read_bytes()[:8] == PNG


def test_a_diverged_rollout_is_left_out_not_a_crash(tmp_path):
    pytest.importorskip("matplotlib")
    d = rollout()
    t = d["traces"][2][0][1]
    t["loss"][3], t["nll"], t["nll_fp32"], t["divergence"] = None, None, None, None
    t["diverged"] = "step 4: loss is not finite"
    r = run(write(tmp_path, d), "--out", tmp_path / "figs")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) == 3


def test_the_committed_rollout_study(tmp_path):
    pytest.importorskip("matplotlib")
    src = os.path.join(SRC, "docs", "results", "rollout-study", "rollout.json")
    r = run(src, "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    for n in PLOTS:
        assert (tmp_path / n).read_bytes()[:8] == PNG, n


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"),
    (json.dumps({"format": "fp4train.fidelity.v1"}), "is not a rollout.json"),
    (json.dumps({**rollout(), "traces": rollout()["traces"][:2]}),
     "'traces' does not hold one entry per recipe"),
    (json.dumps({**rollout(), "recipes": ["fp32 (reference)"],
                 "traces": rollout()["traces"][:1]}), "no recipe besides the fp32 reference"),
])
def test_bad_input_exits_2_naming_the_problem(tmp_path, content, message):
    r = run(write(tmp_path, content), "--out", tmp_path / "o")
    assert r.returncode == 2
    assert "plot_rollout.py: error:" in r.stderr and message in r.stderr, r.stderr


def test_missing_file_exits_2(tmp_path):
    r = run(tmp_path / "absent.json")
    assert r.returncode == 2 and "cannot read" in r.stderr
