#!/usr/bin/env python3
"""The CPU-family effect on a study (docs/results.md "The CPU family as a factor").

Usage: python3 tools/family_effect.py BASE_DIR OTHER_DIR [--hypotheses FILE] [--json OUT]

BASE_DIR and OTHER_DIR are `fp4train compare` directories whose runs share config, recipe and
seed but were trained on two CPU families (e.g. docs/results/study-seeds, AMD EPYC AVX2, and
docs/results/study-family-intel-avx512, made by `bash scripts/study families` on an Intel Xeon).
Each run's family is read from its summary.json (compute.cpu). Same config + seed + recipe gives
the same bits on one machine, so every difference printed here is the family's: a GEMM or a
SIMD kernel that rounds an FP32 sum in another order flips a tie now and then, and training
amplifies it like a change of seed (docs/determinism.md "Determinism and CPU families").

Prints (markdown), per metric (final-window training loss; held-out NLL, FP32 inference):
  * per recipe: OTHER − BASE per seed, their mean and sample std;
  * per contrast of the study file (default configs/studies/claims.toml; contrasts whose
    recipes all have runs in both directories, metrics final_loss and heldout_nll):
    the contrast's value per seed in each family, and OTHER − BASE. A contrast is only ever
    evaluated within one family: this table says how much the family moves it.
With --json, also writes those figures as JSON.

Standard library only (tomllib: Python 3.11). Exits with status 2 naming the file on unreadable
input, or when the two directories share no (recipe, seed) or are from the same family.
"""
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from noise_floor import mean_sd  # noqa: E402  (mean and sample std; nan std for one value)

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

METRICS = (("final_loss", "final-window loss"), ("heldout_nll", "held-out NLL (FP32 inference)"))


