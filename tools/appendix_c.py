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
        [--rows 4096] [--k 4096] [--seed 20260902] [--boot 1000] [--reg-draws 8] [--iq-draws 1]

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
    sum(est*ref) / sum(ref^2) - 1 (ppm), cosine, relative L2, RMSE. Plus, for both modes, the
    relative L2 error of the input quantization alone, the paper's `quantization_only.relative_l2`:
    over the --rows dots of one (distribution, rho, mode), ||q - u|| / ||u|| with q the FP64 sums
    of the quantized operands' products and u those of the unquantized FP32 operands' products
    (one norm over all the dots, not a per-dot ratio averaged). It is the same number as the
    relative RMS error sqrt(mean (q - u)^2 / mean u^2) this script reported before.
  * regression (the paper's code: forward and gradient both through the variant under test):
    2048 examples x 2048 features (gaussian, student_t3, contaminated_gaussian), X drawn in
    FP64 and rounded to FP32; beta ~ N(0, 1/2048), beta_m = beta + 0.25*N(0, 1/2048), both FP32;
    the target y = X beta, FP64 sums of the unquantized FP32 operands. Modes bf16 and nvfp4
    quantize X (blocks of 16 along the features) and beta_m as the dots do. For each variant:
      forward   f_i = the variant's chunked dot of X_q[i, :] and beta_q (FP32, grid included);
      residual  r_i = FP32_RNE(f_i - y_i) (the difference in FP64, rounded once to FP32; no BF16);
      gradient  g_j = the variant's chunked dot over the examples of the FP32_RNE products
                X_q[i, j] * r_i (products rounded to FP32, then fp4train's chunk sums of them).
    Reference: the exact gradient of the same quantized operands, X_q^T (X_q beta_q - y) in FP64
    (exact forward, FP64 residual, FP64 products and sums). Gain error and cosine of g against it
    over the 2048 components (intervals: bootstrap over components), and the forward's own gain
    error against the FP64 forward. The /2048 of the mean is left out: it scales both sides
    exactly. Where the paper's code sums each chunk of 64 with torch's FP32 reduction, this
    script uses fp4train's (the exact chunk sum rounded once). The gain is a ratio over one draw of
    (X, beta, beta_m), which the bootstrap over components holds fixed: --reg-draws draws (the
    first the table's) give its spread from draw to draw, for BF16 rne and rtz. Likewise
    --iq-draws draws of the nvfp4 rho = 0.25 dots for the input quantization's relative L2.
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


def relative_l2(est, ref):
    """||est - ref|| / ||ref|| over all the entries (one norm over the whole vector, not a ratio per
    entry): the paper's `relative_l2` (its comparison_metrics), here of the quantized dots' FP64
    sums against the unquantized ones'."""
    e, r = np.asarray(est, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return math.sqrt(np.dot(e - r, e - r) / np.dot(r, r))


def quantization_only_l2(x, w, xq, wq):
    """The input quantization's error on row-wise dots: relative_l2 of the quantized operands'
    exact dots (xq, wq) against the unquantized operands' (x, w), all [rows, K]."""
    return relative_l2(exact_dots(xq, wq), exact_dots(x, w))


def metric_values(est, ref):
    """The five dot metrics of est against ref (float64 arrays), as floats."""
    e, r = est.astype(np.float64), ref.astype(np.float64)
    mr = np.mean(np.abs(r))
    rr = np.dot(r, r)
    return {
        "magnitude_bias_ppm": (np.mean(np.abs(e)) - mr) / mr * 1e6,
        "gain_error_ppm": (np.dot(e, r) / rr - 1.0) * 1e6,
        "cosine": np.dot(e, r) / math.sqrt(np.dot(e, e) * rr),
        "relative_l2": relative_l2(e, r),
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
            ref_unq = exact_dots(x32, w32)  # the unquantized operands' dots
            for mode in ("bf16", "nvfp4"):
                xa, wa = (bf16(x32), bf16(w32)) if mode == "bf16" else (nvfp4_like(x32), nvfp4_like(w32))
                ref = exact_dots(xa, wa)  # exact sums of the quantized products
                lo, hi, _ = boot.interval(relative_l2, ref, ref_unq)  # rows resampled
                inq_out.append({"distribution": dist, "rho": rho, "mode": mode,
                                "relative_l2": quantization_only_l2(x32, w32, xa, wa),
                                "relative_l2_ci": [lo, hi]})
                partials = fp.chunk_partials(xa, wa, CHUNK)
                for vname, rnd, d in VARIANTS:
                    est = fp.accumulate_partials(partials, rnd, d).astype(np.float64)
                    row = {"distribution": dist, "rho": rho, "mode": mode, "variant": vname}
                    for m in ("magnitude_bias_ppm", "gain_error_ppm", "cosine", "relative_l2", "rmse"):
                        row.update(with_ci(boot, m, lambda e, r, m=m: metric_values(e, r)[m], est, ref))
                    rows_out.append(row)
            log(f"dots: {dist}, rho {rho}")
    return rows_out, inq_out


REG_DISTRIBUTIONS = ("gaussian", "student_t3", "contaminated_gaussian")


def input_quantization_draws(args, inq, log):
    """The NVFP4 input quantization's relative L2 at rho = 0.25 over --iq-draws draws of the dots
    (the first the main table's): the spread from one draw to the next. For Student-t(3), whose
    fourth moment is infinite, it is far wider than the bootstrap interval of one draw."""
    out = []
    for di, dist in enumerate(DISTRIBUTIONS):
        v = [next(r["relative_l2"] for r in inq
                  if r["distribution"] == dist and r["rho"] == 0.25 and r["mode"] == "nvfp4")]
        for j in range(1, args.iq_draws):
            rng = np.random.default_rng([args.seed, 1, di, j])
            x = draw(rng, dist, (args.rows, args.k))
            w = 0.25 * x + math.sqrt(1.0 - 0.0625) * draw(rng, dist, (args.rows, args.k))
            x32, w32 = x.astype(np.float32), w.astype(np.float32)
            v.append(float(quantization_only_l2(x32, w32, nvfp4_like(x32), nvfp4_like(w32))))
        out.append({"distribution": dist, "rho": 0.25, "mode": "nvfp4", "draws": len(v),
                    "relative_l2": v, "min": min(v), "max": max(v), "median": float(np.median(v))})
        if args.iq_draws > 1:
            log(f"input quantization draws: {dist}")
    return out


def regression_reference(Xq, bq, y):
    """The exact gradient X_q^T (X_q b_q - y) in FP64 of quantized operands Xq [examples,
    features] (float32) and bq [features], and the exact forward X_q b_q: the references of
    regression_gradient."""
    fwd = Xq.astype(np.float64) @ bq.astype(np.float64)
    return Xq.astype(np.float64).T @ (fwd - y), fwd


def regression_gradient(Xq, bq, y, rounding, snap, chunk=CHUNK, fwd_partials=None):
    """The MSE gradient (without its 1/n) through one accumulator variant, as the paper's code
    computes it: forward f = the variant's chunked dots of Xq's rows with bq (FP32); residual
    r = FP32_RNE(f - y), y in FP64; gradient = the variant's chunked dots over the examples of
    the FP32_RNE products Xq[i, j] * r[i]. Returns (forward, residual, gradient), float32.
    fwd_partials: the forward's chunk partials, when the caller has them (they do not depend on
    the variant)."""
    n, p = Xq.shape
    if fwd_partials is None:
        fwd_partials = fp.chunk_partials(Xq, np.ascontiguousarray(np.broadcast_to(bq, (n, p))), chunk)
    f = fp.accumulate_partials(fwd_partials, rounding, snap)
    r = (f.astype(np.float64) - y).astype(np.float32)
    terms = np.ascontiguousarray(Xq.T) * r[None, :]  # float32 x float32: rounded RNE to FP32
    g = fp.accumulate_partials(fp.chunk_partials(terms, np.ones_like(terms), chunk), rounding, snap)
    return f, r, g


def regression_problem(seed_seq, dist, n=2048, p=2048):
    """X [n, p], beta_m [p] (float32) and y = X beta (float64) of one draw."""
    rng = np.random.default_rng(seed_seq)
    X = draw(rng, dist, (n, p)).astype(np.float32)
    beta = (rng.standard_normal(p) / math.sqrt(p)).astype(np.float32)
    beta_m = (beta + 0.25 * rng.standard_normal(p) / math.sqrt(p)).astype(np.float32)
    return X, beta_m, X.astype(np.float64) @ beta.astype(np.float64)


def regression_draws(args, log):
    """The BF16 gradient's gain error (ppm) of rne and rtz over --reg-draws draws of (X, beta,
    beta_m), the first the main table's: the spread from one draw of the problem to the next,
    which the bootstrap over one draw's components does not see (the gain is a ratio of sums
    over the whole draw)."""
    out = []
    for di, dist in enumerate(REG_DISTRIBUTIONS):
        vals = {"rne": [], "rtz": []}
        for j in range(args.reg_draws):
            X, beta_m, y = regression_problem([args.seed, 2, di] + ([j] if j else []), dist)
            Xq, bq = bf16(X), bf16(beta_m)
            g_ref, _ = regression_reference(Xq, bq, y)
            for rnd in vals:
                g = regression_gradient(Xq, bq, y, rnd, 0)[2].astype(np.float64)
                vals[rnd].append(float(metric_values(g, g_ref)["gain_error_ppm"]))
        for rnd, v in vals.items():
            out.append({"distribution": dist, "mode": "bf16", "variant": rnd, "draws": len(v),
                        "gain_error_ppm": v, "mean": float(np.mean(v)),
                        "sd": float(np.std(v, ddof=1)) if len(v) > 1 else None,
                        "min": min(v), "max": max(v)})
        log(f"regression draws: {dist}")
    return out


def regression_study(args, log):
    n = p = 2048
    out = []
    boot = Boot(p, args.boot, args.seed + 7)
    for di, dist in enumerate(REG_DISTRIBUTIONS):
        X, beta_m, y = regression_problem([args.seed, 2, di], dist, n, p)
        for mode in ("bf16", "nvfp4"):
            if mode == "bf16":
                Xq, bq = bf16(X), bf16(beta_m)
            else:
                Xq, bq = nvfp4_like(X), nvfp4_like(beta_m[None, :])[0]
            g_ref, f_ref = regression_reference(Xq, bq, y)
            fwd_partials = fp.chunk_partials(Xq, np.ascontiguousarray(np.broadcast_to(bq, (n, p))), CHUNK)
            for vname, rnd, d in VARIANTS:
                f, _, g = regression_gradient(Xq, bq, y, rnd, d, fwd_partials=fwd_partials)
                g = g.astype(np.float64)
                row = {"distribution": dist, "mode": mode, "variant": vname,
                       "forward_gain_error_ppm": metric_values(f, f_ref)["gain_error_ppm"]}
                row.update(with_ci(boot, "gain_error_ppm", lambda e, r: metric_values(e, r)["gain_error_ppm"], g, g_ref))
                row.update(with_ci(boot, "cosine", lambda e, r: metric_values(e, r)["cosine"], g, g_ref))
                out.append(row)
            log(f"regression: {dist}, {mode}")
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
    o.append("\n## Input quantization alone: relative L2 error of the dot products\n")
    o.append("||q − u|| / ||u|| over the dots of each case (the paper's `quantization_only.relative_l2`): "
             "q the FP64 sums of the quantized operands' products, u those of the unquantized FP32 "
             "operands'.\n")
    o.append("| distribution | nvfp4, ρ = 0 | nvfp4, ρ = 0.25 | bf16, ρ = 0 | bf16, ρ = 0.25 |")
    o.append("|---|---|---|---|---|")
    iq = {(r["distribution"], r["rho"], r["mode"]): r for r in res["input_quantization"]}
    for dist in DISTRIBUTIONS:
        o.append(f"| {dist} | " + " | ".join(
            fmt(iq[(dist, rho, mode)]["relative_l2"], iq[(dist, rho, mode)]["relative_l2_ci"], -1)
            for mode in ("nvfp4", "bf16") for rho in RHOS) + " |")
    if res["input_quantization_draws"] and res["input_quantization_draws"][0]["draws"] > 1:
        o.append(f"\nnvfp4, ρ = 0.25, over {res['input_quantization_draws'][0]['draws']} draws of the dots "
                 "(the first the table's): the spread from one draw to the next.\n")
        o.append("| distribution | min | median | max |")
        o.append("|---|---|---|---|")
        for r in res["input_quantization_draws"]:
            o.append(f"| {r['distribution']} | {r['min']:.4f} | {r['median']:.4f} | {r['max']:.4f} |")
    o.append("\n## Regression probe: the MSE gradient through each variant (forward and gradient sums)\n")
    o.append("Against the exact FP64 gradient of the same quantized operands. Forward gain error: the "
             "variant's forward X_q·β_q against its FP64 sum.\n")
    o.append("| distribution | mode | variant | gradient gain error (ppm) | 1 − cosine | forward gain error (ppm) |")
    o.append("|---|---|---|---|---|---|")
    for r in res["regression"]:
        o.append(f"| {r['distribution']} | {r['mode']} | {r['variant']} | "
                 f"{fmt(r['gain_error_ppm'], r['gain_error_ppm_ci'], 3)} | {1 - r['cosine']:.3g} | "
                 f"{r['forward_gain_error_ppm']:+.3f} |")
    rd = res["regression_draws"]
    o.append(f"\nBF16, over {rd[0]['draws']} draws of (X, β, β_m), the first the table's: the gradient's "
             "gain error (ppm) from one draw of the problem to the next.\n")
    o.append("| distribution | variant | mean | SD | min | max |")
    o.append("|---|---|---|---|---|---|")
    for r in rd:
        sd = "—" if r["sd"] is None else f"{r['sd']:.3f}"
        o.append(f"| {r['distribution']} | {r['variant']} | {r['mean']:+.3f} | {sd} | {r['min']:+.3f} | {r['max']:+.3f} |")
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
    ap.add_argument("--reg-draws", type=int, default=8,
                    help="draws of the regression problem for the spread of its BF16 gain errors")
    ap.add_argument("--iq-draws", type=int, default=1,
                    help="draws of the NVFP4 rho = 0.25 dots for the spread of the input quantization's "
                         "relative L2 (each about 20 s per distribution)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if not 16 <= args.rows <= 65536:
        ap.error(f"--rows must be in [16, 65536], got {args.rows}")
    if not (16 <= args.k <= 65536 and args.k % 16 == 0):
        ap.error(f"--k must be a multiple of 16 in [16, 65536], got {args.k}")
    if not 1 <= args.reg_draws <= 100:
        ap.error(f"--reg-draws must be in [1, 100], got {args.reg_draws}")
    if not 1 <= args.iq_draws <= 100:
        ap.error(f"--iq-draws must be in [1, 100], got {args.iq_draws}")
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
    reg_draws = regression_draws(args, log)
    iq_draws = input_quantization_draws(args, inq, log)
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
        "grid_sweep": sweep, "regression_draws": reg_draws, "input_quantization_draws": iq_draws,
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
