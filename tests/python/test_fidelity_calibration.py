"""tools/fidelity_calibration.py: Spearman's rho between a fidelity panel metric and a study's
mean loss, and (--paper) rho, Kendall's tau-b and exact permutation p-values of panel and rollout
metrics against the paper's Tables 10 and 11, on hand-built panels, rollout sets and study
directories whose expected figures are computed by hand below."""
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


# --paper: ranks against arXiv 2609.02846 Tables 10 and 11. Every expected figure below is worked
# out by hand in the comments, not produced by the code under test.

# The default mapping's recipes in the paper's row order (BF16, UE5M3 TE, b16, b32, TE NVFP4, NVFP4
# all). Table 10 orders them 1..6 in that order; Table 11 (2.2783, 2.3038, 2.3223, 2.3372, 2.3259,
# 2.4547) swaps b32 and TE NVFP4: ranks 1, 2, 3, 5, 4, 6.
ROWS = ["bf16", "ue5m3-te", "ue5m3-b16-paper-last1", "ue5m3-b32-paper-last1", "nvfp4-te", "nvfp4-all"]
T11_RANK = [1, 2, 3, 5, 4, 6]


def test_agreement_perfect_swap_reverse_by_hand():
    # Perfect agreement, n = 6: rho = 1, tau = 1; only the identity of the 6! = 720 orderings
    # reaches them: p = 1/720.
    a = fc.agreement([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60])
    assert a["rho"] == 1.0 and a["tau"] == 1.0
    assert a["p_rho"] == 1 / 720 and a["p_tau"] == 1 / 720 and a["permutations"] == 720
    # One adjacent swap: sum d^2 = 1 + 1 = 2, rho = 1 - 6*2/(6*35) = 1 - 12/210 = 0.942857...;
    # 15 pairs, 14 concordant, 1 discordant: tau = 13/15. Orderings at least as good: sum d^2 <= 2
    # (the identity and the 5 adjacent swaps), at most one inversion (the same 6): p = 6/720.
    a = fc.agreement([1, 2, 4, 3, 5, 6], [10, 20, 30, 40, 50, 60])
    assert abs(a["rho"] - (1 - 12 / 210)) < 1e-12 and abs(a["tau"] - 13 / 15) < 1e-12
    assert a["p_rho"] == 6 / 720 and a["p_tau"] == 6 / 720
    # Reversed: rho = tau = -1, and every ordering is at least as good: p = 1.
    a = fc.agreement([6, 5, 4, 3, 2, 1], [10, 20, 30, 40, 50, 60])
    assert a["rho"] == -1.0 and a["tau"] == -1.0 and a["p_rho"] == 1.0 and a["p_tau"] == 1.0
    # n = 5, x ranks 1 2 5 3 4 (d = 0 0 2 -1 -1, sum d^2 = 6): rho = 1 - 36/120 = 0.7; two discordant
    # pairs of 10: tau = 0.6. Orderings of 5 with sum d^2 <= 6: identity 1, adjacent swaps 4 (2),
    # two disjoint adjacent swaps 3 (4), rotations of three neighbours 3 x 2 = 6 (6): 14 of 120.
    # With at most 2 inversions: 1 + 4 + 9 (permutations of 5 with exactly 2 inversions) = 14.
    a = fc.agreement([1, 2, 5, 3, 4], [1, 2, 3, 4, 5])
    assert abs(a["rho"] - 0.7) < 1e-12 and abs(a["tau"] - 0.6) < 1e-12
    assert a["p_rho"] == 14 / 120 and a["p_tau"] == 14 / 120


