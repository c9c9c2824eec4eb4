#!/usr/bin/env python3
"""Plot fp4train runs: training loss, difference to a baseline, held-out NLL and telemetry.

Usage:
    python3 tools/plot_runs.py --out DIR [--baseline NAME] RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a directory written by `fp4train train` (or `fp4train compare`): it holds
metrics.jsonl (one JSON object per logged step: step, loss, grad_norm, optionally val_nll,
val_nll_quant and telemetry; or its metrics.jsonl.zst, once `fp4train compact` compressed
it) and recipe.toml or summary.json naming the recipe. Runs are
grouped by recipe; the seeds of one recipe form a band (min..max over seeds) around their
mean. Writes into DIR:

    loss.png          training loss, smoothed (trailing mean over --smooth steps), seed bands
    loss_vs_baseline.png
                      recipe minus baseline smoothed loss over steps, paired by seed (the
                      same seed means the same initialisation and batches). The baseline is
                      --baseline NAME (a recipe among the runs, or the one recipe that is NAME
                      changed by `--set`, "NAME+key=value"), by default bf16 if present, else
                      fp32; `--baseline ""` for none
    heldout.png       held-out NLL at evaluation steps (solid line, filled circles: FP32
                      inference; dashed line, open squares: the recipe's quantized inference
                      with current scaling)
    telemetry.png     fraction of FP4 blocks whose scale saturated, and that hit the zero
                      guard (worst operand over all layers, mean over seeds), per recipe
    scale_range.png   where the block scales fall inside each scale format's range (its
                      smallest subnormal and largest finite value drawn; all-zero blocks and
                      blocks whose scale underflowed are left out, their share in the
                      legend), per operand, at the
                      first and the last telemetry step (drawn once when a run has only one):
                      from metrics.jsonl's scale_hist, for
                      --scale-recipes (default: ue5m3-b16 and nvfp4-all when present, else the
                      first recipe of each scale format); only when the runs have scale_hist
    hypotheses.png    with --hypotheses FILE (hypotheses.json, written by fp4train compare /
                      report): each claim's contrast per seed, its mean and 95% t-interval
                      (and paired bootstrap, held-out NLL), coloured by verdict

Step axes have integer ticks; a series of few points (at most FEW_POINTS, a short run) is
drawn with larger markers, and one of a single point names its step and value in the legend.
Only the Python standard library and matplotlib (Debian python3-matplotlib) are used.
Exits with status 2 and a message naming the file on unreadable or malformed input.
"""
import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_metrics  # noqa: E402  (tools/run_metrics.py: metrics.jsonl or metrics.jsonl.zst)


