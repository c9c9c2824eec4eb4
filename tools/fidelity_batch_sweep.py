#!/usr/bin/env python3
"""How quantization noise compares with SGD noise as tokens per step grow (docs/fidelity.md
"Batch size").

Reads fidelity.json files of one reference run at several `--batch-size`s and, per recipe they
all hold, the whole-gradient `sgd_noise_fraction` (E||g_hat - g*||^2 / sigma_sgd^2) against tokens
per batch. Minibatch (SGD) noise falls as 1/B; the variance part of the quantization error falls
with it, its bias part does not. So the fraction grows about linearly in tokens when the error
is mostly bias. If the error splits into a part fixed across batch sizes (F) and a part that
averages like the minibatch noise (V/n, with SGD noise S/n), the fraction is (F*n + V)/S: exactly
linear in n. So: fraction(n) = a + b*n, fitted by least squares over the panels, with the
crossover n* = (1 - a)/b (tokens per batch where quantization error would equal SGD noise;
reported only when b > 0). The split of each panel's fraction into its bias and variance parts
uses the panel's mean bias2 and variance (fraction * bias2/mse, fraction * variance/mse).

Usage: tools/fidelity_batch_sweep.py A/fidelity.json B/fidelity.json ... [--json OUT.json]
Standard library only.
"""
import argparse
import json
import sys


def fit_line(xs, ys):
    """Least-squares a, b of y = a + b*x (needs two distinct xs)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("the panels need at least two different batch sizes")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("panels", nargs="+")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    panels = []
    for f in a.panels:
        try:
            p = json.load(open(f))
        except (OSError, ValueError) as e:
            sys.exit(f"fidelity_batch_sweep: {f}: {e}")
        if p.get("format") != "fp4train.fidelity.v1":
            sys.exit(f"fidelity_batch_sweep: {f} is not a fidelity.json")
        panels.append((f, p))
    runs = {p.get("run") for _, p in panels}
    if len(runs) > 1:
        print(f"note: the panels come from different runs: {sorted(runs)}", file=sys.stderr)
    panels.sort(key=lambda fp: fp[1]["tokens_per_batch"])
    tokens = [p["tokens_per_batch"] for _, p in panels]
    if len(set(tokens)) < 2:
        sys.exit("fidelity_batch_sweep: the panels need at least two different batch sizes")
    names = [r["name"] for r in panels[0][1]["recipes"]]
    common = [n for n in names if all(n in {r["name"] for r in p["recipes"]} for _, p in panels)]
    out = {"panels": [f for f, _ in panels], "tokens_per_batch": tokens, "recipes": {}}
    print("| recipe | tokens per batch | quant. / SGD noise [95%] | bias part | variance part |")
    print("|---|---:|---|---:|---:|")
    fits = []
    for name in common:
        pts = []
        for _, p in panels:
            w = next(r for r in p["recipes"] if r["name"] == name)["whole"]
            f = w["sgd_noise_fraction"]
            mse = w["mse"]["mean"]
            share_b = w["bias2"]["mean"] / mse if mse > 0 else 0.0
            share_v = w["variance"]["mean"] / mse if mse > 0 else 0.0
            pts.append({"tokens": p["tokens_per_batch"], "fraction": f, "bias_part": f["mean"] * share_b,
                        "variance_part": f["mean"] * share_v})
            print(f"| {name} | {p['tokens_per_batch']} | {f['mean']:.4f} [{f['lo']:.4f}, {f['hi']:.4f}] | "
                  f"{f['mean'] * share_b:.4f} | {f['mean'] * share_v:.4f} |")
        if all(pt["fraction"]["mean"] == 0 for pt in pts):
            continue
        a0, b0 = fit_line([pt["tokens"] for pt in pts], [pt["fraction"]["mean"] for pt in pts])
        cross = (1 - a0) / b0 if b0 > 0 else None
        fits.append((name, a0, b0, cross))
        out["recipes"][name] = {"points": pts, "fit": {"a": a0, "b_per_token": b0, "crossover_tokens": cross}}
    print()
    print("| recipe | fit: fraction = a + b * tokens | crossover (tokens per batch) |")
    print("|---|---|---:|")
    for name, a0, b0, cross in fits:
        c = f"{cross:,.0f}" if cross is not None else "none (b <= 0)"
        print(f"| {name} | a = {a0:+.4f}, b = {b0:.3e} | {c} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
