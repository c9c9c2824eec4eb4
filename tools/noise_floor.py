#!/usr/bin/env python3
"""The noise floor of a study (docs/results.md "The noise floor"): how much of a recipe difference
run-to-run noise alone would give.

Usage: python3 tools/noise_floor.py STUDY_DIR [SR_DIR ...]

STUDY_DIR is a `fp4train compare` directory (docs/results/study); each SR_DIR one whose runs
differ from STUDY_DIR's only in train.sr_seed (docs/results/study-sr1001, ...). Prints, from
the runs' summary.json (final-window training loss) and eval.json (held-out NLL, FP32
inference):

  * per recipe: mean and sample std over seeds (seed noise: initialisation and batch order);
  * per pair of recipes with common seeds: the paired difference per seed, its mean and
    standard error s/sqrt(n) (what a paired contrast of the study sees);
  * the SR-only differences: the same recipe and seed with another SR stream, minus the
    study's run (the noise that SR alone adds to a contrast with an SR recipe).

Standard library only. Exits with status 2 naming the file on unreadable input.
"""
import json
import math
import os
import re
import sys


def fail(msg):
    print(f"noise_floor.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def runs(d):
    """{(recipe, seed): (final_window_loss, heldout_nll)} of the finished runs in d."""
    out = {}
    if not os.path.isdir(d):
        fail(f"{d} is not a directory")
    for name in sorted(os.listdir(d)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        p = os.path.join(d, name, "summary.json")
        if not m or not os.path.exists(p):
            continue
        try:
            with open(p, encoding="utf-8") as f:
                s = json.load(f)
            out[(s["recipe"], int(s["seed"]))] = (s["final_window_loss"], s["heldout_nll"])
        except (OSError, ValueError, KeyError) as e:
            fail(f"{p}: {e}")
    return out


def mean_sd(xs):
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else float("nan")
    return m, sd


def main():
    if len(sys.argv) < 2:
        fail("usage: noise_floor.py STUDY_DIR [SR_DIR ...]")
    study = runs(sys.argv[1])
    if not study:
        fail(f"{sys.argv[1]}: no finished run (no */summary.json)")
    recipes = sorted({r for r, _ in study})
    print("| recipe | seeds | final-window loss, mean ± std | held-out NLL, mean ± std |")
    print("|---|---|---|---|")
    for r in recipes:
        fl = [v[0] for (q, _), v in sorted(study.items()) if q == r]
        nl = [v[1] for (q, _), v in sorted(study.items()) if q == r]
        (m1, s1), (m2, s2) = mean_sd(fl), mean_sd(nl)
        print(f"| {r} | {len(fl)} | {m1:.4f} ± {s1:.4f} | {m2:.4f} ± {s2:.4f} |")
    print()
    print("| A − B | per seed (final-window loss) | mean ± s.e. | held-out NLL: mean ± s.e. |")
    print("|---|---|---|---|")
    for i, a in enumerate(recipes):
        for b in recipes[i + 1:]:
            seeds = sorted({s for q, s in study if q == a} & {s for q, s in study if q == b})
            if len(seeds) < 2:
                continue
            d = [study[(a, s)][0] - study[(b, s)][0] for s in seeds]
            e = [study[(a, s)][1] - study[(b, s)][1] for s in seeds]
            (md, sd), (me, se) = mean_sd(d), mean_sd(e)
            n = math.sqrt(len(seeds))
            print(f"| {a} − {b} | {', '.join(f'{x:+.4f}' for x in d)} | {md:+.4f} ± {sd / n:.4f} "
                  f"| {me:+.4f} ± {se / n:.4f} |")
    if len(sys.argv) > 2:
        print()
        print("| SR stream | recipe, seed | Δ final-window loss | Δ held-out NLL |")
        print("|---|---|---|---|")
        for d in sys.argv[2:]:
            for (r, s), v in sorted(runs(d).items()):
                if (r.split("+")[0], s) in study:
                    base = study[(r.split("+")[0], s)]
                    print(f"| {os.path.basename(d.rstrip('/'))} | {r}, {s} | {v[0] - base[0]:+.4f} "
                          f"| {v[1] - base[1]:+.4f} |")


if __name__ == "__main__":
    main()
