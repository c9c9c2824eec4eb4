#!/usr/bin/env python3
"""Plots of a rollout set (docs/fidelity.md "Paired rollouts").

Reads a `rollout.json` written by `fp4train rollout` (format fp4train.rollout.v1) and writes
PNG files into --out (default: the JSON's directory):

  rollout_gap_by_step.png  each recipe's training-loss gap to the fp32 rollout at each step n
                           (mean over checkpoints and orders) with its 95% two-level bootstrap
                           band
  rollout_nll.png          each recipe's held-out NLL gap to fp32 after the last step, under
                           its quantized inference and of the same weights unquantized, mean
                           and 95% interval, recipes ordered by the quantized gap
  rollout_divergence.png   parameter divergence ||theta_r - theta_fp32|| / ||theta_fp32 -
                           theta_s|| per recipe, mean and 95% interval, ordered by value
  rollout_stability.png    only when every trace carries its gradient norms: the stability
                           counts of rollout.md (loss spikes, gradient-norm excursions,
                           non-finite steps), each one's mean per rollout per recipe, fp32
                           included, with 95% intervals

The intervals are rollout.md's, bit for bit: the two-level bootstrap of tools/rollout_stats.py
(checkpoints, then orders within a checkpoint; 2000 resamples from seed 20261206 unless
--resamples / --seed). A recipe with a non-finite value (a diverged rollout) in a quantity is
listed without a marker there, as rollout.md shows "—".

Usage:
  tools/plot_rollout.py ROLLOUT_JSON [--out DIR] [--title TEXT] [--resamples R] [--seed S]
Exit status 2 with a message for a file that is missing, not JSON or not a rollout set.
Standard library and matplotlib (Debian python3-matplotlib) only.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rollout_stats as rs  # noqa: E402
from plot_fidelity import interval_rows, save  # noqa: E402

COUNT_LABELS = {"spikes": "loss spikes per rollout",
                "gnorm_excursions": "gradient-norm excursions per rollout",
                "nonfinite": "non-finite steps per rollout"}


def fail(msg):
    print(f"plot_rollout.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def caption(d, boot):
    return (f"{len(d['steps'])} checkpoints x {d['orders']} orders, N = {d['length']} steps; "
            f"95% two-level bootstrap, {boot.resamples} resamples")


def draw_gap_bands(ax, series, key="at_step"):
    """One line per recipe of series (rollout_stats.recipe_series): the mean of entry `key`
    against n, and its bootstrap interval as a band; steps without a finite value are gaps."""
    for i, s in enumerate(series):
        color = f"C{i % 10}"
        pts = [e for e in s[key] if e["mean"] is not None]
        if not pts:
            ax.plot([], [], color=color, label=f"{s['name']} (not finite)")
            continue
        ns = [e["n"] for e in s[key]]
        nan = float("nan")
        mean = [e["mean"] if e["mean"] is not None else nan for e in s[key]]
        lo = [e["lo"] if e["lo"] is not None else nan for e in s[key]]
        hi = [e["hi"] if e["hi"] is not None else nan for e in s[key]]
        ax.fill_between(ns, lo, hi, color=color, alpha=0.18, linewidth=0)
        ax.plot(ns, mean, color=color, linewidth=1.4, label=s["name"])
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(alpha=0.3)


def plot_gap_by_step(plt, d, boot, out, title):
    fig, ax = plt.subplots(figsize=(9, 5.2))
    draw_gap_bands(ax, rs.recipe_series(d, boot))
    ax.set_xlabel("rollout step n")
    ax.set_ylabel("training loss, recipe − fp32 (nats)")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(f"{title}loss gap to the fp32 rollout by step, mean and 95% band\n"
                 f"({caption(d, boot)})", fontsize=10)
    return save(plt, fig, out, "rollout_gap_by_step.png")


def intervals(d, boot, grid_of, recipes):
    """{recipe index: {mean, lo, hi}} of grid_of(r) for r in recipes; None where non-finite."""
    out = {}
    for r in recipes:
        iv = boot.interval(grid_of(r))
        out[r] = None if iv is None else {"mean": iv[0], "lo": iv[1], "hi": iv[2]}
    return out


def ordered(stats):
    """Recipe indices by mean (the non-finite last, in file order)."""
    ok = sorted((r for r in stats if stats[r] is not None), key=lambda r: stats[r]["mean"])
    return ok + [r for r in stats if stats[r] is None]


def rows(ax, d, order, stats, color, offset, label, marker="o"):
    """interval_rows at y = position in order + offset, skipping the non-finite."""
    first = True
    for y, r in enumerate(order):
        s = stats[r]
        if s is None:
            continue
        interval_rows(ax, [d["recipes"][r]], [s], color, y + offset,
                      label if first else None, marker)
        first = False


def label_rows(ax, d, order, *stats):
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([d["recipes"][r] + ("" if all(s[r] is not None for s in stats)
                                           else " (not finite)") for r in order])
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.axvline(0, color="black", linewidth=0.6)


def plot_nll(plt, d, boot, out, title):
    recipes = range(1, len(d["recipes"]))
    q = intervals(d, boot, lambda r: rs.gap_grid(d, r, "nll"), recipes)
    u = intervals(d, boot, lambda r: rs.gap_grid(d, r, "nll_fp32"), recipes)
    order = ordered(q)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(order) + 2.4))
    rows(ax, d, order, q, "C0", -0.12, "quantized inference (policy current)")
    rows(ax, d, order, u, "C1", +0.12, "same weights, unquantized", marker="s")
    label_rows(ax, d, order, q, u)
    ax.set_xlabel(f"held-out NLL after {d['length']} steps, recipe − fp32 (nats; mean, 95% "
                  "interval)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
    ax.set_title(f"{title}held-out NLL gap to the fp32 rollout\n({caption(d, boot)})",
                 fontsize=10)
    return save(plt, fig, out, "rollout_nll.png")


def plot_divergence(plt, d, boot, out, title):
    v = intervals(d, boot, lambda r: rs.value_grid(d, r, "divergence"),
                  range(1, len(d["recipes"])))
    order = ordered(v)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(order) + 2.0))
    rows(ax, d, order, v, "C2", 0.0, None)
    label_rows(ax, d, order, v)
    ax.set_xlabel("‖θ_r − θ_fp32‖ / ‖θ_fp32 − θ_s‖ after the last step "
                  "(mean, 95% interval)")
    ax.set_title(f"{title}divergence from the fp32 rollout\n({caption(d, boot)})", fontsize=10)
    return save(plt, fig, out, "rollout_divergence.png")


def counts_present(d):
    """The stability counts, when every trace carries its gradient norms (else none)."""
    return list(rs.COUNTS) if rs.has_grad_norms(d) else []


def plot_stability(plt, d, boot, out, title, keys):
    recipes = range(len(d["recipes"]))
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 0.45 * len(recipes) + 2.2),
                             squeeze=False)
    for ax, k in zip(axes[0], keys):
        st = intervals(d, boot, lambda r: rs.count_grid(d, r, k), recipes)
        order = list(recipes)
        rows(ax, d, order, st, "C3", 0.0, None)
        label_rows(ax, d, order, st)
        ax.set_xlim(0, max(ax.get_xlim()[1], 1))  # counts: from 0
        ax.set_xlabel(f"{COUNT_LABELS[k]} (mean, 95% interval)")
    fig.suptitle(f"{title}stability counts per rollout ({caption(d, boot)})", fontsize=10)
    return save(plt, fig, out, "rollout_stability.png")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("rollout", help="rollout.json written by fp4train rollout")
    ap.add_argument("--out", help="directory for the PNG files (default: the JSON's directory)")
    ap.add_argument("--title", default="", help="prefix for the plot titles")
    ap.add_argument("--resamples", type=int, help="bootstrap resamples (default: the file's, else 2000)")
    ap.add_argument("--seed", type=int, help="bootstrap seed (default: the file's, else 20261206)")
    a = ap.parse_args(argv)
    if a.resamples is not None and a.resamples < 1:
        fail("--resamples must be >= 1")
    try:
        d = rs.load(a.rollout)
    except rs.BadInput as e:
        fail(str(e))
    if len(d["recipes"]) < 2:
        fail(f"{a.rollout}: no recipe besides the fp32 reference")
    out = a.out or os.path.dirname(os.path.abspath(a.rollout))
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create {out}: {e.strerror}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed (Debian: apt-get install python3-matplotlib)")
    a.resamples, a.seed = rs.bootstrap_of(d, a.resamples, a.seed)
    boot = rs.Bootstrap(len(d["steps"]), d["orders"], a.resamples, a.seed)
    title = f"{a.title}: " if a.title else ""
    for fn in (plot_gap_by_step, plot_nll, plot_divergence):
        print(fn(plt, d, boot, out, title))
    keys = counts_present(d)
    if keys:
        print(plot_stability(plt, d, boot, out, title, keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
