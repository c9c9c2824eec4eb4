"""tools/family_effect.py: the CPU-family differences of a study, on hand-built run directories
whose expected figures are computed by hand below."""
import json
import os
import subprocess
import sys

import pytest

SRC = os.environ.get("FP4_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(SRC, "tools", "family_effect.py")
pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib needs Python 3.11")

CLAIMS = """
[[hypothesis]]
id = "H3"
claim = "x"
lower = "a"
than = "b"

[[hypothesis]]
id = "Hn"
claim = "x"
metric = "heldout_nll"
contrast = { "a" = 1.0, "b" = -0.5, "c" = -0.5 }
expect = "negative"

[[hypothesis]]
id = "Hg"
claim = "ignored: not a loss metric"
metric = "grad_norm_excursions"
lower = "a"
than = "b"
"""


def run_dir(root, recipe, seed, loss, nll, cpu, status="completed"):
    d = root / f"{recipe}-s{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({
        "recipe": recipe, "seed": seed, "status": status, "final_window_loss": loss,
        "heldout_nll": nll, "compute": {"cpu": cpu}}))


def tool(*args):
    return subprocess.run([sys.executable, TOOL, *map(str, args)], capture_output=True, text=True)


def test_differences_and_contrasts_by_hand(tmp_path):
    base, other = tmp_path / "amd", tmp_path / "intel"
    # base (AMD):  a: s1 4.00/4.10, s2 4.20/4.30; b: s1 3.90/4.00, s2 4.25/4.40; c: s1 4.5/4.6
    for r, s, l, n in [("a", 1, 4.00, 4.10), ("a", 2, 4.20, 4.30), ("b", 1, 3.90, 4.00),
                       ("b", 2, 4.25, 4.40), ("c", 1, 4.50, 4.60)]:
        run_dir(base, r, s, l, n, "AMD EPYC")
    # other (Intel): a: s1 4.03/4.12, s2 4.19/4.33; b: s1 3.90/4.02, s2 4.21/4.40; c: s1 4.5/4.7
    for r, s, l, n in [("a", 1, 4.03, 4.12), ("a", 2, 4.19, 4.33), ("b", 1, 3.90, 4.02),
                       ("b", 2, 4.21, 4.40), ("c", 1, 4.50, 4.70)]:
        run_dir(other, r, s, l, n, "Intel Xeon")
    run_dir(other, "a", 3, 9.0, 9.0, "Intel Xeon")  # no base run: left out
    run_dir(other, "b", 3, 9.0, 9.0, "Intel Xeon", status="diverged")
    claims = tmp_path / "claims.toml"
    claims.write_text(CLAIMS)
    out = tmp_path / "fe.json"
    p = tool(base, other, "--hypotheses", claims, "--json", out)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["base_cpu"] == ["AMD EPYC"] and res["other_cpu"] == ["Intel Xeon"]
    rec = {r["recipe"]: r for r in res["recipes"]}
    assert rec["a"]["seeds"] == [1, 2]
    # a, final loss: +0.03, -0.01 -> mean +0.01, std sqrt(((0.02)^2 + (0.02)^2) / 1) = 0.028284
    assert rec["a"]["final_loss"]["per_seed"] == pytest.approx([0.03, -0.01])
    assert rec["a"]["final_loss"]["mean"] == pytest.approx(0.01)
    assert rec["a"]["final_loss"]["sd"] == pytest.approx(0.0282842712)
    assert rec["a"]["final_loss"]["mean_abs"] == pytest.approx(0.02)
    assert rec["b"]["heldout_nll"]["per_seed"] == pytest.approx([0.02, 0.0])
    c = {x["id"]: x for x in res["contrasts"]}
    assert set(c) == {"H3", "Hn"}  # Hg's metric is not a loss
    # H3 = a - b (final loss): base s1 +0.10, s2 -0.05; other s1 +0.13, s2 -0.02 -> +0.03, +0.03
    h3 = c["H3"]["per_seed"]
    assert [r["seed"] for r in h3] == [1, 2]
    assert [r["base"] for r in h3] == pytest.approx([0.10, -0.05])
    assert [r["other"] for r in h3] == pytest.approx([0.13, -0.02])
    assert c["H3"]["mean"] == pytest.approx(0.03) and c["H3"]["sd"] == pytest.approx(0.0, abs=1e-12)
    # Hn = a - b/2 - c/2 (held-out NLL), seed 1 only (c has no seed 2):
    # base 4.10 - 2.00 - 2.30 = -0.20; other 4.12 - 2.01 - 2.35 = -0.24
    hn = c["Hn"]["per_seed"]
    assert len(hn) == 1 and hn[0]["diff"] == pytest.approx(-0.04)
    assert "| H3 | final_loss | 1 | +0.1000 | +0.1300 | +0.0300 |" in p.stdout


def test_bad_input_is_named(tmp_path):
    base, other = tmp_path / "x", tmp_path / "y"
    run_dir(base, "a", 1, 4.0, 4.1, "AMD EPYC")
    run_dir(other, "a", 1, 4.0, 4.1, "AMD EPYC")
    p = tool(base, other)
    assert p.returncode == 2 and "both directories hold runs of ['AMD EPYC']" in p.stderr
    p = tool(base, tmp_path / "missing")
    assert p.returncode == 2 and "missing is not a directory" in p.stderr
    (other / "a-s1" / "summary.json").write_text("{")
    p = tool(base, other)
    assert p.returncode == 2 and "a-s1" in p.stderr and "summary.json" in p.stderr
    other2 = tmp_path / "z"
    run_dir(other2, "b", 1, 4.0, 4.1, "Intel Xeon")
    p = tool(base, other2)
    assert p.returncode == 2 and "share no (recipe, seed)" in p.stderr
