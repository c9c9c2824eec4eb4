#!/usr/bin/env python3
"""Appendix C of the UE5M3 paper (Hu, Luschi, Balanca, arXiv 2609.02846), rerun with fp4train's
accumulator (docs/results.md "The accumulator's statistics (Appendix C)").

The statistics of the native FP4 GEMM's output model -- chunks of 64 products, each chunk's exact
sum rounded once to FP32, RNE or RTZ additions of the chunk sums, an optional snap to the 1/1024
grid -- on a fixed protocol with its own random stream. Nothing here is tuned toward the paper's
figures. The arithmetic is fp4train's own (fp4/gemm/accumulator.h, through the Python package):
fp4train.chunk_partials (step 3 of docs/gemm.md "Probe-matched rules (exact)") and
fp4train.accumulate_partials (steps 4-5), the code
fp4::probe_gemm runs.

Usage:
    PYTHONPATH=build/python python3 tools/appendix_c.py [--out docs/results/paper]
        [--rows 4096] [--k 4096] [--seed 20260902] [--boot 1000]

Writes OUT/accumulator.json and OUT/accumulator.md (markdown tables with 95% intervals), and
prints the tables. Exits 1 if the grid sweep disagrees with its closed form (a check of this
script), 2 on bad arguments or when fp4train cannot be imported.

The protocol (each figure with a 95% percentile-bootstrap interval over the rows, --boot
resamples, fixed seed):
  * dots: --rows independent dot products of length --k; x from each distribution, z an
    independent draw of the same one, w = rho*x + sqrt(1 - rho^2)*z for rho in {0, 0.25}.
    Distributions: unit Gaussian; Gaussian sigma 32; Laplace (Exp(1) - Exp(1))/sqrt(2);
    Student-t(3)/sqrt(3); contaminated Gaussian (1% of values x25, over sqrt(0.99 + 0.01*625)).
    Modes: bf16 (both operands RNE to BF16) and nvfp4 (blocks of 16 along K, block scale
    s = E4M3_RNE(block amax / 6), 1 for an all-zero block, no tensor scale; elements
    E2M1_RNE(x / s) * s, exact in BF16). Products are exact in FP32. Variants: rne, rne_grid,
    rtz, rtz_grid (grid = the 1/1024 snap). Metrics in FP64 against the FP64 sum of the same
    products: magnitude bias (mean|est| - mean|ref|) / mean|ref| (ppm), gain error
    sum(est*ref) / sum(ref^2) - 1 (ppm), cosine, relative L2, RMSE. Plus, for nvfp4, the
    relative RMS error of the input quantization alone: the FP64 sum of the quantized products
    against the FP64 sum of the unquantized operands' products.
  * regression: 2048 examples x 2048 features (gaussian, laplace, student_t3); y = X beta with
    beta ~ N(0, 1/2048); the model's beta_m = beta + 0.25*N(0, 1/2048); the MSE gradient
    X^T (X beta_m - y) with BF16 operands (X and the FP64 residual, each RNE to BF16), each
    component a chunked dot over the examples. Gain error and cosine of each variant against the
    FP64 sum of the same products.
  * cancellation: --rows rows of 32 Gaussian values times scale (1 or 32) and their negatives,
    64 FP32 partials shuffled per row; a residual N(0, sigma^2), sigma in {0, 1/4096, 1/1024,
    1/64}, is added (in FP32) to the last partial. Reference: the exact (math.fsum) sum of the 64
    partials. RMS residue of each variant; for every variant also the fraction of rows mapped to
    exactly zero and the gain (none where the reference is 0).
  * grid sweep: d in {none, 256, 512, 1024, 2048, 4096} on the cancellation partials of scale 1,
    sigma 1/4096, RTZ and RNE additions: zero fraction, gain, RMSE, beside their closed forms for
    a snap of a N(0, sigma^2) residual (the accumulation error neglected; it is the RMSE of
    d = none, about 5e-6 with RTZ and 7e-7 with RNE):
      zero fraction  erf(h / (2 sigma sqrt 2)),  h = 1/d;
      gain           sum_k k h (phi(a_k) - phi(b_k)) sigma^2 / sigma^2, cells [a_k, b_k) = [(k-1/2)h, (k+1/2)h);
      MSE            sum_k int_{a_k}^{b_k} (k h - e)^2 phi(e) de, phi the N(0, sigma^2) density.
    The script checks each measured value against its closed form (within 4 sampling SDs: the
    bootstrap's, or the model's on as many rows by simulation, whichever is larger) and fails
    otherwise.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

try:
    import numpy as np
except ImportError:
    print("appendix_c.py: error: needs numpy (Debian: apt install python3-numpy)", file=sys.stderr)
    sys.exit(2)
try:
    import fp4train as fp
except ImportError as e:
    print(f"appendix_c.py: error: cannot import fp4train ({e}); build it (bash scripts/build) and "
          "set PYTHONPATH=build/python", file=sys.stderr)
    sys.exit(2)

DISTRIBUTIONS = ("gaussian", "gaussian_sigma32", "laplace", "student_t3", "contaminated_gaussian")
VARIANTS = (("rne", "rne", 0), ("rne_grid", "rne", 1024), ("rtz", "rtz", 0), ("rtz_grid", "rtz", 1024))
RHOS = (0.0, 0.25)
CHUNK = 64


def draw(rng, dist, shape):
    """float64 samples of a named distribution (unit variance except gaussian_sigma32)."""
    if dist == "gaussian":
        return rng.standard_normal(shape)
    if dist == "gaussian_sigma32":
        return 32.0 * rng.standard_normal(shape)
    if dist == "laplace":
        return (rng.exponential(1.0, shape) - rng.exponential(1.0, shape)) / math.sqrt(2.0)
    if dist == "student_t3":
        return rng.standard_t(3.0, shape) / math.sqrt(3.0)
    if dist == "contaminated_gaussian":
        v = rng.standard_normal(shape)
        v[rng.random(shape) < 0.01] *= 25.0
        return v / math.sqrt(0.99 + 0.01 * 625.0)
    raise ValueError(dist)


def bf16(x):
    """RNE to BF16, as float32 values (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return r.view(np.float32)


def nvfp4_like(x):
    """Blocks of 16 along the last axis: s = E4M3_RNE(amax / 6) (1 for a zero block), elements
    E2M1_RNE(x / s) * s (saturating at 6), as float32 (exact: 2 x 4 significant bits)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, k = x.shape
    assert k % 16 == 0
    b = x.reshape(rows, k // 16, 16)
    amax = np.abs(b).max(axis=2)
    s = fp.round_to(np.ascontiguousarray((amax / np.float32(6.0)).astype(np.float32)), "e4m3")
    s = np.where(s == 0, np.float32(1.0), s).astype(np.float32)
    q = fp.round_to(np.ascontiguousarray((b / s[:, :, None]).astype(np.float32)), "e2m1")
    return (q * s[:, :, None]).astype(np.float32).reshape(rows, k)


def exact_dots(a, b):
    """FP64 sums of the FP32 products (exact products; float64 summation)."""
    return np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))


def metric_values(est, ref):
    """The five dot metrics of est against ref (float64 arrays), as floats."""
    e, r = est.astype(np.float64), ref.astype(np.float64)
    mr = np.mean(np.abs(r))
    rr = np.dot(r, r)
    return {
        "magnitude_bias_ppm": (np.mean(np.abs(e)) - mr) / mr * 1e6,
        "gain_error_ppm": (np.dot(e, r) / rr - 1.0) * 1e6,
        "cosine": np.dot(e, r) / math.sqrt(np.dot(e, e) * rr),
        "relative_l2": math.sqrt(np.dot(e - r, e - r) / rr),
        "rmse": math.sqrt(np.mean((e - r) ** 2)),
    }


class Boot:
    """Percentile bootstrap over rows with fixed resample indices (the same for every figure)."""

    def __init__(self, n, resamples, seed):
        self.idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))

    def interval(self, fn, *arrays):
        vals = []
        for ix in self.idx:
            v = fn(*(a[ix] for a in arrays))
            vals.append(np.nan if v is None else v)
        v = np.asarray(vals, dtype=np.float64)
        if np.all(np.isnan(v)):
            return None, None, None
        lo, hi = np.nanpercentile(v, [2.5, 97.5])
        return float(lo), float(hi), float(np.nanstd(v, ddof=1))


def with_ci(boot, name, fn, *arrays):
    """{name: value, name_ci: [lo, hi]} of a scalar statistic fn(*arrays)."""
    v = fn(*arrays)
    lo, hi, _ = boot.interval(fn, *arrays)
    return {name: None if v is None else float(v), name + "_ci": None if lo is None else [lo, hi]}


def dots_study(args, boot, log):
    rows_out, inq_out = [], []
    for di, dist in enumerate(DISTRIBUTIONS):
        rng = np.random.default_rng([args.seed, 1, di])
        x64 = draw(rng, dist, (args.rows, args.k))
        z64 = draw(rng, dist, (args.rows, args.k))
        for rho in RHOS:
            w64 = rho * x64 + math.sqrt(1.0 - rho * rho) * z64
            x32, w32 = x64.astype(np.float32), w64.astype(np.float32)
            for mode in ("bf16", "nvfp4"):
                if mode == "bf16":
                    xa, wa = bf16(x32), bf16(w32)
                else:
                    xa, wa = nvfp4_like(x32), nvfp4_like(w32)
                    ref_unq = exact_dots(x32, w32)
                    ref_q = exact_dots(xa, wa)

                    def rel_rms(q, u):
                        return math.sqrt(np.mean((q - u) ** 2) / np.mean(u ** 2))
                    inq_out.append({"distribution": dist, "rho": rho,
                                    **with_ci(boot, "relative_rms", rel_rms, ref_q, ref_unq)})
                ref = exact_dots(xa, wa)
                partials = fp.chunk_partials(xa, wa, CHUNK)
                for vname, rnd, d in VARIANTS:
                    est = fp.accumulate_partials(partials, rnd, d).astype(np.float64)
                    row = {"distribution": dist, "rho": rho, "mode": mode, "variant": vname}
                    for m in ("magnitude_bias_ppm", "gain_error_ppm", "cosine", "relative_l2", "rmse"):
                        row.update(with_ci(boot, m, lambda e, r, m=m: metric_values(e, r)[m], est, ref))
                    rows_out.append(row)
            log(f"dots: {dist}, rho {rho}")
    return rows_out, inq_out


def regression_study(args, log):
    n = p = 2048
    out = []
    boot = Boot(p, args.boot, args.seed + 7)
    for di, dist in enumerate(("gaussian", "laplace", "student_t3")):
        rng = np.random.default_rng([args.seed, 2, di])
        X = draw(rng, dist, (n, p))
        beta = rng.standard_normal(p) / math.sqrt(p)
        beta_m = beta + 0.25 * rng.standard_normal(p) / math.sqrt(p)
        resid = X @ (beta_m - beta)  # X beta_m - y, in FP64
        Xt = bf16(np.ascontiguousarray(X.T.astype(np.float32)))  # [features, examples]
        R = np.ascontiguousarray(np.broadcast_to(bf16(resid.astype(np.float32)), (p, n)))
        ref = exact_dots(Xt, R)
        partials = fp.chunk_partials(Xt, R, CHUNK)
        for vname, rnd, d in VARIANTS:
            est = fp.accumulate_partials(partials, rnd, d).astype(np.float64)
            row = {"distribution": dist, "variant": vname}
            row.update(with_ci(boot, "gain_error_ppm", lambda e, r: metric_values(e, r)["gain_error_ppm"], est, ref))
            row.update(with_ci(boot, "cosine", lambda e, r: metric_values(e, r)["cosine"], est, ref))
            out.append(row)
        log(f"regression: {dist}")
    return out


def cancellation_partials(args, scale, sigma, salt):
    """[rows, 64] FP32 partials (32 values, their negatives, shuffled, residual on the last) and
    their exact sums."""
    rng = np.random.default_rng([args.seed, 3, salt])
    v = (scale * rng.standard_normal((args.rows, 32))).astype(np.float32)
    p = np.concatenate([v, -v], axis=1)
    perm = np.argsort(rng.random((args.rows, 64)), axis=1)
    p = np.take_along_axis(p, perm, axis=1)
    eps = sigma * rng.standard_normal(args.rows)
    p[:, -1] = (p[:, -1].astype(np.float64) + eps).astype(np.float32)
    p = np.ascontiguousarray(p)
    ref = np.array([math.fsum(r) for r in p.astype(np.float64)])
    return p, ref


def zero_fraction(e, r):
    return float(np.mean(e == 0.0))


def gain(e, r):
    rr = np.dot(r, r)
    return None if rr == 0.0 else float(np.dot(e, r) / rr)


def rms(e, r):
    return float(math.sqrt(np.mean((e - r) ** 2)))


def cancellation_study(args, boot, log):
    out = []
    for si, scale in enumerate((1.0, 32.0)):
        for ti, sigma in enumerate((0.0, 1 / 4096, 1 / 1024, 1 / 64)):
            p, ref = cancellation_partials(args, scale, sigma, 10 * si + ti)
            for vname, rnd, d in VARIANTS:
                est = fp.accumulate_partials(p, rnd, d).astype(np.float64)
                row = {"distribution": "gaussian", "scale": scale, "sigma": sigma, "variant": vname}
                row.update(with_ci(boot, "rms", rms, est, ref))
                row.update(with_ci(boot, "zero_fraction", zero_fraction, est, ref))
                row.update(with_ci(boot, "gain", gain, est, ref))
                out.append(row)
    log("cancellation")
    return out


def closed_form(d, sigma):
    """Zero fraction, gain and RMSE of e -> RNE(d e)/d for e ~ N(0, sigma^2) (d = 0: identity)."""
    if d == 0:
        return 0.0, 1.0, 0.0
    h = 1.0 / d
    sq2 = math.sqrt(2.0)

    def Phi(t):
        return 0.5 * (1.0 + math.erf(t / (sigma * sq2)))

    def phi(t):
        return math.exp(-0.5 * (t / sigma) ** 2) / (sigma * math.sqrt(2.0 * math.pi))

    kmax = int(math.ceil(12.0 * sigma / h)) + 1
    eqe, mse = 0.0, 0.0
    for k in range(-kmax, kmax + 1):
        a, b = (k - 0.5) * h, (k + 0.5) * h
        P = Phi(b) - Phi(a)
        M1 = sigma * sigma * (phi(a) - phi(b))  # int_a^b e phi
        M2 = sigma * sigma * (P + a * phi(a) - b * phi(b))  # int_a^b e^2 phi
        eqe += k * h * M1
        mse += (k * h) ** 2 * P - 2.0 * k * h * M1 + M2
    return math.erf(h / (2.0 * sigma * sq2)), eqe / (sigma * sigma), math.sqrt(max(mse, 0.0))


def model_sd(d, sigma, n, seed, reps=200):
    """The sampling SD, over `reps` samples of n residuals e ~ N(0, sigma^2), of each statistic
    of the exact snap RNE(d e)/d against e (numpy's rint rounds ties to even): how far a
    measurement on n rows may fall from the closed form by chance alone."""
    rng = np.random.default_rng(seed)
    vals = {"zero_fraction": [], "gain": [], "rmse": []}
    for _ in range(reps):
        e = sigma * rng.standard_normal(n)
        q = np.rint(e * d) / d if d else e
        vals["zero_fraction"].append(zero_fraction(q, e))
        vals["gain"].append(gain(q, e))
        vals["rmse"].append(rms(q, e))
    return {k: float(np.std(v, ddof=1)) for k, v in vals.items()}


def grid_sweep(args, boot, log):
    """The snap grid swept on the cancellation study's partials of scale 1 and sigma 1/4096, with
    RTZ (the paper's probe) and RNE additions, each value beside its closed form. The check: each
    measured value within 4 sampling SDs (of the bootstrap, or of the model on as many rows,
    whichever is larger) of its closed form. Without a snap (d = 0) the closed form is the
    identity (zero fraction 0, gain 1, RMSE 0), and the measured RMSE is the accumulation error
    alone, which the closed form neglects: that RMSE is reported, not checked."""
    sigma = 1 / 4096
    p, ref = cancellation_partials(args, 1.0, sigma, 1)
    out, ok = [], True
    for acc in ("rtz", "rne"):
        for d in (0, 256, 512, 1024, 2048, 4096):
            est = fp.accumulate_partials(p, acc, d).astype(np.float64)
            zf, g, r = closed_form(d, sigma)
            sd = model_sd(d, sigma, args.rows, args.seed + d)
            row = {"d": d, "accumulate": acc}
            checks = {}
            n = args.rows
            for name, fn, want in (("zero_fraction", zero_fraction, zf), ("gain", gain, g), ("rmse", rms, r)):
                v = fn(est, ref)
                lo, hi, se = boot.interval(fn, est, ref)
                row[name] = v
                row[name + "_ci"] = [lo, hi]
                row[name + "_closed_form"] = want
                if name == "rmse" and d == 0:
                    continue
                if name == "gain" and n * (1.0 - zf) < 10:
                    # Fewer than 10 rows expected off zero: the gain rests on a handful of rows (or
                    # none), and neither the bootstrap nor the simulation gives it a usable spread.
                    row["gain_checked"] = False
                    continue
                # The binomial SD of the zero fraction bounds its spread from below even where a
                # sample shows none (every row at zero), and 1/n is one row's worth.
                floor = math.sqrt(zf * (1.0 - zf) / n) + 1.0 / n if name == "zero_fraction" else 0.0
                checks[name] = abs(v - want) <= 4.0 * max(se or 0.0, sd[name], floor) + 1e-9
            row["agrees_with_closed_form"] = all(checks.values())
            ok &= row["agrees_with_closed_form"]
            out.append(row)
    log("grid sweep")
    return out, ok


def fmt(v, ci, digits=1, scale=1.0):
    if v is None:
        return "—"
    s = f"{v * scale:+.{digits}f}" if digits >= 0 else f"{v * scale:.3g}"
    if ci is None:
        return s
    return s + f" [{ci[0] * scale:+.{digits}f}, {ci[1] * scale:+.{digits}f}]" if digits >= 0 else \
        s + f" [{ci[0] * scale:.3g}, {ci[1] * scale:.3g}]"


def markdown(res):
    o = []
    meta = res["meta"]
    o.append("# Appendix C of arXiv 2609.02846, rerun by fp4train's accumulator\n")
    o.append(f"`{meta['command']}` — {meta['rows']} dots of length {meta['k']}, chunk {CHUNK}, seed "
             f"{meta['seed']}, {meta['boot']} bootstrap resamples over rows; {meta['cpu']}, "
             f"{meta['seconds']:.0f} s. 95% intervals in brackets. ref = the FP64 sum of the same "
             "products.\n")
    o.append("## Dot products: magnitude bias at ρ = 0 and gain error at ρ = 0.25 (ppm)\n")
    o.append("| distribution | mode | rne: bias | rne_grid: bias | rtz: bias | rtz_grid: bias | rne: gain err | rne_grid: gain err | rtz: gain err | rtz_grid: gain err |")
    o.append("|---|---|---|---|---|---|---|---|---|---|")
    idx = {(r["distribution"], r["rho"], r["mode"], r["variant"]): r for r in res["dots"]}
    for dist in DISTRIBUTIONS:
        for mode in ("bf16", "nvfp4"):
            cells = [fmt(idx[(dist, 0.0, mode, v)]["magnitude_bias_ppm"], idx[(dist, 0.0, mode, v)]["magnitude_bias_ppm_ci"], 3)
                     for v, _, _ in VARIANTS]
            cells += [fmt(idx[(dist, 0.25, mode, v)]["gain_error_ppm"], idx[(dist, 0.25, mode, v)]["gain_error_ppm_ci"], 3)
                      for v, _, _ in VARIANTS]
            o.append(f"| {dist} | {mode} | " + " | ".join(cells) + " |")
    o.append("\n## Dot products at ρ = 0.25: relative L2 error and RMSE\n")
    o.append("| distribution | mode | rne: rel. L2 | rne_grid | rtz | rtz_grid | rne: RMSE | rne_grid | rtz | rtz_grid |")
    o.append("|---|---|---|---|---|---|---|---|---|---|")
    for dist in DISTRIBUTIONS:
        for mode in ("bf16", "nvfp4"):
            cells = [f"{idx[(dist, 0.25, mode, v)]['relative_l2']:.3g}" for v, _, _ in VARIANTS]
            cells += [f"{idx[(dist, 0.25, mode, v)]['rmse']:.3g}" for v, _, _ in VARIANTS]
            o.append(f"| {dist} | {mode} | " + " | ".join(cells) + " |")
    o.append("\n## NVFP4-like input quantization alone: relative RMS error of the dot products\n")
    o.append("| distribution | ρ = 0 | ρ = 0.25 |")
    o.append("|---|---|---|")
    iq = {(r["distribution"], r["rho"]): r for r in res["input_quantization"]}
    for dist in DISTRIBUTIONS:
        o.append(f"| {dist} | " + " | ".join(fmt(iq[(dist, rho)]["relative_rms"], iq[(dist, rho)]["relative_rms_ci"], 4)
                                              for rho in RHOS) + " |")
    o.append("\n## Regression probe: the MSE gradient's gain error (ppm) and cosine, BF16 operands\n")
    o.append("| distribution | variant | gain error (ppm) | 1 − cosine |")
    o.append("|---|---|---|---|")
    for r in res["regression"]:
        o.append(f"| {r['distribution']} | {r['variant']} | {fmt(r['gain_error_ppm'], r['gain_error_ppm_ci'], 3)} | "
                 f"{1 - r['cosine']:.3g} |")
    o.append("\n## Cancellation probe: 32 values and their negatives, a residual σ on the last partial\n")
    o.append("| scale | σ | rne: RMS residue | rtz: RMS residue | rne_grid: zero fraction | rtz_grid: zero fraction | rne_grid: gain | rtz_grid: gain | rne_grid: RMSE | rtz_grid: RMSE |")
    o.append("|---|---|---|---|---|---|---|---|---|---|")
    cq = {(r["scale"], r["sigma"], r["variant"]): r for r in res["cancellation"]}
    for scale in (1.0, 32.0):
        for sigma in (0.0, 1 / 4096, 1 / 1024, 1 / 64):
            c = lambda v: cq[(scale, sigma, v)]  # noqa: E731
            o.append(f"| {scale:g} | {sigma:.3g} | {c('rne')['rms']:.3g} | {c('rtz')['rms']:.3g} | "
                     f"{fmt(c('rne_grid')['zero_fraction'], c('rne_grid')['zero_fraction_ci'], 3)} | "
                     f"{fmt(c('rtz_grid')['zero_fraction'], c('rtz_grid')['zero_fraction_ci'], 3)} | "
                     f"{fmt(c('rne_grid')['gain'], c('rne_grid')['gain_ci'], 3)} | "
                     f"{fmt(c('rtz_grid')['gain'], c('rtz_grid')['gain_ci'], 3)} | "
                     f"{c('rne_grid')['rms']:.3g} | {c('rtz_grid')['rms']:.3g} |")
    o.append("\n## Grid sweep: scale 1, σ = 1/4096, against the closed form for a snapped N(0, σ²) residual\n")
    o.append("| additions | d | zero fraction | closed form | gain | closed form | RMSE | closed form | agrees |")
    o.append("|---|---|---|---|---|---|---|---|---|")
    for r in res["grid_sweep"]:
        o.append(f"| {r['accumulate']} | {r['d'] or 'none'} | {fmt(r['zero_fraction'], r['zero_fraction_ci'], 4)} | {r['zero_fraction_closed_form']:.4f} | "
                 f"{fmt(r['gain'], r['gain_ci'], 4)} | {r['gain_closed_form']:.4f} | {r['rmse']:.3g} | "
                 f"{r['rmse_closed_form']:.3g} | {'yes' if r['agrees_with_closed_form'] else '**no**'} |")
    return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/results/paper", help="directory for accumulator.{json,md}")
    ap.add_argument("--rows", type=int, default=4096, help="dot products (and cancellation rows)")
    ap.add_argument("--k", type=int, default=4096, help="dot length (a multiple of 16)")
    ap.add_argument("--seed", type=int, default=20260902)
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap resamples")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if not 16 <= args.rows <= 65536:
        ap.error(f"--rows must be in [16, 65536], got {args.rows}")
    if not (16 <= args.k <= 65536 and args.k % 16 == 0):
        ap.error(f"--k must be a multiple of 16 in [16, 65536], got {args.k}")
    if not 100 <= args.boot <= 100000:
        ap.error(f"--boot must be in [100, 100000], got {args.boot}")
    if not 0 <= args.seed < 2 ** 63:
        ap.error(f"--seed must be in [0, 2^63), got {args.seed}")
    if args.rows * args.k > (1 << 26):
        ap.error(f"--rows x --k = {args.rows * args.k} exceeds 2^26 elements per operand (memory)")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        ap.error(f"--out {args.out}: {e.strerror}")
    t0 = time.time()

    def log(msg):
        if not args.quiet:
            print(f"appendix_c: {msg} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    boot = Boot(args.rows, args.boot, args.seed + 1)
    dots, inq = dots_study(args, boot, log)
    reg = regression_study(args, log)
    canc = cancellation_study(args, boot, log)
    sweep, ok = grid_sweep(args, boot, log)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    res = {
        "meta": {"command": "python3 tools/appendix_c.py " + " ".join(sys.argv[1:]), "rows": args.rows,
                 "k": args.k, "chunk": CHUNK, "seed": args.seed, "boot": args.boot, "cpu": cpu,
                 "seconds": time.time() - t0, "paper": "arXiv 2609.02846, Appendix C"},
        "dots": dots, "input_quantization": inq, "regression": reg, "cancellation": canc,
        "grid_sweep": sweep,
    }
    md = markdown(res)
    try:
        with open(os.path.join(args.out, "accumulator.json"), "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        with open(os.path.join(args.out, "accumulator.md"), "w", encoding="utf-8") as f:
            f.write(md)
    except OSError as e:
        print(f"appendix_c.py: error: cannot write to {args.out}: {e.strerror}", file=sys.stderr)
        sys.exit(2)
    if not args.quiet:
        print(md)
    if not ok:
        print("appendix_c.py: error: the grid sweep disagrees with its closed form (see the table)",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
