"""tools/rollout_noise.py and tools/rollout_stats.py: the noise-versus-N curve of a rollout set
from hand-built rollout.json files whose gaps, SDs and rollouts needed are computed by hand in
the comments; the two-level bootstrap against intervals known by hand and against the C++
rollout.md of a committed rollout set; clear errors (exit status 2) for unusable input."""
import json
import math
import os
import subprocess
import sys

import pytest

SRC = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(SRC, "tools", "rollout_noise.py")
sys.path.insert(0, os.path.join(SRC, "tools"))
import rollout_noise as rn  # noqa: E402
import rollout_stats as rs  # noqa: E402

# The tiny set: 2 checkpoints x 2 orders = 4 rollouts, N = 3 steps, recipes fp32, a, b. The fp32
# loss is 4 everywhere, so a recipe's gap is its loss minus 4 (all values exact in binary).
# Gaps per rollout (c0o0, c0o1, c1o0, c1o1):
GAP_A = [[1, 1, 1, 1],   # step 1: mean 1, SD 0
         [1, 3, 1, 3],   # step 2: mean 2, deviations -1 1 -1 1, SD sqrt(4/3) = 1.1547
         [0, 2, 4, 6]]   # step 3: mean 3, deviations -3 -1 1 3, SD sqrt(20/3) = 2.5820
GAP_B = [[1, 1, 1, 1],   # b - a: 0 0 0 0 -> mean 0: needed infinite
         [2, 4, 2, 4],   # b - a: 1 1 1 1 -> mean 1, SD 0: needed (1.96*0/1)^2 = 0 -> at least 1
         [0, 4, 4, 8]]   # b - a: 0 2 0 2 -> mean 1, SD sqrt(4/3); needed 1.96^2 * 4/3 = 5.122 -> 6
# Rollouts needed, (1.96 SD / |mean|)^2 rounded up:
#   a, step 2: 3.8416 * (4/3) / 2^2 = 1.2805 -> 2;  a, step 3: 3.8416 * (20/3) / 3^2 = 2.8456 -> 3
# Means over steps 1..n, per rollout:
#   a, n = 2: 1 2 1 2 (mean 1.5, SD sqrt(1/3) = 0.57735; needed 3.8416 * (1/3) / 2.25 = 0.569 -> 1)
#   a, n = 3: 2/3 2 2 10/3 (mean 2, deviations -4/3 0 0 4/3, SD sqrt(32/27) = 1.0887;
#             needed 3.8416 * (32/27) / 4 = 1.138 -> 2)
#   b, n = 3: 1 3 7/3 13/3, so b - a over 1..3: 1/3 1 1/3 1 (mean 2/3, SD sqrt(4/27) = 0.3849;
#             needed 3.8416 * (4/27) / (4/9) = 1.2805 -> 2; SNR (2/3) / 0.3849 = 1.7321)


def trace(losses, nll=5.0, nll_fp32=5.0, divergence=0.1, **extra):
    t = {"loss": losses, "nll": nll, "nll_fp32": nll_fp32, "divergence": divergence,
         "diverged": ""}
    t.update(extra)
    return t


def tiny(gaps=(GAP_A, GAP_B), K=2, O=2, N=3, fp32=4.0):
    """A rollout set whose recipe r + 1 has the gap gaps[r][step][c * O + o] to fp32's loss."""
    recipes = ["fp32 (reference)"] + [chr(ord("a") + i) for i in range(len(gaps))]
    traces = [[[trace([fp32] * N, divergence=0.0) for o in range(O)] for c in range(K)]]
    for g in gaps:
        traces.append([[trace([fp32 + g[k][c * O + o] for k in range(N)]) for o in range(O)]
                       for c in range(K)])
    return {"format": "fp4train.rollout.v1", "run": "runs/x", "steps": [100 * (c + 1) for c in
                                                                       range(K)],
            "recipes": recipes, "length": N, "orders": O, "windows": 8, "seed": 1,
            "machine": "test", "traces": traces}


