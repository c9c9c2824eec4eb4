#!/usr/bin/env python3
"""Plots of a fidelity panel (docs/fidelity.md "Plots").

Reads a `fidelity.json` written by `fp4train fidelity` (format fp4train.fidelity.v1) and writes
four PNG files into --out (default: the JSON's directory):

  fidelity_error.png         whole-gradient and linear-weight relative error per recipe, with
                             the panel's 95% bootstrap intervals, and the mean dW error per kind
                             of linear (q/k/v/o_proj, up/down_proj, in/out_proj, lm_head: the
                             mean of the per-parameter means over layers, no interval)
  fidelity_over_steps.png    whole-gradient relative error and loss penalty at each checkpoint
  fidelity_bias_variance.png squared bias against variance of the whole gradient (both relative
                             to ||g*||^2), with intervals; RNE recipes sit on variance 0
  fidelity_sgd_noise.png     E||g^ - g*||^2 as a fraction of the minibatch (SGD) noise, log axis;
                             1 is where quantization noise would equal SGD noise

Usage:
  tools/plot_fidelity.py PANEL/fidelity.json [--out DIR] [--title TEXT]
Exit status 2 with a message for a file that is missing, not JSON or not a fidelity panel.
Standard library and matplotlib (Debian python3-matplotlib) only.
"""
import argparse
import json
import os
import re
import sys

FORMAT = "fp4train.fidelity.v1"
# Kinds of linear, in the order they are plotted; a parameter name ends in one of them.
LINEAR_KINDS = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "gate_proj", "down_proj",
                "in_proj", "out_proj", "lm_head"]


MARKERS = ["o", "s", "^", "D"]