def fail(msg):
    print(f"family_effect.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_runs(d):
    """{(recipe, seed): {"final_loss", "heldout_nll", "cpu"}} of the finished runs in d."""
    if not os.path.isdir(d):
        fail(f"{d} is not a directory")
    out = {}
    for name in sorted(os.listdir(d)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        p = os.path.join(d, name, "summary.json")
        if not m or not os.path.exists(p):
            continue
        try:
            with open(p, encoding="utf-8") as f:
                s = json.load(f)
            if s.get("status") != "completed":
                continue
            out[(s["recipe"], int(s["seed"]))] = {
                "final_loss": float(s["final_window_loss"]),
                "heldout_nll": float(s["heldout_nll"]),
                "cpu": s["compute"]["cpu"],
            }
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{p}: {e!r}")
    return out


def read_contrasts(path):
    """[(id, {recipe: coefficient}, metric)] of the study file's contrasts of final_loss or
    heldout_nll (policy none); lower/than claims become {lower: 1, than: -1}."""
    if tomllib is None:
        fail("reading a study file needs Python 3.11 (tomllib)")
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        fail(f"{path}: {e}")
    out = []
    for h in doc.get("hypothesis", []):
        metric = h.get("metric", "final_loss")
        if metric not in ("final_loss", "heldout_nll") or h.get("policy", "none") != "none":
            continue
        if "contrast" in h:
            coef = {str(k): float(v) for k, v in h["contrast"].items()}
        elif "lower" in h and "than" in h:
            coef = {str(h["lower"]): 1.0, str(h["than"]): -1.0}
        else:
            fail(f"{path}: hypothesis {h.get('id', '?')} has neither contrast nor lower/than")
        out.append((str(h.get("id", "?")), coef, metric))
    return out


def contrast_value(runs, coef, seed, metric):
    if any((r, seed) not in runs for r in coef):
        return None
    return sum(c * runs[(r, seed)][metric] for r, c in coef.items())


def family_effect(base, other, contrasts):
    """The figures printed, as a dict (see the module docstring)."""
    common = sorted(set(base) & set(other))
    if not common:
        fail("the two directories share no (recipe, seed) with a completed run")
    fams_b = {base[k]["cpu"] for k in common}
    fams_o = {other[k]["cpu"] for k in common}
    if fams_b & fams_o:
        fail(f"both directories hold runs of {sorted(fams_b & fams_o)}: nothing to compare")
    res = {"base_cpu": sorted(fams_b), "other_cpu": sorted(fams_o), "recipes": [], "contrasts": []}
    for recipe in sorted({r for r, _ in common}):
        seeds = [s for r, s in common if r == recipe]
        row = {"recipe": recipe, "seeds": seeds}
        for m, _ in METRICS:
            d = [other[(recipe, s)][m] - base[(recipe, s)][m] for s in seeds]
            mu, sd = mean_sd(d)
            row[m] = {"per_seed": d, "mean": mu, "sd": sd, "mean_abs": sum(map(abs, d)) / len(d)}
        res["recipes"].append(row)
    seeds_all = sorted({s for _, s in common})
    for cid, coef, metric in contrasts:
        rows = []
        for s in seeds_all:
            vb, vo = contrast_value(base, coef, s, metric), contrast_value(other, coef, s, metric)
            if vb is not None and vo is not None:
                rows.append({"seed": s, "base": vb, "other": vo, "diff": vo - vb})
        if rows:
            mu, sd = mean_sd([r["diff"] for r in rows])
            res["contrasts"].append({"id": cid, "metric": metric, "per_seed": rows, "mean": mu, "sd": sd})
    return res


def print_md(res):
    b, o = "/".join(res["base_cpu"]), "/".join(res["other_cpu"])
    print(f"Base: {b}; other: {o}. Differences are other − base, in nats.\n")
    for m, label in METRICS:
        print(f"| recipe | seeds | Δ {label} per seed | mean | std | mean |Δ| |")
        print("|---|---|---|---|---|---|")
        for r in res["recipes"]:
            x = r[m]
            print(f"| {r['recipe']} | {', '.join(map(str, r['seeds']))} | "
                  f"{', '.join(f'{v:+.4f}' for v in x['per_seed'])} | {x['mean']:+.4f} | "
                  f"{x['sd']:.4f} | {x['mean_abs']:.4f} |")
        print()
    if res["contrasts"]:
        print("| contrast | metric | seed | on base | on other | other − base |")
        print("|---|---|---|---|---|---|")
        for c in res["contrasts"]:
            for r in c["per_seed"]:
                print(f"| {c['id']} | {c['metric']} | {r['seed']} | {r['base']:+.4f} | "
                      f"{r['other']:+.4f} | {r['diff']:+.4f} |")
            sd = "" if math.isnan(c["sd"]) else f" ± {c['sd']:.4f} (std)"
            print(f"| {c['id']} | {c['metric']} | mean | | | {c['mean']:+.4f}{sd} |")


def main(argv):
    args, hyp, json_out = [], None, None
    it = iter(argv)
    for a in it:
        if a == "--hypotheses":
            hyp = next(it, None) or fail("--hypotheses needs a file")
        elif a == "--json":
            json_out = next(it, None) or fail("--json needs a file")
        elif a.startswith("-"):
            fail(f"unknown option {a} (usage: family_effect.py BASE_DIR OTHER_DIR "
                 "[--hypotheses FILE] [--json OUT])")
        else:
            args.append(a)
    if len(args) != 2:
        fail("usage: family_effect.py BASE_DIR OTHER_DIR [--hypotheses FILE] [--json OUT]")
    if hyp is None:
        hyp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "studies",
                           "claims.toml")
    res = family_effect(read_runs(args[0]), read_runs(args[1]), read_contrasts(hyp))
    if json_out:
        def clean(v):  # JSON has no NaN: a std of one value is null
            if isinstance(v, float) and math.isnan(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v
        try:
            with open(json_out, "w", encoding="utf-8") as f:
                json.dump(clean(res), f, indent=1, allow_nan=False)
                f.write("\n")
        except OSError as e:
            fail(f"--json {json_out}: {e.strerror}")
    print_md(res)


if __name__ == "__main__":
    main(sys.argv[1:])