def write(tmp_path, d, name="rollout.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d) if not isinstance(d, str) else d)
    return p


def run(*args):
    return subprocess.run([sys.executable, TOOL] + [str(a) for a in args], capture_output=True,
                          text=True)


def near(x, y, tol=1e-12):
    return abs(x - y) <= tol * max(1.0, abs(y))


# ------------------------------------------------------------------------------ the bootstrap


def test_splitmix64_matches_the_cpp_stream():
    # include/fp4/data/data.h: splitmix64(0, 0) == 0xE220A8397B1DCDAF
    assert rs.splitmix64(0, 0) == 0xE220A8397B1DCDAF


def test_bootstrap_of_equal_rollouts_has_zero_width():
    b = rs.Bootstrap(3, 2, 500, 7)
    assert b.interval([[0.25] * 2] * 3) == (0.25, 0.25, 0.25)


def test_bootstrap_of_two_values_spans_them():
    # One checkpoint, orders 0 and 1: a resample's mean is 0, 0.5 or 1 (probabilities 1/4, 1/2,
    # 1/4), so of 2000 resamples far more than 2.5% are 0 and 1: the interval is [0, 1].
    m, lo, hi = rs.Bootstrap(1, 2).interval([[0.0, 1.0]])
    assert (m, lo, hi) == (0.5, 0.0, 1.0)


def test_bootstrap_refuses_non_finite_grids():
    assert rs.Bootstrap(1, 2).interval([[0.0, math.nan]]) is None


def cpp_row(md, first):
    """The cells of the rollout.md table row whose first cells are `first` (a list)."""
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:len(first)] == first:
            return cells[len(first):]
    raise AssertionError(f"no row {first}")


def fmt(iv):
    return f"{iv[0]:+.5f} [{iv[1]:+.5f}, {iv[2]:+.5f}]"


def test_intervals_equal_the_cpp_report_of_a_committed_rollout_set():
    # rollout.md was written by the C++ (write_rollout_report); the same gaps through the
    # Python bootstrap must print the same 5-digit intervals.
    base = os.path.join(SRC, "docs", "results", "rollout-study")
    d = rs.load(os.path.join(base, "rollout.json"))
    with open(os.path.join(base, "rollout.md"), encoding="utf-8") as f:
        md = f.read()
    b = rs.Bootstrap(len(d["steps"]), d["orders"])
    N = d["length"]
    for r in range(1, len(d["recipes"])):
        lg = rs.loss_gaps(d, r)
        cells = cpp_row(md, [f"`{d['recipes'][r]}`"])
        mine = [rs.at(lg, N - 1), rs.at(rs.cumulative(lg), N - 1), rs.gap_grid(d, r, "nll"),
                rs.gap_grid(d, r, "nll_fp32"), rs.value_grid(d, r, "divergence")]
        assert [fmt(b.interval(g)) for g in mine] == cells[:5], d["recipes"][r]
    # Paired contrasts: B - A of the held-out NLL gaps and of the loss gap at step N.
    for a in range(1, len(d["recipes"])):
        for bb in range(a + 1, len(d["recipes"])):
            cells = cpp_row(md, [f"`{d['recipes'][a]}`", f"`{d['recipes'][bb]}`"])
            dn = rs.difference(rs.gap_grid(d, bb, "nll"), rs.gap_grid(d, a, "nll"))
            dl = rs.difference(rs.at(rs.loss_gaps(d, bb), N - 1), rs.at(rs.loss_gaps(d, a), N - 1))
            assert fmt(b.interval(dn)) == cells[0]
            assert fmt(b.interval(dl)) == cells[4]


# ------------------------------------------------------------------------------ the figures