def test_tau_b_and_p_with_ties_by_hand():
    # x = 1 2 2 3 against y = 1 2 3 4: 6 pairs, one tied in x, 5 concordant:
    # tau_b = 5 / sqrt((6 - 1)(6 - 0)) = 5/sqrt(30) (tau-a would be 5/6).
    assert abs(fc.kendall_tau_b([1, 2, 2, 3], [1, 2, 3, 4]) - 5 / 30 ** 0.5) < 1e-12
    a = fc.agreement([1, 2, 2, 3], [1, 2, 3, 4])
    assert abs(a["tau"] - 5 / 30 ** 0.5) < 1e-12
    assert abs(a["rho"] - 4.5 / (4.5 * 5) ** 0.5) < 1e-12  # average ranks 1 2.5 2.5 4 (test above)
    # Of the 4! = 24 orderings of x's values only the two that keep 1, 2, 2, 3 in y's order (the
    # two 2s exchanged) reach the maximum for either statistic: p = 2/24.
    assert a["p_rho"] == 2 / 24 and a["p_tau"] == 2 / 24
    # Tied in both: x = y = 1 1 2. Pair (0,1) tied on both sides, the other two concordant:
    # tau_b = 2 / sqrt((3 - 1)(3 - 1)) = 1.
    assert fc.kendall_tau_b([1, 1, 2], [5, 5, 7]) == 1.0
    assert fc.kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    a = fc.agreement([4, 4, 4], [1, 2, 3])
    assert a["rho"] is None and a["tau"] is None and a["p_rho"] is None


def test_direction_of_higher_is_better_metrics():
    for m, v, key in [("panel.whole.cosine", 0.9, -0.9), ("panel.whole.grad_to_qnoise", 4.0, -4.0),
                      ("panel.linears.gain", 0.97, 0.03), ("panel.whole.gain", 1.02, 0.02),
                      ("rollout.nll", 0.01, 0.01), ("panel.whole.bias2", 0.05, 0.05)]:
        assert abs(fc.direction(m)[0](v) - key) < 1e-12, m


def run_paper(*args):
    return subprocess.run([sys.executable, TOOL, "--paper", *map(str, args)], capture_output=True, text=True)


def trace(loss, nll, nll_fp32, divergence, diverged="", **extra):
    return {"loss": loss, "nll": nll, "nll_fp32": nll_fp32, "divergence": divergence, "diverged": diverged, **extra}


def write_rollout(tmp, spikes=False):
    """fp32 reference, the six mapped recipes and an unmapped `extra`; 2 checkpoints x 1 order, 2 steps.
    Reference: losses 5.0 4.0, nll 4.5, nll_fp32 4.4 at both checkpoints. Recipe k (0-based, paper
    row order) with Table 11 rank j = T11_RANK[k]: at checkpoint 0 losses 5.0 + 0.001 j, 4.0 + 0.002 j,
    nll 4.5 + 0.01 j, nll_fp32 4.4 + 0.02 (7 - j) (reversed), divergence 0.1 j; at checkpoint 1 the
    same plus 0.002 on the nll and the losses. nvfp4-all (j = 6) diverged at checkpoint 1, so its
    figures are checkpoint 0's."""
    ref = trace([5.0, 4.0], 4.5, 4.4, 0.0)
    traces = [[[ref], [ref]]]
    for k, name in enumerate(ROWS + ["extra"]):
        j = T11_RANK[k] if k < len(ROWS) else 3.5
        t = []
        for c in range(2):
            e = 0.002 * c
            tr = trace([5.0 + 0.001 * j + e, 4.0 + 0.002 * j + e], 4.5 + 0.01 * j + e, 4.4 + 0.02 * (7 - j), 0.1 * j)
            if name in ("nvfp4-all", "extra") and c == 1:
                tr = trace([5.1, None], None, None, None, diverged="step 2: loss not finite")
            if spikes:  # gradient norms: the stability counts of rollout.md
                tr["grad_norm"] = [2.0, None] if tr["diverged"] else [0.5, 1.5]
            t.append([tr])
        traces.append(t)
    p = tmp / "rollout.json"
    if spikes:
        ref["grad_norm"] = [0.5, 0.5]
    doc = {"format": "fp4train.rollout.v1", "recipes": ["fp32 (reference)"] + ROWS + ["extra"],
           "steps": [100, 200], "orders": 1, "length": 2, "traces": traces}
    if spikes:
        doc["stability"] = {"spike_threshold": 0.0045, "grad_norm_limit": 1.0}
    p.write_text(json.dumps(doc))
    return p


