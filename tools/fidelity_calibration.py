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

--paper: calibration against the paper's 8B figures (Hu, Luschi, Balanca, arXiv 2609.02846,
Table 10 final-window training loss, Table 11 held-out NLL; docs/fidelity.md "Calibration
against the paper"):
  tools/fidelity_calibration.py --paper FILE [FILE ...] [--map ROW=RECIPE,...] [--json OUT.json]
      [--md OUT.md]
FILE: a fidelity panel (fidelity.json, fp4train.fidelity.v1) or a rollout set (rollout.json,
fp4train.rollout.v1). Paper rows and their default recipes: bf16=bf16, ue5m3-te=ue5m3-te,
b16=ue5m3-b16-paper-last1, b32=ue5m3-b32-paper-last1, nvfp4-te=nvfp4-te, nvfp4-all=nvfp4-all;
--map overrides them (b16=ue5m3-b16) or drops a row (b32=). Every mapped recipe must be in every
FILE (else exit 2 naming the file, row and recipe), and at least 3 rows must be mapped; the
file's other recipes are listed with their figures, not ranked. Metrics: a panel's whole and
linears (dW) scopes, every metric's `mean` (panel.whole.bias2, panel.linears.rel_error, ...; and
the roles' dW.local scope when the panel ran with --linear-roles); a rollout set's mean over
(checkpoint, order) of each recipe's paired gap to the fp32 rollout, pairs where either diverged
left out (and counted): rollout.nll (held-out NLL, quantized inference: the pre-registered
metric, against Table 11, printed first), rollout.nll_fp32 (unquantized), rollout.loss_last (at
step N), rollout.loss_mean (steps 1..N), rollout.divergence (the recipe's own), and the means of
stability counts (spikes, gnorm_excursions, nonfinite; as rollout.md counts them) where the traces
hold gradient norms, over all of a recipe's traces, diverged ones included. Lower is better, except cosine and
grad_to_qnoise (ranked on their negation) and gain (ranked on |gain - 1|). Per metric and table:
Spearman's rho (average ranks), Kendall's tau-b, exact one-sided permutation p-values for
agreement (the fraction of all n! orderings of the metric's ranks with a statistic >= the
observed one), over all mapped recipes and over the FP4 ones (all but BF16's row). Markdown to
stdout (or --md); --json adds the per-recipe values and the paper's figures with their sources.
Exit status 2 with a message for an input that does not load or has another format, a mapped
recipe missing, fewer than 3 mapped rows, or a bad --map.
Standard library only.
"""
import argparse
import bisect
import glob
import itertools
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rollout_stats import stability_counts, thresholds  # noqa: E402  (one home: rollout.md's counts)


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


# ---------------------------------------------------------------------------------------------
# --paper: calibration against the paper's 8B figures (docs/fidelity.md "Calibration against
# the paper").

PAPER = "Hu, Luschi, Balanca, UE5M3 FP4 Block Scaling for Stable Language Model Pretraining, arXiv 2609.02846"
PAPER_TABLES = {
    10: {"what": "final-window training loss (8B, 188.7B tokens)", "source": "arXiv 2609.02846 Table 10"},
    11: {"what": "held-out NLL (8B, 188.7B tokens)", "source": "arXiv 2609.02846 Table 11"},
}
# (row key for --map, the paper's row, Table 10, Table 11, default recipe): docs/numerics.md
# "Published figures", docs/fidelity.md "Calibration against the paper".
PAPER_ROWS = [
    ("bf16", "BF16", 2.2651, 2.2783, "bf16"),
    ("ue5m3-te", "UE5M3 with TE settings", 2.2902, 2.3038, "ue5m3-te"),
    ("b16", "UE5M3 b16", 2.3090, 2.3223, "ue5m3-b16-paper-last1"),
    ("b32", "UE5M3 b32", 2.3241, 2.3372, "ue5m3-b32-paper-last1"),
    ("nvfp4-te", "TE NVFP4", 2.3474, 2.3259, "nvfp4-te"),
    ("nvfp4-all", "NVFP4 without RHT, all FP4", 2.4420, 2.4547, "nvfp4-all"),
]
BF16_ROW = "bf16"
PRE_REGISTERED = ("rollout.nll", 11)
ROLLOUT_METRICS = ["rollout.nll", "rollout.nll_fp32", "rollout.loss_last", "rollout.loss_mean", "rollout.divergence"]
HIGHER_IS_BETTER = {"cosine", "grad_to_qnoise"}  # ranked on the negated value
BEST_AT_ONE = {"gain"}  # ranked on |gain - 1|


class InputError(Exception):
    pass


def die(msg):
    print(f"fidelity_calibration: {msg}", file=sys.stderr)
    sys.exit(2)


def direction(metric):
    """How a metric is ranked, lowest = best: the key function and its description."""
    base = metric.rsplit(".", 1)[-1]
    if base in HIGHER_IS_BETTER:
        return (lambda v: -v), "higher is better: ranked on its negation"
    if base in BEST_AT_ONE:
        return (lambda v: abs(v - 1.0)), "best at 1: ranked on |value - 1|"
    return (lambda v: v), "lower is better"


def kendall_tau_b(x, y):
    """Kendall's tau-b; None if either side is all tied."""
    n = len(x)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                tx += 1
                ty += 1
            elif dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    n0 = n * (n - 1) // 2
    if n0 == tx or n0 == ty:
        return None
    return (conc - disc) / math.sqrt((n0 - tx) * (n0 - ty))


def _sign(v):
    return (v > 0) - (v < 0)


def _stats_int(rx2, ry2):
    """The integer statistics the permutation tests compare: sum of doubled-rank products (Spearman's
    rho is increasing in it, all else being invariant under permutation) and nc - nd (tau-b's
    numerator; its denominator is invariant too)."""
    n = len(rx2)
    s = sum(a * b for a, b in zip(rx2, ry2))
    t = sum(_sign(rx2[i] - rx2[j]) * _sign(ry2[i] - ry2[j]) for i in range(n) for j in range(i + 1, n))
    return s, t


_NULL = {}


def _null(rx2, ry2):
    """Sorted statistics over all n! assignments of x's ranks to y's (cached by the rank multisets)."""
    key = (tuple(sorted(rx2)), tuple(sorted(ry2)))
    if key not in _NULL:
        ys = list(key[1])
        ss, ts = [], []
        for perm in itertools.permutations(key[0]):
            s, t = _stats_int(perm, ys)
            ss.append(s)
            ts.append(t)
        ss.sort()
        ts.sort()
        _NULL[key] = (ss, ts)
    return _NULL[key]


def agreement(x, y):
    """Spearman's rho, Kendall's tau-b and their exact one-sided permutation p-values for agreement
    (the fraction of the n! orderings of x's ranks against y's whose statistic is >= the observed
    one), x and y both "lower is better". None where a side is all tied."""
    n = len(x)
    if n > 9:
        raise ValueError("exact permutation test limited to n <= 9")
    out = {"n": n, "rho": spearman(x, y), "tau": kendall_tau_b(x, y), "p_rho": None, "p_tau": None,
           "permutations": math.factorial(n)}
    if out["rho"] is None:
        return out
    rx2 = [int(round(2 * r)) for r in ranks(x)]
    ry2 = [int(round(2 * r)) for r in ranks(y)]
    s, t = _stats_int(rx2, ry2)
    ss, ts = _null(rx2, ry2)
    out["p_rho_count"] = len(ss) - bisect.bisect_left(ss, s)
    out["p_tau_count"] = len(ts) - bisect.bisect_left(ts, t)
    out["p_rho"] = out["p_rho_count"] / len(ss)
    out["p_tau"] = out["p_tau_count"] / len(ts)
    return out


def parse_map(text):
    mapping = {key: recipe for key, _, _, _, recipe in PAPER_ROWS}
    if not text:
        return mapping
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            die(f"--map entry {item!r} is not ROW=RECIPE (ROW=nothing drops the row)")
        key, recipe = (s.strip() for s in item.split("=", 1))
        if key not in mapping:
            die(f"--map: unknown paper row {key!r} (rows: {', '.join(mapping)})")
        mapping[key] = recipe or None
    used = {}
    for key, recipe in mapping.items():
        if recipe is None:
            continue
        if recipe in used:
            die(f"--map: recipe {recipe!r} stands for two paper rows, {used[recipe]!r} and {key!r}")
        used[recipe] = key
    return mapping


def load(path):
    try:
        with open(path) as f:
            j = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: {e}")
    fmt = j.get("format") if isinstance(j, dict) else None
    if fmt == "fp4train.fidelity.v1":
        return "panel", j
    if fmt == "fp4train.rollout.v1":
        return "rollout", j
    raise InputError(f"{path} is neither a fidelity panel (fp4train.fidelity.v1) nor a rollout set "
                     f"(fp4train.rollout.v1): format {fmt!r}")


def _number(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def panel_metrics(path, panel):
    """{recipe: {metric: value}}: the `mean` of every numeric metric of the whole and linears (dW)
    scopes, and of the roles' dW.local scope when the panel ran with --linear-roles (dW.e2e is the
    linears scope again)."""
    out, notes = {}, {}
    recipes = panel.get("recipes")
    if not isinstance(recipes, list):
        raise InputError(f"{path}: no recipes list")
    for r in recipes:
        name = r.get("name") if isinstance(r, dict) else None
        if not isinstance(name, str):
            raise InputError(f"{path}: a recipe without a name")
        scopes = [("panel.whole", r.get("whole")), ("panel.linears", r.get("linears"))]
        roles = r.get("roles")
        if isinstance(roles, dict):
            scopes.append(("panel.dW.local", roles.get("dW.local")))
        vals = {}
        for prefix, scope in scopes:
            if not isinstance(scope, dict):
                continue
            for m in sorted(scope):
                v = scope[m].get("mean") if isinstance(scope[m], dict) else None
                if isinstance(v, (int, float)) and not isinstance(v, bool) or v is None:
                    vals[f"{prefix}.{m}"] = _number(v)
        out[name] = vals
        notes[name] = {}
    return out, notes


def rollout_metrics(path, ro):
    """{recipe: {metric: value}} from the traces: the mean over (checkpoint, order) of the paired gap
    to the fp32 rollout (traces[0]), pairs where either rollout diverged left out, and the recipe's
    own divergence; per-trace counts (spikes, ...) over all of the recipe's traces that carry them."""
    names, traces = ro.get("recipes"), ro.get("traces")
    if not isinstance(names, list) or not isinstance(traces, list) or len(names) != len(traces) or len(names) < 2:
        raise InputError(f"{path}: recipes and traces do not match (need the fp32 reference and a recipe)")
    C = len(traces[0]) if isinstance(traces[0], list) else 0
    O = len(traces[0][0]) if C and isinstance(traces[0][0], list) else 0
    if C == 0 or O == 0:
        raise InputError(f"{path}: no traces")
    for i, t in enumerate(traces):
        if not isinstance(t, list) or len(t) != C or any(
                not isinstance(row, list) or len(row) != O or not all(isinstance(x, dict) for x in row) for row in t):
            raise InputError(f"{path}: the traces of {names[i]!r} are not {C} checkpoints x {O} orders")
    spike, limit = thresholds(ro)
    out, notes = {}, {}
    for i in range(1, len(names)):
        gaps = {m: [] for m in ROLLOUT_METRICS}
        counts = {}
        diverged = ref_diverged = 0
        for c in range(C):
            for o in range(O):
                t, ref = traces[i][c][o], traces[0][c][o]
                if isinstance(t.get("grad_norm"), list):  # the stability counts (rollout.md "Stability")
                    for k, v in stability_counts(t, ref, spike, limit).items():
                        counts.setdefault(f"rollout.{k}", []).append(v)
                if t.get("diverged"):
                    diverged += 1
                    continue
                if ref.get("diverged"):
                    ref_diverged += 1
                    continue
                lt, lr = t.get("loss"), ref.get("loss")
                vals = [_number(v) for v in (t.get("nll"), ref.get("nll"), t.get("nll_fp32"), ref.get("nll_fp32"),
                                             t.get("divergence"))]
                if (not isinstance(lt, list) or not isinstance(lr, list) or not lt or len(lt) != len(lr)
                        or None in vals or any(_number(v) is None for v in lt + lr)):
                    raise InputError(f"{path}: trace of {names[i]!r} at checkpoint {c}, order {o} (or its fp32 "
                                     f"reference) is not diverged but lacks finite losses, nll, nll_fp32 or divergence")
                n = len(lt)
                gaps["rollout.nll"].append(vals[0] - vals[1])
                gaps["rollout.nll_fp32"].append(vals[2] - vals[3])
                gaps["rollout.loss_last"].append(lt[-1] - lr[-1])
                gaps["rollout.loss_mean"].append(sum(a - b for a, b in zip(lt, lr)) / n)
                gaps["rollout.divergence"].append(vals[4])
        vals = {m: (sum(v) / len(v) if v else None) for m, v in gaps.items()}
        vals.update({m: sum(v) / len(v) for m, v in sorted(counts.items())})
        out[names[i]] = vals
        notes[names[i]] = {"pairs": len(gaps["rollout.nll"]), "diverged": diverged,
                           "reference_diverged": ref_diverged}
    return out, notes


def calibrate(path, kind, values, notes, mapping, label):
    """Rows of statistics for one input (every metric against Tables 10 and 11, all mapped recipes
    and the FP4 ones alone) and its per-recipe figures."""
    rows_by_key = {key: (row, t10, t11) for key, row, t10, t11, _ in PAPER_ROWS}
    mapped = [(key, recipe) for key, _, _, _, _ in PAPER_ROWS for recipe in [mapping[key]] if recipe]
    for key, recipe in mapped:
        if recipe not in values:
            raise InputError(f"{path}: paper row {key!r} ({rows_by_key[key][0]}) maps to recipe {recipe!r}, which "
                             f"this {kind} does not hold (it holds {', '.join(sorted(values))}); map the row to "
                             f"another recipe (--map {key}=RECIPE) or drop it (--map {key}=)")
    metrics = []
    for key, recipe in mapped:
        for m in values[recipe]:
            if m not in metrics:
                metrics.append(m)
    if kind == "rollout":
        metrics = [m for m in ROLLOUT_METRICS if m in metrics] + [m for m in metrics if m not in ROLLOUT_METRICS]
    rows = []
    for m in metrics:
        keyf, how = direction(m)
        missing = [recipe for _, recipe in mapped if values[recipe].get(m) is None]
        for table in (10, 11):
            row = {"input": label, "file": path, "metric": m, "direction": how, "table": table,
                   "source": PAPER_TABLES[table]["source"],
                   "pre_registered": kind == "rollout" and (m, table) == PRE_REGISTERED,
                   "recipes": [recipe for _, recipe in mapped]}
            if missing:
                row.update({"n": len(mapped), "rho": None, "tau": None, "p_rho": None, "p_tau": None,
                            "fp4": None, "note": "no value for " + ", ".join(missing)})
                rows.append(row)
                continue
            col = 1 if table == 10 else 2  # in rows_by_key's (row, Table 10, Table 11)
            row.update(agreement([keyf(values[r][m]) for _, r in mapped], [rows_by_key[k][col] for k, _ in mapped]))
            fp4 = [(k, r) for k, r in mapped if k != BF16_ROW]
            if len(fp4) >= 3:
                row["fp4"] = agreement([keyf(values[r][m]) for _, r in fp4], [rows_by_key[k][col] for k, _ in fp4])
                row["fp4"]["recipes"] = [r for _, r in fp4]
            else:
                row["fp4"] = None
            rows.append(row)
    recipe_row = {recipe: key for key, recipe in mapped}
    per_recipe = {name: {"row": recipe_row.get(name), "ranked": name in recipe_row, "values": values[name],
                         **notes.get(name, {})} for name in values}
    return rows, per_recipe


def fmt_num(v, spec="+.3f"):
    return "n/a" if v is None else format(v, spec)


def paper_markdown(out, multi):
    L = ["# Calibration against the paper", "",
         f"Metrics ranked against {PAPER} (Table 10: final-window training loss; Table 11: held-out NLL; "
         "docs/numerics.md \"Published figures\"). Spearman's rho (average ranks), Kendall's tau-b and exact "
         "one-sided permutation p-values for agreement (all n! orderings); FP4 only: the mapped recipes other "
         "than BF16's. Lower metric = better, except where noted (cosine, grad_to_qnoise: higher is better, "
         "ranked negated; gain: ranked on |gain - 1|). How to read it: docs/fidelity.md \"Calibration against "
         "the paper\".", ""]
    L.append("| paper row | Table 10 | Table 11 | recipe |")
    L.append("|---|---:|---:|---|")
    for key, row, t10, t11, _ in PAPER_ROWS:
        L.append(f"| {row} | {t10:.4f} | {t11:.4f} | {'`' + out['mapping'][key] + '`' if out['mapping'][key] else '(dropped)'} |")
    L.append("")
    head = "| " + ("input | " if multi else "") + "metric | table | n | rho | tau | p_rho | p_tau | rho FP4-only | tau FP4-only | p FP4-only (rho / tau) |"
    L.append(head)
    L.append("|" + ("---|" if multi else "") + "---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in out["rows"]:
        fp4 = r.get("fp4") or {}
        name = f"{r['metric']} (pre-registered)" if r["pre_registered"] else r["metric"]
        cells = [name, str(r["table"]), str(r["n"]), fmt_num(r["rho"]), fmt_num(r["tau"]),
                 fmt_num(r["p_rho"], ".4f"), fmt_num(r["p_tau"], ".4f"), fmt_num(fp4.get("rho")),
                 fmt_num(fp4.get("tau")), f"{fmt_num(fp4.get('p_rho'), '.4f')} / {fmt_num(fp4.get('p_tau'), '.4f')}"]
        if r.get("note"):
            cells[3] = f"n/a ({r['note']})"
        L.append("| " + (f"{r['input']} | " if multi else "") + " | ".join(cells) + " |")
    for inp in out["inputs"]:
        L += ["", f"## {inp['input']}: {inp['file']} ({inp['kind']})", ""]
        names = [n for n in inp["recipes"] if inp["recipes"][n]["ranked"]]
        names.sort(key=lambda n: [k for k, *_ in PAPER_ROWS].index(inp["recipes"][n]["row"]))
        names += [n for n in inp["recipes"] if not inp["recipes"][n]["ranked"]]
        if inp["kind"] == "rollout":
            L.append("Rollouts used per recipe (pairs with the fp32 rollout, neither diverged): " + ", ".join(
                f"`{n}` {inp['recipes'][n]['pairs']} ({inp['recipes'][n]['diverged']} diverged)" for n in names) + ".")
            if inp.get("stress") is not None:
                L.append(f"Stress: `{json.dumps(inp['stress'], sort_keys=True)}`.")
            L.append("")
        L.append("| metric | " + " | ".join(f"`{n}`" + ("" if inp["recipes"][n]["ranked"] else " (not ranked)")
                                         for n in names) + " |")
        L.append("|---|" + "---:|" * len(names))
        metrics = []
        for n in names:
            metrics += [m for m in inp["recipes"][n]["values"] if m not in metrics]
        for m in metrics:
            L.append(f"| {m} | " + " | ".join(fmt_num(inp["recipes"][n]["values"].get(m), ".5g") for n in names) + " |")
    return "\n".join(L) + "\n"


def paper_main(argv):
    ap = argparse.ArgumentParser(prog="fidelity_calibration.py",
                                 description="Rank panel and rollout metrics against the paper's 8B figures.")
    ap.add_argument("--paper", nargs="+", required=True, metavar="FILE",
                    help="fidelity.json (fp4train.fidelity.v1) or rollout.json (fp4train.rollout.v1) files")
    ap.add_argument("--map", action="append", default=[],
                    help="ROW=RECIPE,... overriding the default mapping (repeatable); ROW= drops a row. "
                    "Rows: " + ", ".join(k for k, *_ in PAPER_ROWS))
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args(argv)
    mapping = parse_map(",".join(a.map))
    if sum(1 for v in mapping.values() if v) < 3:
        die(f"only {sum(1 for v in mapping.values() if v)} paper rows are mapped to recipes (need 3 ranked recipes)")
    out = {"format": "fp4train.paper_calibration.v1",
           "paper": {"source": PAPER, "tables": {str(k): v for k, v in PAPER_TABLES.items()},
                     "rows": [{"row": k, "label": r, "table10": t10, "table11": t11,
                               "source": "arXiv 2609.02846 Table 10/11"} for k, r, t10, t11, _ in PAPER_ROWS]},
           "mapping": mapping,
           "pre_registered": {"metric": PRE_REGISTERED[0], "table": PRE_REGISTERED[1],
                              "source": PAPER_TABLES[PRE_REGISTERED[1]]["source"],
                              "where": "docs/fidelity.md \"Calibration against the paper\""},
           "statistics": "Spearman's rho (average ranks), Kendall's tau-b; p: exact one-sided permutation "
                         "p-value for agreement, the fraction of all n! orderings of the metric's ranks against "
                         "the paper's with a statistic >= the observed one",
           "inputs": [], "rows": []}
    pre, rest = [], []
    for i, path in enumerate(a.paper, 1):
        label = f"#{i}"
        try:
            kind, j = load(path)
            values, notes = (panel_metrics if kind == "panel" else rollout_metrics)(path, j)
            rows, per_recipe = calibrate(path, kind, values, notes, mapping, label)
        except InputError as e:
            die(str(e))
        inp = {"input": label, "file": path, "kind": kind, "recipes": per_recipe}
        if kind == "rollout":
            inp["stress"] = j.get("stress")
            inp["rollout"] = {k: j.get(k) for k in ("run", "steps", "length", "orders", "windows", "machine")}
        out["inputs"].append(inp)
        pre += [r for r in rows if r["pre_registered"]]
        rest += [r for r in rows if not r["pre_registered"]]
    out["rows"] = pre + rest
    md = paper_markdown(out, len(a.paper) > 1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if any(x == "--paper" or x.startswith("--paper=") for x in args):
        return paper_main(args)
    ap = argparse.ArgumentParser(
        description="Calibrate the fidelity panel against the loss study, or with --paper FILE ... "
                    "rank panel and rollout metrics against the paper's Tables 10 and 11 "
                    "(--paper --help for its options; docs/fidelity.md \"Calibration against the paper\").",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
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
