#!/usr/bin/env python3
"""Noise against rollout length (docs/fidelity.md "Paired rollouts"): from one rollout.json,
how the paired loss gaps and contrasts resolve as the rollout grows, to choose N (steps) and
K x O (checkpoints x orders, the rollouts) of the next rollout set.

For every step n = 1..N, from the K x O rollouts of a `fp4train rollout` (format
fp4train.rollout.v1; usually a long one, N = 100):

  * per recipe, its training-loss gap to the fp32 rollout on the same (checkpoint, order):
    at step n (loss_r[n] - loss_fp32[n]) and of the mean over steps 1..n (what a "mean loss gap
    over N steps" reports; rollout.md's at n = N);
  * per pair of recipes A, B (A listed first; B - A as rollout.md's "Paired contrasts"):
    gap_B - gap_A on the same (checkpoint, order), at step n and of the means over 1..n;

each with its mean over the K x O rollouts, the between-rollout sample SD (n - 1), the 95%
two-level bootstrap interval and its half-width (hi - lo) / 2 (the interval of rollout.md, bit
for bit: checkpoints drawn with replacement, then orders within each drawn checkpoint; 2000
resamples from seed 20261206 unless --resamples / --seed; tools/rollout_stats.py), the
signal-to-noise |mean| / SD, and the rollouts needed to resolve it at 95%:
ceil((1.96 SD / |mean|)^2), at least 1, which treats the rollouts as independent draws (the
orders of one checkpoint share its weights, so where checkpoints differ much this is low: the
JSON's needed_bootstrap, ceil(R (half-width / |mean|)^2), scales the two-level interval
instead).

The recommendation takes, at each n, the median over contrasts of the rollouts needed
(unrounded, so ties do not hide the trend; tabled rounded up), and names the n where it is
smallest and the first n within 10% of that (no longer rollout improves on it by more than
10%), for the mean over 1..n and for the gap at step n. It is only as good as this run's
contrasts: SDs from R rollouts are uncertain by about 1/sqrt(2(R - 1)) (about 30% for 6), and
other recipes differ by other amounts. The noise does not say what the gap means: at small n
the loss gap is mostly the forward's quantization of the same weights, not what training did to
them. With one recipe besides fp32 its gap to fp32 stands in for the contrasts.

Prints markdown tables sampled at n = 1, 2, 5, 10, 20, 40, 60, 80, 100 and N (those <= N)
and at --at; --json writes every n; --plot writes a PNG (matplotlib): each recipe's gap at
step n with its band and its mean over 1..n, and each contrast's rollouts needed (log axis).

Usage:
  tools/rollout_noise.py ROLLOUT_JSON [--at N[,N...]] [--json OUT.json] [--plot OUT.png]
                         [--resamples R] [--seed S]
Exit status 2 with a message for a file that is missing, not JSON, not a rollout set, with
N < 2, with one rollout only or without a recipe besides fp32. Standard library only
(matplotlib for --plot).
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rollout_stats as rs  # noqa: E402

SAMPLED = (1, 2, 5, 10, 20, 40, 60, 80, 100)
IMPROVEMENT = 0.10  # "stops improving": within 10% of the smallest median
VARIANTS = (("cumulative", "mean gap over steps 1..n"), ("at_step", "gap at step n"))


def fail(msg):
    print(f"rollout_noise.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_at(values, N):
    out = set()
    for v in values or []:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                n = int(part)
            except ValueError:
                fail(f"--at {part}: not an integer")
            if not 1 <= n <= N:
                fail(f"--at {n}: outside the rollout's steps 1..{N}")
            out.add(n)
    return out


def medians(items, key):
    """Per n (index n - 1), the median over items of entry key's `needed_exact` (unrounded);
    None where any item has no finite figure at that n (a diverged rollout)."""
    N = len(items[0][key])
    out = []
    for k in range(N):
        vals = [it[key][k]["needed_exact"] for it in items]
        out.append(None if any(v is None for v in vals) else statistics.median(vals))
    return out


def recommend(items, key):
    """{best_n, best, knee_n, knee, cheapest_n, cheapest_steps} from the medians of items
    (None for each when no n has a finite median)."""
    med = medians(items, key)
    ok = [(k + 1, m) for k, m in enumerate(med) if m is not None and math.isfinite(m)]
    if not ok:
        return {"medians": med, "best_n": None, "best": None, "knee_n": None, "knee": None,
                "cheapest_n": None, "cheapest_steps": None}
    best_n, best = min(ok, key=lambda p: (p[1], p[0]))
    knee_n, knee = next(p for p in ok if p[1] <= (1 + IMPROVEMENT) * best)
    cheap_n, cheap = min(((n, n * m) for n, m in ok), key=lambda p: (p[1], p[0]))
    return {"medians": med, "best_n": best_n, "best": best, "knee_n": knee_n, "knee": knee,
            "cheapest_n": cheap_n, "cheapest_steps": cheap}


def analyse(d, resamples, seed):
    boot = rs.Bootstrap(len(d["steps"]), d["orders"], resamples, seed)
    recipes = rs.recipe_series(d, boot)
    contrasts = rs.contrast_series(d, boot)
    basis = contrasts if contrasts else recipes
    return {"format": "fp4train.rollout_noise.v1", "length": d["length"],
            "checkpoints": d["steps"], "orders": d["orders"], "rollouts": rs.rollouts(d),
            "resamples": resamples, "seed": seed, "z": rs.Z95,
            "recipes": recipes, "contrasts": contrasts,
            "recommendation_basis": "contrasts" if contrasts else "gaps to fp32",
            "recommendation": {key: recommend(basis, key) for key, _ in VARIANTS}}


# ------------------------------------------------------------------------------ markdown


def num(v, sign=""):
    """5 decimals as rollout.md; below 5e-5 (which would print as 0.00000) 2 significant
    digits."""
    if v is None:
        return "—"
    if v != 0 and abs(v) < 5e-5:
        return format(v, sign + ".1e")
    return format(v, sign + ".5f")


def needed(v):
    """A number of rollouts: rounded up, at least 1; ∞ for a mean of 0."""
    v = rs.rounded_up(v)
    if v is None:
        return "—"
    return "∞" if v == math.inf else str(v)


def plural(k, one, many):
    return f"{k} {one if k == 1 else many}"


def rollouts_text(v):
    """"1 rollout", "6 rollouts": v rounded up."""
    r = needed(v)
    return f"{r} rollout" + ("" if r == "1" else "s")


def cells(e, snr):
    c = [num(e["mean"], "+"), num(e["sd"]),
         "—" if e["half_width"] is None else "±" + num(e["half_width"])]
    if snr:
        v = e["snr"]
        c.append("—" if v is None or math.isnan(v) else "∞" if v == math.inf else f"{v:.2f}")
    return c + [needed(e["needed"])]


def table(md, item, ns, snr):
    cols = ["mean", "SD", "±95%"] + (["SNR"] if snr else []) + ["needed"]
    md.append("| n | " + " | ".join(f"{c}, at n" for c in cols) + " | "
              + " | ".join(f"{c}, 1..n" for c in cols) + " |")
    md.append("|--:|" + "--:|" * (2 * len(cols)))
    for n in ns:
        md.append(f"| {n} | " + " | ".join(cells(item["at_step"][n - 1], snr)) + " | "
                  + " | ".join(cells(item["cumulative"][n - 1], snr)) + " |")
    md.append("")


def contrast_name(c):
    return f"`{c['b']}` − `{c['a']}`"


def markdown(res, path, ns):
    R, K, O = res["rollouts"], len(res["checkpoints"]), res["orders"]
    md = [f"# Noise against rollout length: {path}", "",
          f"N = {res['length']} steps; {R} rollouts per recipe ({K} checkpoints × {O} orders). "
          "Per (checkpoint, order) the recipe minus fp32 (or B − A of two recipes' gaps), then "
          "over the rollouts: mean, between-rollout SD, half-width of the 95% two-level "
          f"bootstrap interval (checkpoints, then orders; {res['resamples']} resamples, seed "
          f"{res['seed']}), SNR = |mean| / SD and needed = ceil((1.96 SD / |mean|)²) rollouts "
          "(at least 1) to resolve it at 95%. \"at n\": the training-loss gap at step n; "
          "\"1..n\": its mean over steps 1..n.", ""]
    md += ["## Gap to the fp32 rollout", ""]
    for r in res["recipes"]:
        md += [f"`{r['name']}`", ""]
        table(md, r, ns, snr=False)
    if res["contrasts"]:
        md += ["## Paired contrasts (B − A)", ""]
        for c in res["contrasts"]:
            md += [contrast_name(c), ""]
            table(md, c, ns, snr=True)
    basis = res["contrasts"] or res["recipes"]
    names = ([contrast_name(c) for c in res["contrasts"]] if res["contrasts"]
             else [f"`{r['name']}` − fp32" for r in res["recipes"]])
    md += ["## Rollouts needed", "",
           f"Per {'contrast' if res['contrasts'] else 'gap to fp32'}, and the median over them "
           "(the recommendation's figure: the median of the unrounded figures, rounded up).",
           ""]
    for key, what in VARIANTS:
        med = res["recommendation"][key]["medians"]
        md.append(f"| n, {what} | " + " | ".join(names) + " | median |")
        md.append("|--:|" + "--:|" * (len(names) + 1))
        for n in ns:
            md.append(f"| {n} | " + " | ".join(needed(it[key][n - 1]["needed"]) for it in basis)
                      + f" | {needed(med[n - 1])} |")
        md.append("")
    md += ["## Recommendation", ""]
    for key, what in VARIANTS:
        rec = res["recommendation"][key]
        if rec["best_n"] is None:
            md.append(f"* {what}: no n resolves {'a contrast' if res['contrasts'] else 'a gap'} "
                      "(every median is infinite or not finite).")
            continue
        what_over = plural(len(basis), "contrast" if res["contrasts"] else "gap to fp32",
                           "contrasts" if res["contrasts"] else "gaps to fp32")
        md.append(f"* {what}: the median over {what_over} of the rollouts needed is smallest at "
                  f"n = {rec['best_n']} ({rollouts_text(rec['best'])}) and first within "
                  f"{IMPROVEMENT:.0%} of that at n = {rec['knee_n']} "
                  f"({rollouts_text(rec['knee'])}); rollouts × n (the training steps of one "
                  f"recipe) is smallest at n = {rec['cheapest_n']}.")
    md += ["", f"This comes from this run's {'contrasts' if res['contrasts'] else 'gaps'} "
           f"({R} rollouts; an SD from {R} values is uncertain by about "
           f"{1 / math.sqrt(2 * (R - 1)):.0%}); other recipes differ by other amounts, and the "
           "needed rollouts treat the K × O rollouts as independent (the JSON's "
           "needed_bootstrap scales the two-level interval instead). At small n the loss gap "
           "is mostly the forward's quantization of the same weights, not what training did to "
           "them: the noise alone does not choose N.", ""]
    return "\n".join(md)


# ------------------------------------------------------------------------------ JSON, plot


def clean(v):
    """JSON has no NaN or infinity: null for NaN, the string "inf" for infinity."""
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [clean(x) for x in v]
    return v


def plot(res, d, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed (Debian: apt-get install python3-matplotlib)")
    from plot_fidelity import save
    from plot_rollout import draw_gap_bands
    fig, axes = plt.subplots(2, 1, figsize=(9, 9), sharex=True)
    ax = axes[0]
    draw_gap_bands(ax, res["recipes"], "at_step")
    for i, r in enumerate(res["recipes"]):
        ns = [e["n"] for e in r["cumulative"] if e["mean"] is not None]
        ax.plot(ns, [e["mean"] for e in r["cumulative"] if e["mean"] is not None], "--",
                color=f"C{i % 10}", linewidth=1.0)
    ax.plot([], [], "--", color="gray", label="mean over steps 1..n")
    ax.set_ylabel("training loss, recipe − fp32 (nats)")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("gap to the fp32 rollout at step n: mean and 95% two-level bootstrap band",
                 fontsize=10)
    ax = axes[1]
    basis = res["contrasts"] or res["recipes"]
    for i, it in enumerate(basis):
        name = f"{it['b']} − {it['a']}" if "a" in it else f"{it['name']} − fp32"
        for key, style in (("at_step", "-"), ("cumulative", "--")):
            pts = [(e["n"], e["needed_exact"]) for e in it[key]
                   if e["needed_exact"] is not None and math.isfinite(e["needed_exact"])]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{(i + 5) % 10}",
                    linewidth=1.2 if key == "at_step" else 1.6,
                    label=name if key == "at_step" else None)
    for key, style in (("at_step", "-"), ("cumulative", "--")):
        med = res["recommendation"][key]["medians"]
        pts = [(k + 1, m) for k, m in enumerate(med) if m is not None and math.isfinite(m)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color="black", linewidth=2.2,
                label="median" if key == "at_step" else None)
    ax.plot([], [], "-", color="black", linewidth=0.8, label="gap at step n")
    ax.plot([], [], "--", color="black", linewidth=0.8, label="mean over steps 1..n")
    ax.axhline(res["rollouts"], color="gray", linewidth=1.0, linestyle=":")
    ax.text(1, res["rollouts"], f" this run: {res['rollouts']} rollouts", fontsize=7,
            va="bottom")
    ax.set_yscale("log")
    ax.set_xlabel("rollout step n")
    ax.set_ylabel("rollouts (K × O) needed for 95%: (1.96 SD / |mean|)²")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("rollouts needed to resolve each "
                 f"{'contrast B − A' if res['contrasts'] else 'gap'}", fontsize=10)
    fig.suptitle(f"noise against rollout length ({len(d['steps'])} checkpoints × "
                 f"{d['orders']} orders, N = {d['length']})", fontsize=10)
    out = os.path.dirname(os.path.abspath(path))
    os.makedirs(out, exist_ok=True)
    return save(plt, fig, out, os.path.basename(path))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("rollout", help="rollout.json written by fp4train rollout")
    ap.add_argument("--at", action="append", help="more steps n to table (comma-separated)")
    ap.add_argument("--json", help="write every step's figures to this file")
    ap.add_argument("--plot", help="write the plot to this PNG file")
    ap.add_argument("--resamples", type=int, help="bootstrap resamples (default: the file's, else 2000)")
    ap.add_argument("--seed", type=int, help="bootstrap seed (default: the file's, else 20261206)")
    a = ap.parse_args(argv)
    if a.resamples is not None and a.resamples < 1:
        fail("--resamples must be >= 1")
    try:
        d = rs.load(a.rollout)
    except rs.BadInput as e:
        fail(str(e))
    N, R = d["length"], rs.rollouts(d)
    if N < 2:
        fail(f"{a.rollout}: length N = {N}; a curve against n needs N >= 2")
    if R < 2:
        fail(f"{a.rollout}: one rollout only ({len(d['steps'])} checkpoint × {d['orders']} "
             "order): no between-rollout SD or interval")
    if len(d["recipes"]) < 2:
        fail(f"{a.rollout}: no recipe besides the fp32 reference")
    ns = sorted({n for n in SAMPLED if n <= N} | {N} | parse_at(a.at, N))
    a.resamples, a.seed = rs.bootstrap_of(d, a.resamples, a.seed)
    res = analyse(d, a.resamples, a.seed)
    print(markdown(res, a.rollout, ns))
    if a.json:
        try:
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump(clean(res), f, indent=1)
                f.write("\n")
        except OSError as e:
            fail(f"cannot write {a.json}: {e.strerror}")
    if a.plot:
        print(plot(res, d, a.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