def fail(msg):
    print(f"plot_fidelity.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    """The panel at path, checked for the fields the plots read."""
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"{path} is not JSON: {e}")
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        fail(f"{path} is not a fidelity panel (format is not {FORMAT})")
    recipes = d.get("recipes")
    if not isinstance(recipes, list) or not recipes:
        fail(f"{path}: no recipes")
    for i, r in enumerate(recipes):
        for key in ("name", "whole", "linears", "by_checkpoint"):
            if key not in r:
                fail(f"{path}: recipes[{i}] has no '{key}'")
        for m in ("rel_error", "bias2", "variance", "sgd_noise_fraction"):
            if m not in r["whole"]:
                fail(f"{path}: recipe {r['name']}: whole has no '{m}'")
    return d


def kind_of(param):
    """The kind of linear a parameter name denotes (e.g. layers.3.mixer.q_proj -> q_proj), or
    None for a norm or an embedding."""
    last = param.rsplit(".", 1)[-1]
    return last if last in LINEAR_KINDS else None


def kind_means(recipe):
    """{kind: mean rel_error over the parameters of that kind} from the per-parameter means."""
    acc = {}
    for name, m in recipe.get("params", {}).items():
        k = kind_of(name)
        if k is None or "rel_error" not in m:
            continue
        acc.setdefault(k, []).append(m["rel_error"])
    return {k: sum(v) / len(v) for k, v in acc.items()}


def interval_rows(ax, names, stats, color, offset=0.0, label=None, marker="o"):
    """One row per recipe: the mean as a marker, the 95% interval as a bar."""
    for i, (name, s) in enumerate(zip(names, stats)):
        y = i + offset
        ax.plot([s["lo"], s["hi"]], [y, y], color=color, linewidth=2)
        ax.plot([s["mean"]], [y], marker, color=color, markersize=5,
                label=label if i == 0 else None)


def plot_error(plt, d, out, title):
    rs = d["recipes"]
    names = [r["name"] for r in rs]
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.42 * len(rs) + 2.2),
                             gridspec_kw={"width_ratios": [1, 1.2]})
    ax = axes[0]
    interval_rows(ax, names, [r["whole"]["rel_error"] for r in rs], "C0", -0.15,
                  "whole gradient")
    interval_rows(ax, names, [r["linears"]["rel_error"] for r in rs], "C1", +0.15,
                  "linear weights (dW)", marker="s")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel("relative error ||g^ - g*|| / ||g*||  (mean, 95% interval)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2,
              fontsize=8)
    ax.set_title("error of the gradient, end to end")

    ax = axes[1]
    per = [kind_means(r) for r in rs]
    kinds = [k for k in LINEAR_KINDS if any(k in p for p in per)]
    if kinds:
        import matplotlib.cm as cm
        cmap = cm.get_cmap("tab10")
        for j, k in enumerate(kinds):
            xs = [p.get(k) for p in per]
            ys = [i for i, x in enumerate(xs) if x is not None]
            ax.plot([x for x in xs if x is not None], ys, "o", color=cmap(j % 10), label=k,
                    markersize=5, alpha=0.85)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1),
                  fontsize=8, ncol=5)
    else:
        ax.text(0.5, 0.5, "no per-parameter figures in this panel", ha="center",
                transform=ax.transAxes)
    ax.set_xlabel("relative dW error, mean over layers (per-parameter means, no interval)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("dW error by kind of linear")
    fig.suptitle(f"{title}error by recipe and role ({panel_caption(d)})", fontsize=10)
    return save(plt, fig, out, "fidelity_error.png")


def save(plt, fig, out, name, rect=None):
    """Lay out, write out/name at 110 dpi, close the figure; returns the path."""
    if rect is None:
        fig.tight_layout()
    else:
        fig.tight_layout(rect=rect)
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def panel_caption(d):
    ck = d.get("checkpoints", [])
    parts = [f"{len(ck)} checkpoints" if isinstance(ck, list) else "",
             f"{d.get('batches')} batches", f"{d.get('draws')} SR draws",
             f"{d.get('tokens_per_batch')} tokens/batch"]
    stress = d.get("stress")
    if isinstance(stress, dict) and stress.get("factor"):
        parts.append(f"outlier stress x{stress['factor']:g}")
    return ", ".join(p for p in parts if p)


def plot_over_steps(plt, d, out, title):
    rs = d["recipes"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.4))
    styles = ["-", "--", "-.", ":"]
    for i, r in enumerate(rs):
        pts = sorted(r["by_checkpoint"], key=lambda p: p["step"])
        steps = [p["step"] for p in pts]
        style = styles[(i // 10) % len(styles)]
        axes[0].plot(steps, [p["rel_error"] for p in pts], style, marker="o", markersize=3,
                     color=f"C{i % 10}", label=r["name"])
        if all("loss_penalty" in p for p in pts):
            axes[1].plot(steps, [p["loss_penalty"] for p in pts], style, marker="o",
                         markersize=3, color=f"C{i % 10}", label=r["name"])
    axes[0].set_ylabel("whole-gradient relative error")
    axes[1].set_ylabel("loss penalty L_r - L* (nats)")
    axes[1].axhline(0, color="black", linewidth=0.6)
    for ax in axes:
        ax.set_xlabel("checkpoint step (reference trajectory)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, ncol=6, loc="lower center")
    fig.suptitle(f"{title}error over training (means over batches and draws)", fontsize=10)
    return save(plt, fig, out, "fidelity_over_steps.png", rect=(0, 0.1, 1, 1))


def plot_bias_variance(plt, d, out, title):
    rs = d["recipes"]
    fig, ax = plt.subplots(figsize=(7.5, 6))
    for i, r in enumerate(rs):
        b, v = r["whole"]["bias2"], r["whole"]["variance"]
        c = f"C{i % 10}"
        ax.plot([b["lo"], b["hi"]], [v["mean"], v["mean"]], color=c, linewidth=1.2)
        ax.plot([b["mean"], b["mean"]], [v["lo"], v["hi"]], color=c, linewidth=1.2)
        ax.plot([b["mean"]], [v["mean"]], MARKERS[(i // 10) % len(MARKERS)], color=c,
                markersize=5,
                label=f"{r['name']}" + ("" if r.get("has_sr", True) else " (no SR)"))
    top = max(max(r["whole"]["bias2"]["hi"], r["whole"]["variance"]["hi"]) for r in rs)
    ax.plot([0, top], [0, top], color="gray", linewidth=0.7, linestyle=":")
    ax.text(top * 0.98, top * 0.93, "bias² = variance", ha="right", fontsize=7, color="gray")
    ax.set_xlabel("squared bias of the mean gradient / ||g*||²  (finite-R corrected)")
    ax.set_ylabel("variance over SR draws / ||g*||²")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=min(0, ax.get_ylim()[0]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"{title}bias against variance, whole gradient (95% intervals of each recipe;\n"
                 "paired contrasts, in fidelity.md, are tighter)", fontsize=10)
    return save(plt, fig, out, "fidelity_bias_variance.png")


def plot_sgd_noise(plt, d, out, title):
    rs = [r for r in d["recipes"] if r["whole"]["sgd_noise_fraction"]["mean"] > 0]
    fig, ax = plt.subplots(figsize=(9, 0.42 * max(len(rs), 1) + 2.2))
    names = [r["name"] for r in rs]
    interval_rows(ax, names, [r["whole"]["sgd_noise_fraction"] for r in rs], "C3", 0.0,
                  "E||g^ - g*||² / SGD noise")
    sigma = d.get("exact", {}).get("sgd_variance_by_checkpoint")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.text(1.0, -0.6, " = SGD noise", fontsize=7, va="bottom")
    ax.set_xscale("log")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_ylim(len(names) - 0.4, -0.9)
    ax.set_xlabel("quantization error as a fraction of minibatch gradient noise (log)")
    ax.grid(axis="x", alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    note = f"{d.get('tokens_per_batch')} tokens per batch" if sigma is not None else ""
    ax.set_title(f"{title}quantization noise against SGD noise, {note}", fontsize=10)
    return save(plt, fig, out, "fidelity_sgd_noise.png")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("panel", help="fidelity.json written by fp4train fidelity")
    ap.add_argument("--out", help="directory for the PNG files (default: the JSON's directory)")
    ap.add_argument("--title", default="", help="prefix for the plot titles")
    a = ap.parse_args(argv)
    d = load(a.panel)
    out = a.out or os.path.dirname(os.path.abspath(a.panel))
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
    title = f"{a.title}: " if a.title else ""
    for fn in (plot_error, plot_over_steps, plot_bias_variance, plot_sgd_noise):
        print(fn(plt, d, out, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