def test_paper_rollout_gaps_and_ranks(tmp_path):
    ro = write_rollout(tmp_path, spikes=True)
    out, md = tmp_path / "cal.json", tmp_path / "cal.md"
    r = run_paper(ro, "--json", out, "--md", md)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""  # the markdown went to --md
    j = json.load(open(out))
    recipes = j["inputs"][0]["recipes"]
    # ue5m3-b32-paper-last1: j = 5. nll gap 0.05 and 0.052 -> 0.051; nll_fp32 gap 0.02 (7 - 5) = 0.04;
    # loss at step 2: 0.01 and 0.012 -> 0.011; mean over steps: (0.005 + 0.01)/2 = 0.0075 and
    # (0.007 + 0.012)/2 = 0.0095 -> 0.0085; divergence 0.5.
    b32 = recipes["ue5m3-b32-paper-last1"]
    assert b32["row"] == "b32" and b32["ranked"] and b32["pairs"] == 2 and b32["diverged"] == 0
    for m, v in {"rollout.nll": 0.051, "rollout.nll_fp32": 0.04, "rollout.loss_last": 0.011,
                 "rollout.loss_mean": 0.0085, "rollout.divergence": 0.5, "rollout.spikes": 2.0,
                 "rollout.gnorm_excursions": 1.0, "rollout.nonfinite": 0.0}.items():
        assert abs(b32["values"][m] - v) < 1e-9, m
    # spikes above 0.0045 nats: b32's loss gaps 0.005, 0.010 (checkpoint 0) and 0.007, 0.012 (1): 2
    # per rollout; grad norms 0.5, 1.5: one excursion above 1 per rollout.
    # nvfp4-all (j = 6) diverged at checkpoint 1: checkpoint 0 alone, nll gap 0.06. Its counts take
    # both rollouts: spikes 2 (gaps 0.006, 0.012) and 1 (5.1 - 5.0 before it stopped) -> 1.5;
    # excursions 1 and 1 (2.0) -> 1; non-finite 0 and 1 -> 0.5.
    allr = recipes["nvfp4-all"]
    assert allr["pairs"] == 1 and allr["diverged"] == 1
    assert abs(allr["values"]["rollout.nll"] - 0.06) < 1e-9 and allr["values"]["rollout.spikes"] == 1.5
    assert allr["values"]["rollout.gnorm_excursions"] == 1.0 and allr["values"]["rollout.nonfinite"] == 0.5
    extra = recipes["extra"]
    assert not extra["ranked"] and extra["row"] is None and abs(extra["values"]["rollout.nll"] - 0.035) < 1e-9
    assert "fp32 (reference)" not in recipes
    rows = j["rows"]
    # The pre-registered row first: the nll gaps follow Table 11's order exactly (rho = tau = 1,
    # p = 1/720; FP4 alone, 5 recipes: p = 1/120).
    pre = rows[0]
    assert pre["metric"] == "rollout.nll" and pre["table"] == 11 and pre["pre_registered"]
    assert pre["source"] == "arXiv 2609.02846 Table 11" and pre["n"] == 6
    assert pre["rho"] == 1.0 and pre["tau"] == 1.0 and pre["p_rho"] == 1 / 720 and pre["p_tau"] == 1 / 720
    assert pre["fp4"]["n"] == 5 and pre["fp4"]["rho"] == 1.0 and pre["fp4"]["p_rho"] == 1 / 120
    assert sum(r["pre_registered"] for r in rows) == 1
    # Against Table 10 the same gaps are one adjacent swap off (b32, TE NVFP4): rho = 1 - 12/210,
    # tau = 13/15, p = 6/720 (see test_agreement_perfect_swap_reverse_by_hand).
    t10 = next(r for r in rows if r["metric"] == "rollout.nll" and r["table"] == 10)
    assert abs(t10["rho"] - (1 - 12 / 210)) < 1e-12 and abs(t10["tau"] - 13 / 15) < 1e-12
    assert t10["p_rho"] == 6 / 720 and t10["p_tau"] == 6 / 720
    # nll_fp32 is reversed: rho = -1, p = 1. FP4 alone, 5 recipes, reversed too.
    rev = next(r for r in rows if r["metric"] == "rollout.nll_fp32" and r["table"] == 11)
    assert rev["rho"] == -1.0 and rev["p_rho"] == 1.0 and rev["fp4"]["rho"] == -1.0
    assert [r["metric"] for r in rows[1:11:2]] == ["rollout.nll", "rollout.nll_fp32", "rollout.loss_last",
                                                   "rollout.loss_mean", "rollout.divergence"]
    assert any(r["metric"] == "rollout.spikes" for r in rows)
    assert [p["table10"] for p in j["paper"]["rows"]] == [2.2651, 2.2902, 2.3090, 2.3241, 2.3474, 2.4420]
    assert [p["table11"] for p in j["paper"]["rows"]] == [2.2783, 2.3038, 2.3223, 2.3372, 2.3259, 2.4547]
    assert all(p["source"] == "arXiv 2609.02846 Table 10/11" for p in j["paper"]["rows"])
    text = md.read_text()
    lines = [l for l in text.splitlines() if l.startswith("| rollout.")]
    assert lines[0].startswith("| rollout.nll (pre-registered) | 11 | 6 | +1.000 | +1.000 | 0.0014 | 0.0014 |")
    assert "`extra` (not ranked)" in text and "`nvfp4-all` 1 (1 diverged)" in text
    # Without counts in the traces there is no spikes metric, and no failure; stdout without --md.
    r = run_paper(write_rollout(tmp_path), "--json", out)
    assert r.returncode == 0 and "| rollout.nll (pre-registered) |" in r.stdout
    assert not any(x["metric"] == "rollout.spikes" for x in json.load(open(out))["rows"])