def fail(msg):
    print(f"plot_runs.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def recipe_of(run_dir):
    """Recipe name from summary.json, else from recipe.toml's `name = "..."`."""
    summary = os.path.join(run_dir, "summary.json")
    if os.path.exists(summary):
        try:
            with open(summary, encoding="utf-8") as f:
                name = json.load(f).get("recipe")
            if name:
                return name
        except (OSError, ValueError) as e:
            fail(f"{summary}: {e}")
    toml = os.path.join(run_dir, "recipe.toml")
    if os.path.exists(toml):
        with open(toml, encoding="utf-8") as f:
            for line in f:
                m = re.match(r'\s*name\s*=\s*"([^"]*)"', line)
                if m:
                    return m.group(1)
    fail(f"{run_dir}: no summary.json or recipe.toml naming the recipe")


def seed_of(run_dir):
    """Seed from summary.json, else from config.toml's `seed = N`; None if neither says."""
    summary = os.path.join(run_dir, "summary.json")
    if os.path.exists(summary):
        with open(summary, encoding="utf-8") as f:
            seed = json.load(f).get("seed")
        if seed is not None:
            return seed
    cfg = os.path.join(run_dir, "config.toml")
    if os.path.exists(cfg):
        with open(cfg, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"\s*seed\s*=\s*(\d+)", line)
                if m:
                    return int(m.group(1))
    return None


def find_baseline(names, want):
    """The recipe among `names` that `want` names: itself, else the one `want+...` label."""
    if not want:
        return None
    if want in names:
        return want
    found = [n for n in names if n.startswith(want + "+")]
    if len(found) > 1:
        fail(f"--baseline {want} is ambiguous: {', '.join(found)}; name one exactly")
    return found[0] if found else None


def read_metrics(run_dir):
    """List of step records (dicts) from metrics.jsonl (or a compacted run's
    metrics.jsonl.zst: the same lines), sorted by step."""
    try:
        path = run_metrics.metrics_path(run_dir)
        if path is None:
            fail(f"{os.path.join(run_dir, run_metrics.PLAIN)} does not exist (is {run_dir} a run directory?)")
        f = run_metrics.open_metrics(path)
    except run_metrics.MetricsError as e:
        fail(str(e))
    recs = []
    with f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                fail(f"{path}:{i}: not JSON ({e})")
            if "step" not in r:
                fail(f"{path}:{i}: record without 'step'")
            recs.append(r)
    recs.sort(key=lambda r: r["step"])
    return recs


def trailing_mean(xs, w):
    out, s, q = [], 0.0, []
    for x in xs:
        q.append(x)
        s += x
        if len(q) > w:
            s -= q.pop(0)
        out.append(s / len(q))
    return out


def finite(x):
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


FEW_POINTS = 20  # a series of at most this many points is drawn with larger markers


def line_marker(n):
    """Marker of a loss curve of n points: none on a long one, circles on a short one."""
    return "o" if n <= FEW_POINTS else None


def marker_size(n):
    """Marker size for a series of n points: larger when few, largest for one point."""
    return 7 if n == 1 else 5 if n <= FEW_POINTS else 3


def only_point(steps, values, fmt, unit=""):
    """Legend suffix for a series of a single point: its step and value; else ""."""
    return f" (step {steps[0]} only: {values[0]:{fmt}}{unit})" if len(steps) == 1 else ""


def step_axis(ax, steps):
    """Integer ticks on a step axis (else as matplotlib's default locator places them); a span
    under 2 steps is padded to one step either side."""
    if not steps:
        return
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    if max(steps) - min(steps) < 2:
        ax.set_xlim(min(steps) - 1, max(steps) + 1)


def seed_stats(series_list):
    """Mean, min and max over seeds at the steps every seed has."""
    common = set(series_list[0])
    for s in series_list[1:]:
        common &= set(s)
    steps = sorted(common)
    mean = [sum(s[t] for s in series_list) / len(series_list) for t in steps]
    lo = [min(s[t] for s in series_list) for t in steps]
    hi = [max(s[t] for s in series_list) for t in steps]
    return steps, mean, lo, hi


def worst_telemetry(rec, key):
    t = rec.get("telemetry")
    if not t:
        return None
    vals = [op.get(key, 0.0) for layer in t.values() for op in layer.values()]
    return max(vals) if vals else None


def decode_scale(code, h):
    """The value of a block-scale code of the format described in a scale_hist record."""
    e_bits, m_bits, bias = h["exp_bits"], h["frac_bits"], h["bias"]
    mag = code & ((1 << (e_bits + m_bits)) - 1)  # an unsigned scale: the sign bit is 0
    e, m = mag >> m_bits, mag & ((1 << m_bits) - 1)
    if e == 0 and h["subnormals"]:
        return (m / (1 << m_bits)) * 2.0 ** (1 - bias)
    return (1 + m / (1 << m_bits)) * 2.0 ** (e - bias)


def scale_hists(recs):
    """(first, last) telemetry steps' scale_hist records with linears == "all", keyed by
    operand, or None when the run has none."""
    tel = [r for r in recs if r.get("scale_hist")]
    if not tel:
        return None
    pick = lambda r: {h["operand"]: h for h in r["scale_hist"] if h.get("linears") == "all"}
    return (tel[0]["step"], pick(tel[0])), (tel[-1]["step"], pick(tel[-1]))


def plot_scale_range(plt, out, groups, order, colors, pre, wanted):
    """scale_range.png (see the module docstring); returns False when no run has scale_hist."""
    have = {}
    for r in order:
        for recs in groups[r]:
            sh = scale_hists(recs)
            if sh:
                have[r] = sh  # the first seed's run with telemetry
                break
    if not have:
        return False
    if wanted:
        chosen = [r for r in wanted if r in have]
        missing = [r for r in wanted if r not in have]
        if missing:
            fail(f"--scale-recipes: no scale_hist telemetry in the runs of {', '.join(missing)}")
    else:
        chosen = [r for r in ("ue5m3-b16", "nvfp4-all") if r in have]
        if len(chosen) < 2:
            seen = {have[r][0][1][next(iter(have[r][0][1]))]["scale_format"] for r in chosen}
            for r in have:
                fmt = have[r][0][1][next(iter(have[r][0][1]))]["scale_format"]
                if fmt not in seen:
                    chosen.append(r)
                    seen.add(fmt)
    operands = [("x", "fprop X"), ("w", "fprop W"), ("dy", "dgrad dY"), ("dyt", "wgrad dY\u1d40")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))

    def views(r):
        """(step, hists), line style and step label of each telemetry step drawn for r."""
        (s0, h0), (s1, h1) = have[r]
        if s0 == s1:
            return [((s1, h1), "-", f"step {s1} only")]
        return [((s0, h0), "--", f"step {s0}"), ((s1, h1), "-", f"step {s1}")]

    for ax, (op, title) in zip(axes.flat, operands):
        for r in chosen:
            for (step, hs), style, when in views(r):
                h = hs.get(op)
                if not h:
                    continue
                counts = h["scale_code_blocks"]
                apart = h.get("zero_blocks", 0) + h.get("guarded_blocks", 0)
                total = sum(counts) + apart
                if not sum(counts):
                    continue
                xs = [math.log2(decode_scale(h["scale_code_first"] + i, h))
                      for i in range(len(counts))]
                ys = [100.0 * c / total for c in counts]
                ax.plot(xs, ys, style, color=colors[r], linewidth=1.2,
                        label=f"{r} ({h['scale_format']}), {when}; "
                              f"{100.0 * apart / total:.1f}% zero or underflowed, not drawn")
            h = have[r][1][1].get(op)
            if h:  # the format's range, in the recipe's colour
                for v in (h["scale_min"], h["scale_max"]):
                    ax.axvline(math.log2(v), color=colors[r], linestyle=":", linewidth=1)
        ax.set_xlabel("block scale c_b (log2)")
        ax.set_ylabel("% of blocks")
        ax.set_title(pre + f"{title}: block scales, all FP4 linears", fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left")  # the scales sit right of centre
    single = [len(views(r)) == 1 for r in chosen]
    if all(single):
        steps_key = "solid: the only telemetry step"
    elif any(single):
        steps_key = "dashed: first telemetry step, solid: last (or the only one)"
    else:
        steps_key = "dashed: first telemetry step, solid: last"
    fig.suptitle("dotted: each format's smallest subnormal and largest finite scale; "
                 + steps_key, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scale_range.png"), dpi=110)
    plt.close(fig)
    return True


def plot_hypotheses(plt, out, path, pre):
    """hypotheses.png: one row per claim (see the module docstring)."""
    try:
        with open(path, encoding="utf-8") as f:
            hyps = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    if not isinstance(hyps, list):
        fail(f"{path}: not a JSON array of hypotheses")
    metrics = []
    for h in hyps:
        if not isinstance(h, dict) or "id" not in h or "metric" not in h:
            fail(f"{path}: a hypothesis without id or metric")
        if h["metric"] not in metrics:
            metrics.append(h["metric"])
    colour = {"supported": "tab:green", "contradicted": "tab:red", "not resolved": "tab:gray",
              "not run": "lightgray"}
    units = {"final_loss": "final-window training loss contrast (nats/token)",
             "heldout_nll": "held-out NLL contrast (nats/token)",
             "heldout_nll_last": "held-out NLL (mean of the last 2 evaluations) contrast (nats/token)",
             "grad_norm_excursions": "grad-norm excursions contrast (steps)"}
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 0.5 * len(hyps) + 2),
                             squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        rows = [h for h in hyps if h["metric"] == metric]
        for i, h in enumerate(rows):
            y = len(rows) - 1 - i
            c = colour.get(h.get("verdict"), "black")
            per = [x for x in h.get("per_seed", []) if finite(x)]
            ax.plot(per, [y] * len(per), "o", color=c, alpha=0.5, markersize=4)
            if h.get("t95"):
                lo, hi = h["t95"]
                if finite(lo) and finite(hi):
                    ax.plot([lo, hi], [y, y], color=c, linewidth=2)
            b = h.get("bootstrap95")
            if b and finite(b.get("lo")) and finite(b.get("hi")):
                ax.plot([b["lo"], b["hi"]], [y - 0.18, y - 0.18], color=c, linewidth=1,
                        linestyle="--")
            if finite(h.get("mean")):
                ax.plot([h["mean"]], [y], "D", color=c, markersize=6)
            if (h.get("expect") == "equivalent" and finite(h.get("margin"))
                    and h.get("verdict") != "not run"):
                ax.plot([-h["margin"], h["margin"]], [y, y], color="black", linewidth=6,
                        alpha=0.15, solid_capstyle="butt")
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{h['id']} ({h.get('verdict', '?')})" for h in reversed(rows)],
                           fontsize=8)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel(units.get(metric, metric), fontsize=9)
        ax.grid(alpha=0.3, axis="x")
        ax.set_title(pre + metric, fontsize=9)
    from matplotlib.lines import Line2D
    fig.legend(handles=[Line2D([], [], color=c, linewidth=2, label=v) for v, c in colour.items()],
               loc="lower center", ncol=len(colour), fontsize=8, frameon=False)
    fig.suptitle("each claim's contrast: dots per seed, diamond the mean, solid bar the 95% "
                 "t-interval, dashed the paired bootstrap; grey band: equivalence margin",
                 fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(os.path.join(out, "hypotheses.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the PNG files")
    ap.add_argument("--smooth", type=int, default=10, help="trailing-mean window in steps")
    ap.add_argument("--title", default="", help="prefix for plot titles")
    ap.add_argument("--baseline", default=None,
                    help="recipe the difference plot is against (default: bf16, else fp32; "
                         "\"\" for none)")
    ap.add_argument("--scale-recipes", default="",
                    help="comma-separated recipes for scale_range.png (default: ue5m3-b16 and "
                         "nvfp4-all, else one per scale format)")
    ap.add_argument("--hypotheses", default="",
                    help="hypotheses.json of fp4train compare/report: also write hypotheses.png")
    ap.add_argument("runs", nargs="+", help="run directories")
    a = ap.parse_args()
    if a.smooth < 1:
        fail("--smooth must be at least 1")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed for this python3 (Debian: apt install python3-matplotlib)")

    groups = {}  # recipe -> list of metrics
    seeds = {}   # recipe -> list of seeds, parallel to groups
    for d in a.runs:
        if not os.path.isdir(d):
            fail(f"{d} is not a directory")
        r = recipe_of(d)
        groups.setdefault(r, []).append(read_metrics(d))
        seeds.setdefault(r, []).append(seed_of(d))
    os.makedirs(a.out, exist_ok=True)
    order = list(groups)
    if a.baseline is None:
        baseline = find_baseline(order, "bf16") or find_baseline(order, "fp32")
    elif a.baseline == "":
        baseline = None
    else:
        baseline = find_baseline(order, a.baseline)
        if baseline is None:
            fail(f"--baseline {a.baseline} is not among the runs' recipes ({', '.join(order)})")
    colors = {r: plt.cm.tab10(i % 10) for i, r in enumerate(order)}
    pre = (a.title + ": ") if a.title else ""

    def smoothed_losses(runs):
        out = []
        for recs in runs:
            rs = [r for r in recs if finite(r.get("loss"))]
            sm = trailing_mean([r["loss"] for r in rs], a.smooth)
            out.append({r["step"]: v for r, v in zip(rs, sm)})
        return out

    # 1. training loss
    fig, ax = plt.subplots(figsize=(8, 5))
    means = {}
    all_steps = []
    for r in order:
        steps, mean, lo, hi = seed_stats(smoothed_losses(groups[r]))
        means[r] = dict(zip(steps, mean))
        all_steps += steps
        n = len(groups[r])
        ax.plot(steps, mean, color=colors[r], marker=line_marker(len(steps)),
                markersize=marker_size(len(steps)),
                label=f"{r} ({n} seed{'s' if n > 1 else ''})" + only_point(steps, mean, ".4f"))
        if n > 1:
            ax.fill_between(steps, lo, hi, color=colors[r], alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    step_axis(ax, all_steps)
    ax.set_ylabel(f"training loss (nats/token, trailing mean of {a.smooth})")
    ax.set_title(pre + "training loss (band: min..max over seeds)")
    if means:
        tail = [v for m in means.values() for t, v in m.items() if t > max(m) * 0.2]
        if tail:
            ax.set_ylim(min(tail) - 0.05, max(tail) + 0.1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "loss.png"), dpi=110)
    plt.close(fig)

    # 2. difference to the baseline, paired by seed where the seeds match (same init and batches)
    fig, ax = plt.subplots(figsize=(8, 5))
    all_steps = []
    if baseline is not None:
        base = dict(zip(seeds[baseline], smoothed_losses(groups[baseline])))
        for r in order:
            if r == baseline:
                continue
            diffs = [{t: v - base[sd][t] for t, v in run.items() if t in base[sd]}
                     for sd, run in zip(seeds[r], smoothed_losses(groups[r]))
                     if sd is not None and sd in base]
            if diffs:
                steps, mean, lo, hi = seed_stats(diffs)
                n = len(diffs)
                ax.plot(steps, mean, color=colors[r], marker=line_marker(len(steps)),
                        markersize=marker_size(len(steps)),
                        label=f"{r} ({n} paired seed{'s' if n > 1 else ''})"
                              + only_point(steps, mean, "+.3g"))
                if n > 1:
                    ax.fill_between(steps, lo, hi, color=colors[r], alpha=0.15, linewidth=0)
            else:  # no common seed: difference of the means
                steps = [t for t in sorted(means[r]) if t in means[baseline]]
                d = [means[r][t] - means[baseline][t] for t in steps]
                ax.plot(steps, d, "--", color=colors[r], marker=line_marker(len(steps)),
                        markersize=marker_size(len(steps)),
                        label=f"{r} (unpaired means)" + only_point(steps, d, "+.3g"))
            all_steps += steps
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(pre + f"smoothed training loss minus {baseline} of the same seed (band: min..max)",
                     fontsize=9)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no baseline (bf16 or fp32 by default, --baseline NAME) among the inputs",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    step_axis(ax, all_steps)
    ax.set_ylabel("loss difference (nats/token)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "loss_vs_baseline.png"), dpi=110)
    plt.close(fig)

    # 3. held-out NLL
    # FP32 inference: solid line, filled circles; quantized: dashed line, open squares drawn
    # a size larger, so that a square rings its circle where the two values coincide.
    fig, ax = plt.subplots(figsize=(8, 5))
    all_steps = []
    for r in order:
        for key, style, marker, fill, grow, what in (
                ("val_nll", "-", "o", None, 0, "FP32 inference"),
                ("val_nll_quant", "--", "s", "none", 2, "quantized inference")):
            series = [{x["step"]: x[key] for x in recs if finite(x.get(key))} for recs in groups[r]]
            if not all(series) or (key == "val_nll_quant" and r == "fp32"):
                continue
            steps, mean, lo, hi = seed_stats(series)
            if steps:
                all_steps += steps
                ax.plot(steps, mean, style, color=colors[r], marker=marker,
                        markersize=marker_size(len(steps)) + grow, markerfacecolor=fill,
                        markeredgewidth=1.2, label=f"{r}, {what}" + only_point(steps, mean, ".4f"))
    ax.set_xlabel("step")
    step_axis(ax, all_steps)
    ax.set_ylabel("held-out NLL (nats/token)")
    ax.set_title(pre + "held-out NLL (mean over seeds)\nsolid line, filled circles: FP32 "
                 "inference; dashed line, open squares: quantized inference", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "heldout.png"), dpi=110)
    plt.close(fig)

    # 4. telemetry
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    any_tel = False
    for ax, key, what in ((axes[0], "saturated_blocks", "blocks with saturated scale"),
                          (axes[1], "zero_guard_blocks", "blocks hitting the zero guard")):
        all_steps, top = [], 0.0
        for r in order:
            series = []
            for recs in groups[r]:
                s = {x["step"]: worst_telemetry(x, key) for x in recs}
                series.append({t: v for t, v in s.items() if v is not None})
            if not all(series):
                continue
            steps, mean, lo, hi = seed_stats(series)
            if steps:
                any_tel = True
                all_steps += steps
                pct = [100 * v for v in mean]
                top = max(top, max(pct))
                ax.plot(steps, pct, color=colors[r], marker="o", markersize=marker_size(len(steps)),
                        label=r + only_point(steps, pct, ".3g", "%"))
        ax.set_xlabel("step")
        step_axis(ax, all_steps)
        if all_steps and top == 0:  # every series at 0%: no negative percentages below it
            ax.set_ylim(-0.05, 1)
        ax.set_ylabel(f"% of {what}")
        ax.set_title(pre + f"worst operand: {what}", fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if not any_tel:
        axes[0].text(0.5, 0.5, "no FP4 telemetry in these runs", ha="center", va="center",
                     transform=axes[0].transAxes)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "telemetry.png"), dpi=110)
    plt.close(fig)
    made = ["loss.png", "loss_vs_baseline.png", "heldout.png", "telemetry.png"]
    # 5., 6. only when there is data for them; an old file of a previous call is removed.
    wanted = [r for r in a.scale_recipes.split(",") if r]
    if plot_scale_range(plt, a.out, groups, order, colors, pre, wanted):
        made.append("scale_range.png")
    elif os.path.exists(os.path.join(a.out, "scale_range.png")):
        os.remove(os.path.join(a.out, "scale_range.png"))
    if a.hypotheses:
        plot_hypotheses(plt, a.out, a.hypotheses, pre)
        made.append("hypotheses.png")
    elif os.path.exists(os.path.join(a.out, "hypotheses.png")):
        os.remove(os.path.join(a.out, "hypotheses.png"))
    print(f"plot_runs.py: wrote {', '.join(made)} to {a.out}"
          + (f" (baseline {baseline})" if baseline else " (no baseline)"))


if __name__ == "__main__":
    main()
