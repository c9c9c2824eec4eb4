#!/usr/bin/env python3
"""Calibrate the fidelity panel against the loss study (docs/fidelity.md; the figures:
docs/results.md "What the panel resolves that the loss study did not").

Spearman's rank correlation, over the recipes both hold, between a panel metric (a recipe's
whole-gradient `rel_error`, `loss_penalty`, ...: the `mean` of fidelity.json's `whole` object)
and the recipe's mean final-window training loss (or held-out NLL) over the seeds of a study
directory (RECIPE-sSEED/summary.json, completed runs only). The interval is a 95% percentile
bootstrap over recipes (recipes drawn with replacement; ties take average ranks; a resample whose
ranks are all tied on one side is redrawn), from a fixed seed, so it is the same on every
machine. It covers which recipes were compared, not the noise of each recipe's own figures.

Usage:
  tools/fidelity_calibration.py PANEL/fidelity.json STUDY_DIR [--metric rel_error,loss_penalty]
      [--target final_window_loss] [--resamples 10000] [--seed 20261204] [--exclude bf16]
      [--json OUT.json]
Prints a markdown table (one row per panel metric) and the per-recipe figures.
Standard library only.
"""
import argparse
import glob
import json
import math
import os
import random
import sys


def ranks(xs):
    """Average ranks (1-based) of xs, ties sharing the mean of their positions."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return r


def spearman(x, y):
    """Pearson correlation of the average ranks; None if either side has a single rank."""
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def bootstrap(x, y, resamples, seed):
    rng = random.Random(seed)
    n = len(x)
    stats = []
    tries = 0
    while len(stats) < resamples:
        tries += 1
        if tries > 100 * resamples:
            break
        idx = [rng.randrange(n) for _ in range(n)]
        r = spearman([x[i] for i in idx], [y[i] for i in idx])
        if r is not None:
            stats.append(r)
    stats.sort()

    def q(p):  # Hyndman-Fan type 7
        h = (len(stats) - 1) * p
        lo = math.floor(h)
        hi = min(lo + 1, len(stats) - 1)
        return stats[lo] + (h - lo) * (stats[hi] - stats[lo])

    return q(0.025), q(0.975)


def study_means(study, target):
    out = {}
    for f in sorted(glob.glob(os.path.join(study, "*-s*", "summary.json"))):
        s = json.load(open(f))
        if s.get("status", "completed") != "completed" or s.get(target) is None:
            continue
        out.setdefault(s["recipe"], []).append(float(s[target]))
    return {r: sum(v) / len(v) for r, v in out.items()}, {r: len(v) for r, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("panel")
    ap.add_argument("study")
    ap.add_argument("--metric", default="rel_error,loss_penalty")
    ap.add_argument("--target", default="final_window_loss")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=20261204)
    ap.add_argument("--exclude", default="", help="recipes to leave out, a comma list (e.g. bf16: FP4 recipes only)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    try:
        panel = json.load(open(a.panel))
    except (OSError, ValueError) as e:
        sys.exit(f"fidelity_calibration: {a.panel}: {e}")
    if panel.get("format") != "fp4train.fidelity.v1":
        sys.exit(f"fidelity_calibration: {a.panel} is not a fidelity.json (format {panel.get('format')!r})")
    loss, seeds = study_means(a.study, a.target)
    if not loss:
        sys.exit(f"fidelity_calibration: {a.study} holds no completed RECIPE-sSEED/summary.json with {a.target}")
    excluded = {x.strip() for x in a.exclude.split(",") if x.strip()}
    recipes = [r["name"] for r in panel["recipes"] if r["name"] in loss and r["name"] not in excluded]
    if len(recipes) < 3:
        sys.exit(f"fidelity_calibration: only {len(recipes)} recipes in both the panel and the study (need 3)")
    rows = []
    for m in a.metric.split(","):
        m = m.strip()
        vals = {}
        for r in panel["recipes"]:
            if r["name"] in recipes:
                if m not in r["whole"]:
                    sys.exit(f"fidelity_calibration: metric {m!r} is not in the panel's whole object")
                vals[r["name"]] = r["whole"][m]["mean"]
        x = [vals[r] for r in recipes]
        y = [loss[r] for r in recipes]
        rho = spearman(x, y)
        lo, hi = bootstrap(x, y, a.resamples, a.seed) if rho is not None else (None, None)
        rows.append({"metric": m, "target": a.target, "recipes": len(recipes), "spearman": rho,
                     "lo": lo, "hi": hi, "resamples": a.resamples, "seed": a.seed})
    fmt = lambda v: "n/a" if v is None else f"{v:+.3f}"
    print(f"| panel metric | {a.target} | recipes | Spearman rho [95%, bootstrap over recipes] |")
    print("|---|---|---:|---|")
    for r in rows:
        print(f"| {r['metric']} | mean over seeds | {r['recipes']} | {fmt(r['spearman'])} [{fmt(r['lo'])}, {fmt(r['hi'])}] |")
    print()
    print(f"| recipe | seeds | {a.target} | " + " | ".join(r["metric"] for r in rows) + " |")
    print("|---|---:|---:|" + "---:|" * len(rows))
    byname = {r["name"]: r for r in panel["recipes"]}
    for name in sorted(recipes, key=lambda n: loss[n]):
        print(f"| {name} | {seeds[name]} | {loss[name]:.4f} | " +
              " | ".join(f"{byname[name]['whole'][r['metric']]['mean']:.5f}" for r in rows) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"panel": a.panel, "study": a.study, "rows": rows,
                       "recipes": {n: {"seeds": seeds[n], a.target: loss[n]} for n in recipes}}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