def test_gaps_sds_and_rollouts_needed_of_the_tiny_set(tmp_path):
    d = rs.load(write(tmp_path, tiny()))
    boot = rs.Bootstrap(2, 2)
    a, b = rs.recipe_series(d, boot)
    assert [a["name"], b["name"]] == ["a", "b"]
    s = a["at_step"]
    assert [e["mean"] for e in s] == [1.0, 2.0, 3.0]
    assert s[0]["sd"] == 0.0 and s[0]["needed"] == 1
    assert near(s[1]["sd"], math.sqrt(4 / 3)) and s[1]["needed"] == 2
    assert near(s[1]["needed_exact"], 3.8416 * (4 / 3) / 4)
    assert near(s[2]["sd"], math.sqrt(20 / 3)) and s[2]["needed"] == 3
    # Equal rollouts at step 1: a zero-width interval.
    assert s[0]["lo"] == s[0]["hi"] == 1.0 and s[0]["half_width"] == 0.0
    cu = a["cumulative"]
    assert cu[0]["mean"] == 1.0
    assert near(cu[1]["mean"], 1.5) and near(cu[1]["sd"], math.sqrt(1 / 3)) and cu[1]["needed"] == 1
    assert near(cu[2]["mean"], 2.0) and near(cu[2]["sd"], math.sqrt(32 / 27))
    assert cu[2]["needed"] == 2

    (c,) = rs.contrast_series(d, boot)
    assert (c["a"], c["b"]) == ("a", "b")
    s = c["at_step"]
    assert s[0]["mean"] == 0.0 and s[0]["needed"] == math.inf
    assert s[1]["mean"] == 1.0 and s[1]["sd"] == 0.0 and s[1]["needed"] == 1
    assert s[1]["snr"] == math.inf
    assert s[2]["mean"] == 1.0 and near(s[2]["sd"], math.sqrt(4 / 3))
    assert near(s[2]["snr"], 1 / math.sqrt(4 / 3)) and s[2]["needed"] == 6
    # Its bootstrap: both checkpoints hold (0, 2), so a resample is the mean of 4 draws from
    # {0, 2}; all four 0 (or all 2) has probability 1/16 > 2.5%: the interval is [0, 2].
    assert (s[2]["lo"], s[2]["hi"], s[2]["half_width"]) == (0.0, 2.0, 1.0)
    cu = c["cumulative"][2]
    assert near(cu["mean"], 2 / 3) and near(cu["sd"], math.sqrt(4 / 27))
    assert near(cu["snr"], math.sqrt(3)) and cu["needed"] == 2
    # Over 1..3 both checkpoints hold (1/3, 1): the interval is [1/3, 1], half-width 1/3.
    assert near(cu["lo"], 1 / 3) and near(cu["hi"], 1.0) and near(cu["half_width"], 1 / 3)


def item(values):
    """A contrast whose needed_exact at n = 1, 2, ... is values (the same in both variants)."""
    es = [{"n": k + 1, "needed_exact": v} for k, v in enumerate(values)]
    return {"at_step": es, "cumulative": es}


def test_recommendation_from_the_median_over_contrasts():
    # Medians at n = 1..5 of (3 contrasts): 10, 5, 4.8, 4.5, 4.6. Smallest at n = 4 (4.5); the
    # first within 10% of it (<= 4.95) is n = 3 (4.8); rollouts x n: 10, 10, 14.4, 18, 23, the
    # smallest at n = 1 (the first of the tie).
    items = [item([10, 5, 4.8, 4.5, 4.6]), item([20, 50, 9, 9, 9]), item([1, 1, 1, 1, 1])]
    rec = rn.recommend(items, "cumulative")
    assert rec["medians"] == [10, 5, 4.8, 4.5, 4.6]
    assert (rec["best_n"], rec["best"]) == (4, 4.5)
    assert (rec["knee_n"], rec["knee"]) == (3, 4.8)
    assert (rec["cheapest_n"], rec["cheapest_steps"]) == (1, 10)
    # An infinite median (a contrast of mean 0 twice out of three) is never the best.
    rec = rn.recommend([item([math.inf, 3]), item([math.inf, 4]), item([1, 5])], "at_step")
    assert rec["medians"] == [math.inf, 4] and rec["best_n"] == 2


# ------------------------------------------------------------------------------ the tool