def write_panel(tmp, names, name="fidelity.json"):
    """Recipe k (0-based, paper row order): whole bias2 0.01 k, cosine 1 - 0.01 k (higher is better),
    gain 1, 0.99, 1.02, 0.97, 1.04, 0.95 (|gain - 1| = 0.01 k), linears rel_error 0.1 T11 rank;
    an unmapped `extra`; roles dW.local only on bf16 (a metric the others lack)."""
    gains = [1.0, 0.99, 1.02, 0.97, 1.04, 0.95, 1.0]
    recipes = []
    for k, n in enumerate(names):
        rec = {"name": n, "whole": {"bias2": {"mean": 0.01 * k, "lo": 0, "hi": 1},
                                    "cosine": {"mean": 1 - 0.01 * k}, "gain": {"mean": gains[k]}},
               "linears": {"rel_error": {"mean": 0.1 * (T11_RANK[k] if k < 6 else 9)}}}
        if n == "bf16":
            rec["roles"] = {"dW.local": {"rel_error": {"mean": 0.5}}, "Y.local": {"rel_error": {"mean": 0.5}}}
        recipes.append(rec)
    p = tmp / name
    p.write_text(json.dumps({"format": "fp4train.fidelity.v1", "recipes": recipes}))
    return p


def test_paper_panel_metrics_directions_and_two_inputs(tmp_path):
    panel = write_panel(tmp_path, ROWS + ["extra"])
    ro = write_rollout(tmp_path)
    out = tmp_path / "cal.json"
    r = run_paper(panel, ro, "--json", out)
    assert r.returncode == 0, r.stderr
    j = json.load(open(out))
    rows = j["rows"]
    assert rows[0]["metric"] == "rollout.nll" and rows[0]["input"] == "#2" and rows[0]["pre_registered"]
    by = {(x["input"], x["metric"], x["table"]): x for x in rows}
    # bias2 increasing, cosine decreasing (ranked negated), |gain - 1| increasing in Table 10's
    # order: rho = tau = 1 there, one adjacent swap against Table 11.
    for m in ("panel.whole.bias2", "panel.whole.cosine", "panel.whole.gain"):
        assert by[("#1", m, 10)]["rho"] == 1.0 and by[("#1", m, 10)]["p_tau"] == 1 / 720, m
        assert abs(by[("#1", m, 11)]["rho"] - (1 - 12 / 210)) < 1e-12, m
    assert by[("#1", "panel.whole.cosine", 10)]["direction"].startswith("higher is better")
    # linears rel_error follows Table 11: rho 1 there.
    assert by[("#1", "panel.linears.rel_error", 11)]["rho"] == 1.0
    # dW.local only on bf16: named, not ranked, the gap said.
    dw = by[("#1", "panel.dW.local.rel_error", 10)]
    assert dw["rho"] is None and "no value for ue5m3-te" in dw["note"]
    assert not any(x["metric"].startswith("panel.Y") for x in rows)
    rec = j["inputs"][0]["recipes"]
    assert rec["extra"]["ranked"] is False and rec["extra"]["values"]["panel.whole.bias2"] == 0.06
    assert rec["ue5m3-te"]["values"]["panel.whole.cosine"] == 0.99
    assert "| input | metric |" in r.stdout and "| #2 | rollout.nll (pre-registered) | 11 |" in r.stdout


def test_paper_map_drops_and_renames_rows(tmp_path):
    # A panel with ue5m3-b16 for the b16 row and no b32 recipe: the default mapping fails...
    names = ["bf16", "ue5m3-te", "ue5m3-b16", "nvfp4-te", "nvfp4-all"]
    p = tmp_path / "fidelity.json"
    p.write_text(json.dumps({"format": "fp4train.fidelity.v1", "recipes": [
        {"name": n, "whole": {"bias2": {"mean": 0.01 * k}}} for k, n in enumerate(names)]}))
    r = run_paper(p)
    assert r.returncode == 2
    assert str(p) in r.stderr and "'b16'" in r.stderr and "'ue5m3-b16-paper-last1'" in r.stderr
    # ... --map renames b16 and drops b32: 5 recipes, bias2 in paper order: rho = 1, p = 1/120;
    # FP4 alone (4): p = 1/24.
    out = tmp_path / "cal.json"
    r = run_paper(p, "--map", "b16=ue5m3-b16,b32=", "--json", out)
    assert r.returncode == 0, r.stderr
    j = json.load(open(out))
    assert j["mapping"]["b32"] is None and j["mapping"]["b16"] == "ue5m3-b16"
    row = j["rows"][0]
    assert row["n"] == 5 and row["rho"] == 1.0 and row["p_rho"] == 1 / 120 and row["fp4"]["p_rho"] == 1 / 24
    assert "(dropped)" in r.stdout
    # --map repeated: the entries of every occurrence, the same mapping.
    r = run_paper(p, "--map", "b16=ue5m3-b16", "--map", "b32=", "--json", out)
    assert r.returncode == 0, r.stderr
    assert json.load(open(out))["mapping"] == j["mapping"]
    # Fewer than 3 mapped rows.
    r = run_paper(p, "--map", "b16=,b32=,nvfp4-te=,nvfp4-all=")
    assert r.returncode == 2 and "only 2 paper rows" in r.stderr and "need 3" in r.stderr
    # With 3 rows, FP4 alone has 2: n/a, not an error.
    r = run_paper(p, "--map", "b16=,b32=,nvfp4-all=", "--json", out)
    assert r.returncode == 0, r.stderr
    assert json.load(open(out))["rows"][0]["fp4"] is None
    r = run_paper(p, "--map", "b64=x")
    assert r.returncode == 2 and "unknown paper row 'b64'" in r.stderr
    r = run_paper(p, "--map", "b16=nvfp4-te")
    assert r.returncode == 2 and "'nvfp4-te' stands for two paper rows" in r.stderr


def test_paper_bad_input_exits_2_naming_the_problem(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "fp4train.compare.v1"}')
    r = run_paper(bad)
    assert r.returncode == 2 and str(bad) in r.stderr and "'fp4train.compare.v1'" in r.stderr
    r = run_paper(tmp_path / "missing.json")
    assert r.returncode == 2 and "missing.json" in r.stderr
    (tmp_path / "broken.json").write_text("{")
    r = run_paper(tmp_path / "broken.json")
    assert r.returncode == 2 and "broken.json" in r.stderr
    # A rollout set lacking a mapped recipe: the file, the row and the recipe are named.
    ro = json.loads(write_rollout(tmp_path).read_text())
    i = ro["recipes"].index("nvfp4-te")
    del ro["recipes"][i], ro["traces"][i]
    (tmp_path / "r2.json").write_text(json.dumps(ro))
    r = run_paper(tmp_path / "r2.json")
    assert r.returncode == 2
    assert "r2.json" in r.stderr and "'nvfp4-te' (TE NVFP4)" in r.stderr and "recipe 'nvfp4-te'" in r.stderr
    # Traces that do not match the recipes.
    ro["traces"] = ro["traces"][:-1]
    (tmp_path / "r3.json").write_text(json.dumps(ro))
    r = run_paper(tmp_path / "r3.json")
    assert r.returncode == 2 and "recipes and traces do not match" in r.stderr
    # No output is written when one input is bad.
    out = tmp_path / "never.json"
    r = run_paper(write_panel(tmp_path, ROWS), bad, "--json", out)
    assert r.returncode == 2 and not out.exists()