def test_tables_json_and_recommendation(tmp_path):
    p = write(tmp_path, tiny())
    r = run(p, "--json", tmp_path / "noise.json", "--at", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    # Recipe a's table: step 3 at n (mean 3, SD 2.58199, needed 3) and over 1..3 (mean 2,
    # SD 1.08866, needed 2); the bootstrap half-widths are not checked here.
    row = cpp_row(out, ["3", "+3.00000", "2.58199"])
    assert row[1] == "3" and row[2:4] == ["+2.00000", "1.08866"] and row[5] == "2"
    # The contrast b - a at step 1 has mean 0: ∞ rollouts.
    assert "`b` − `a`" in out
    assert cpp_row(out, ["1", "+0.00000", "0.00000", "±0.00000", "—", "∞"])
    # The needed table, mean over 1..n: n = 1 ∞, n = 2: b - a over 1..2 is 0.5 each (SD 0) -> 1,
    # n = 3: 2 (above). The smallest median is at n = 2.
    assert "median over 1 contrast of the rollouts needed is smallest at n = 2 (1 rollout)" in out
    j = json.loads((tmp_path / "noise.json").read_text())
    assert j["format"] == "fp4train.rollout_noise.v1" and j["rollouts"] == 4
    assert near(j["recipes"][0]["at_step"][2]["sd"], math.sqrt(20 / 3))
    assert j["contrasts"][0]["at_step"][0]["needed"] == "inf"
    assert j["contrasts"][0]["at_step"][0]["snr"] is None        # 0 / 0
    assert j["recommendation"]["cumulative"]["best_n"] == 2
    assert len(j["recipes"][0]["cumulative"]) == 3


def test_sampled_steps_and_at(tmp_path):
    N = 120
    g = [[0.5 + 0.01 * k, 0.25, 0.75, 0.5] for k in range(N)]
    p = write(tmp_path, tiny(gaps=(g,), N=N))
    r = run(p, "--at", "7,33")
    assert r.returncode == 0, r.stderr
    first = [line.split("|")[1].strip() for line in r.stdout.split("## Gap")[1].split("\n\n")[2]
             .splitlines()[2:]]
    assert first == ["1", "2", "5", "7", "10", "20", "33", "40", "60", "80", "100", "120"]
    # One recipe: its gap to fp32 stands in for the contrasts.
    assert "median over 1 gap to fp32" in r.stdout and "Paired contrasts" not in r.stdout


def test_a_diverged_rollout_leaves_dashes_not_a_crash(tmp_path):
    d = tiny()
    d["traces"][2][1][0]["loss"][2] = None  # b, checkpoint 1, order 0, step 3: not finite
    d["traces"][2][1][0]["diverged"] = "step 3: loss is not finite"
    r = run(write(tmp_path, d), "--json", tmp_path / "n.json")
    assert r.returncode == 0, r.stderr
    j = json.loads((tmp_path / "n.json").read_text())
    assert j["recipes"][1]["at_step"][2]["mean"] is None
    assert j["contrasts"][0]["cumulative"][2]["needed"] is None
    assert j["recipes"][0]["at_step"][2]["mean"] == 3.0


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "not json", "is not JSON"),
    (lambda d: {**d, "format": "fp4train.fidelity.v1"}, "is not a rollout.json"),
    (lambda d: {**d, "length": 1, "traces": [[[{**t, "loss": t["loss"][:1]} for t in by_o]
                                              for by_o in by_c] for by_c in d["traces"]]},
     "length N = 1"),
    (lambda d: tiny(K=1, O=1), "one rollout only"),
    (lambda d: {**d, "recipes": d["recipes"][:1], "traces": d["traces"][:1]},
     "no recipe besides the fp32 reference"),
    (lambda d: {**d, "length": 4}, "holds 3 values, not length = 4"),
    (lambda d: {**d, "orders": 3}, "traces do not hold 3 orders"),
])
def test_bad_input_exits_2_naming_the_problem(tmp_path, mutate, message):
    r = run(write(tmp_path, mutate(tiny())))
    assert r.returncode == 2, r.stdout
    assert "rollout_noise.py: error:" in r.stderr and message in r.stderr, r.stderr


def test_missing_file_and_bad_at_exit_2(tmp_path):
    r = run(tmp_path / "absent.json")
    assert r.returncode == 2 and "cannot read" in r.stderr
    r = run(write(tmp_path, tiny()), "--at", "4")
    assert r.returncode == 2 and "outside the rollout's steps 1..3" in r.stderr


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figs" / "noise.png"
    r = run(write(tmp_path, tiny()), "--plot", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r.stdout.rstrip().splitlines()[-1] == str(out)


def test_bootstrap_of_the_file_unless_given():
    # A file recording its report's bootstrap: the tools use it (so their intervals are the
    # report's); given values win; files of earlier versions record none: 2000 and 20261206.
    assert rs.bootstrap_of({"bootstrap": {"resamples": 7, "seed": 3}}) == (7, 3)
    assert rs.bootstrap_of({"bootstrap": {"resamples": 7, "seed": 3}}, 50, None) == (50, 3)
    assert rs.bootstrap_of({}) == (2000, 20261206)
