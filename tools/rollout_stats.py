"""Shared statistics of a rollout set (docs/fidelity.md "Paired rollouts"), for
tools/rollout_noise.py and tools/plot_rollout.py.

Reads a rollout.json written by `fp4train rollout` (format fp4train.rollout.v1: `length` N,
`orders` O, `steps` (the K checkpoints), `recipes` (index 0 the fp32 reference) and
traces[r][c][o] = {"loss": [N training losses], "nll", "nll_fp32", "divergence", "diverged"},
and, from binaries that record them, "grad_norm" [N] with the thresholds in a top-level
"stability" object), and computes what rollout.md computes, the same way:

  * a recipe's paired gap per (checkpoint c, order o): its value minus the fp32 rollout's on the
    same (c, o), e.g. loss_r[n] - loss_fp32[n]; the mean gap over steps 1..n sums the per-step
    gaps in step order and divides by n (rollout_report.cpp's mean_loss at n = N);
  * a contrast B - A per (c, o): gap_B - gap_A (rollout_report.cpp's `difference`);
  * the stability counts per (c, o) where traces hold gradient norms (stability_counts:
    rollout.md's "Stability" table);
  * the 95% two-level bootstrap interval of a [checkpoint][order] grid, bit for bit the one of
    bootstrap_two_level (src/study/fidelity.cpp): each of `resamples` resamples draws K
    checkpoints with replacement (no draw when K = 1) and, within each drawn checkpoint, O
    orders with replacement, all from one splitmix64 stream (seed, index 0, 1, 2, ...; a draw
    uniform in [0, n) rejects the top partial range of 2^64), and averages the K x O drawn
    values in draw order; the interval is the 2.5% and 97.5% quantiles (linear interpolation)
    of the sorted resample means. rollout.md's defaults: 2000 resamples, seed 20261206.

Standard library only.
"""
import json
import math

FORMAT = "fp4train.rollout.v1"
RESAMPLES = 2000        # RolloutRequest::resamples (include/fp4/study/rollout.h)
SEED = 20261206         # RolloutRequest::bootstrap_seed
Z95 = 1.96
COUNTS = ("spikes", "gnorm_excursions", "nonfinite")  # stability_counts' keys
_M64 = (1 << 64) - 1


class BadInput(Exception):
    """Input that is not a usable rollout.json; the tools exit 2 with its message."""


def splitmix64(seed, index):
    """src/data/batches.cpp's splitmix64: the index-th value of the stream of seed."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _number(v):
    """A JSON number as float; null (a non-finite value in the C++ writer) as NaN."""
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadInput(f"expected a number or null, found {json.dumps(v)[:40]}")
    return float(v)


def load(path):
    """The rollout set at path as a dict: name, length, orders, steps, recipes and
    traces[r][c][o] = {"loss": [floats], "nll", "nll_fp32", "divergence" (floats, NaN for
    null), "diverged" (bool), and "grad_norm" [floats] where the file has it}, and its "stability". Raises
    BadInput for a file that cannot be read, is not JSON or not a consistent rollout.json."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path} is not JSON: {e}")
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise BadInput(f"{path} is not a rollout.json (no \"format\": \"{FORMAT}\")")
    try:
        return _check(d)
    except BadInput as e:
        raise BadInput(f"{path}: {e}")


def _check(d):
    for key in ("length", "orders", "steps", "recipes", "traces"):
        if key not in d:
            raise BadInput(f"no '{key}'")
    N, O, steps, recipes = d["length"], d["orders"], d["steps"], d["recipes"]
    if not isinstance(N, int) or isinstance(N, bool) or N < 1:
        raise BadInput(f"'length' is not a positive integer: {json.dumps(N)}")
    if not isinstance(O, int) or isinstance(O, bool) or O < 1:
        raise BadInput(f"'orders' is not a positive integer: {json.dumps(O)}")
    if not isinstance(steps, list) or not steps:
        raise BadInput("'steps' (the checkpoints) is not a non-empty list")
    if not isinstance(recipes, list) or not recipes or not all(isinstance(r, str) for r in recipes):
        raise BadInput("'recipes' is not a non-empty list of names")
    tr = d["traces"]
    if not isinstance(tr, list) or len(tr) != len(recipes):
        raise BadInput("'traces' does not hold one entry per recipe")
    traces = []
    for r, by_c in enumerate(tr):
        if not isinstance(by_c, list) or len(by_c) != len(steps):
            raise BadInput(f"recipe {recipes[r]}: traces do not hold one entry per checkpoint")
        rows = []
        for c, by_o in enumerate(by_c):
            if not isinstance(by_o, list) or len(by_o) != O:
                raise BadInput(f"recipe {recipes[r]}, checkpoint {steps[c]}: traces do not hold "
                               f"{O} orders")
            row = []
            for o, t in enumerate(by_o):
                where = f"recipe {recipes[r]}, checkpoint {steps[c]}, order {o}"
                if not isinstance(t, dict) or not isinstance(t.get("loss"), list):
                    raise BadInput(f"{where}: a trace without a 'loss' list")
                if len(t["loss"]) != N:
                    raise BadInput(f"{where}: 'loss' holds {len(t['loss'])} values, not "
                                   f"length = {N}")
                try:
                    x = {"loss": [_number(v) for v in t["loss"]],
                         "nll": _number(t.get("nll")), "nll_fp32": _number(t.get("nll_fp32")),
                         "divergence": _number(t.get("divergence")),
                         "diverged": bool(t.get("diverged"))}
                except BadInput as e:
                    raise BadInput(f"{where}: {e}")
                if "grad_norm" in t:
                    g = t["grad_norm"]
                    if not isinstance(g, list) or len(g) != N:
                        raise BadInput(f"{where}: 'grad_norm' is not a list of length = {N} values")
                    try:
                        x["grad_norm"] = [_number(v) for v in g]
                    except BadInput as e:
                        raise BadInput(f"{where}: grad_norm: {e}")
                row.append(x)
            rows.append(row)
        traces.append(rows)
    return {"length": N, "orders": O, "steps": list(steps), "recipes": list(recipes),
            "traces": traces, "run": d.get("run", ""), "machine": d.get("machine", ""),
            "stability": d.get("stability"), "bootstrap": d.get("bootstrap"),
            "windows": d.get("windows")}


def bootstrap_of(d, resamples=None, seed=None):
    """(resamples, seed) of the report: the given ones, else the file's "bootstrap" record, else
    rollout.md's defaults (files of earlier versions record none)."""
    b = d.get("bootstrap") if isinstance(d.get("bootstrap"), dict) else {}
    if resamples is None:
        resamples = b.get("resamples", RESAMPLES)
    if seed is None:
        seed = b.get("seed", SEED)
    return int(resamples), int(seed)


def rollouts(d):
    """K x O, the number of rollouts per recipe."""
    return len(d["steps"]) * d["orders"]


def grid(d, fn):
    """[checkpoint][order] of fn(c, o)."""
    return [[fn(c, o) for o in range(d["orders"])] for c in range(len(d["steps"]))]


def value_grid(d, r, key):
    """[c][o] of the trace field key of recipe r (not a gap): e.g. divergence."""
    return grid(d, lambda c, o: d["traces"][r][c][o].get(key, math.nan))


def _finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def stability_counts(t, ref, spike, limit):
    """A trace's stability counts as `fp4train rollout` defines them (docs/fidelity.md "Stability
    stress"): steps whose loss exceeds the fp32 rollout's (ref) on the same batch by more than
    `spike` nats, steps whose gradient norm before clipping exceeds `limit` (a step after a
    divergence, null in the file, is neither), and 1 if the rollout stopped at a non-finite step."""
    lt, lr, gn = t.get("loss") or [], ref.get("loss") or [], t.get("grad_norm") or []
    spikes = sum(1 for a, b in zip(lt, lr) if _finite(a) and _finite(b) and a - b > spike)
    excursions = sum(1 for g in gn if _finite(g) and g > limit)
    return {"spikes": spikes, "gnorm_excursions": excursions, "nonfinite": 1 if t.get("diverged") else 0}


def has_grad_norms(d):
    """Whether every trace records its gradient norms (binaries before that did not)."""
    return all(isinstance(t.get("grad_norm"), list) for by_c in d["traces"] for by_o in by_c for t in by_o)


def thresholds(d):
    """(spike threshold, grad-norm limit) of the file's "stability" object (defaults 0.1, 1)."""
    st = d.get("stability") if isinstance(d.get("stability"), dict) else {}
    spike, limit = st.get("spike_threshold"), st.get("grad_norm_limit")
    return (spike if _finite(spike) else 0.1), (limit if _finite(limit) else 1.0)


def count_grid(d, r, key):
    """[c][o] of recipe r's stability count `key` (one of COUNTS)."""
    spike, limit = thresholds(d)
    T, R = d["traces"][r], d["traces"][0]
    return grid(d, lambda c, o: float(stability_counts(T[c][o], R[c][o], spike, limit)[key]))


def gap_grid(d, r, key):
    """[c][o] of the gap of recipe r to fp32 in the scalar field key (nll, nll_fp32)."""
    t, ref = d["traces"][r], d["traces"][0]
    return grid(d, lambda c, o: t[c][o][key] - ref[c][o][key])


def loss_gaps(d, r):
    """[c][o][k] of loss_r[k] - loss_fp32[k], k = 0..N-1 (step k + 1)."""
    t, ref = d["traces"][r], d["traces"][0]
    return grid(d, lambda c, o: [a - b for a, b in zip(t[c][o]["loss"], ref[c][o]["loss"])])


def cumulative(series):
    """[c][o][k] of the mean of series[c][o][0..k], summed in step order then divided by k + 1
    (at k = N - 1 bit for bit rollout.md's "mean loss gap, steps 1..N")."""
    out = []
    for row in series:
        orow = []
        for xs in row:
            s, m = 0.0, []
            for k, v in enumerate(xs):
                s += v
                m.append(s / (k + 1))
            orow.append(m)
        out.append(orow)
    return out


def at(series, k):
    """[c][o] of series[c][o][k]."""
    return [[xs[k] for xs in row] for row in series]


def difference(a, b):
    """[c][o] of a - b (a contrast: gap_B - gap_A is difference(gap_B, gap_A))."""
    return [[x - y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def difference_series(a, b):
    return [[[x - y for x, y in zip(xa, xb)] for xa, xb in zip(ra, rb)] for ra, rb in zip(a, b)]


def finite(g):
    return all(math.isfinite(v) for row in g for v in row)


def mean_sd(g):
    """Mean and between-rollout sample SD (n - 1) of the K x O values of a grid; the mean sums
    in grid order like bootstrap_two_level. SD is NaN for one value."""
    xs = [v for row in g for v in row]
    total = 0.0
    for v in xs:
        total += v
    m = total / len(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, math.sqrt(sum((v - m) ** 2 for v in xs) / (len(xs) - 1))


class Bootstrap:
    """bootstrap_two_level for every grid of one shape (K checkpoints x O orders): the draws
    depend only on the shape, resamples and seed, so they are made once and applied to each
    grid (the same draws rollout.md's every cell uses)."""

    def __init__(self, K, O, resamples=RESAMPLES, seed=SEED):
        if K < 1 or O < 1:
            raise ValueError("bootstrap: no checkpoints or no orders")
        if resamples < 1:
            raise ValueError("bootstrap: resamples must be >= 1")
        self.K, self.O, self.resamples, self.seed = K, O, resamples, seed
        k = 0

        def draw(n):
            nonlocal k
            limit = _M64 - _M64 % n
            while True:
                u = splitmix64(seed, k)
                k += 1
                if u < limit:
                    return u % n

        self.picks = []  # per resample: flat indices c * O + o in draw order
        for _ in range(resamples):
            idx = []
            for _c in range(K):
                c = 0 if K == 1 else draw(K)
                for _o in range(O):
                    idx.append(c * O + draw(O))
            self.picks.append(idx)

    def interval(self, g):
        """(mean, lo, hi) of the grid g: the mean and the 95% percentile interval; None for
        a grid with a non-finite value (bootstrap_two_level refuses it)."""
        if len(g) != self.K or any(len(row) != self.O for row in g):
            raise ValueError("bootstrap: grid shape does not match")
        if not finite(g):
            return None
        x = [v for row in g for v in row]
        n = float(self.K * self.O)
        total = 0.0
        for v in x:
            total += v
        stats = []
        for idx in self.picks:
            s = 0.0
            for i in idx:
                s += x[i]
            stats.append(s / n)
        stats.sort()

        def quantile(q):
            h = (len(stats) - 1) * q
            lo = math.floor(h)
            hi = min(lo + 1, len(stats) - 1)
            return stats[lo] + (h - lo) * (stats[hi] - stats[lo])

        return total / n, quantile(0.025), quantile(0.975)


def required_rollouts(mean, sd, z=Z95):
    """Rollouts (K x O) for a 95% interval of half-width |mean| under the normal approximation
    with independent rollouts, unrounded: (z * sd / |mean|)^2; math.inf for a mean of 0, None
    where mean or sd is not finite."""
    if not (math.isfinite(mean) and math.isfinite(sd)):
        return None
    if mean == 0:
        return math.inf
    return (z * sd / abs(mean)) ** 2


def rounded_up(x):
    """A number of rollouts rounded up, at least 1 (inf and None stay)."""
    if x is None or x == math.inf:
        return x
    return max(1, math.ceil(x))


def summarize(g, boot):
    """{mean, sd, lo, hi, half_width} of a [c][o] grid (half_width = (hi - lo) / 2 of the
    bootstrap interval, which is not symmetric about the mean); None for a grid with a
    non-finite value."""
    if not finite(g):
        return None
    m, sd = mean_sd(g)
    iv = boot.interval(g)
    return {"mean": m, "sd": sd, "lo": iv[1], "hi": iv[2], "half_width": (iv[2] - iv[1]) / 2}


def step_entries(series, boot, z=Z95):
    """Per step n = 1..N, the summary of series[c][o][n - 1] (summarize) with n, the
    signal-to-noise |mean| / SD and the rollouts needed to resolve it at 95%: `needed_exact` =
    required_rollouts(mean, SD) (unrounded), `needed` = that rounded up (at least 1), and
    `needed_bootstrap` = ceil(R (half_width / |mean|)^2) (at least 1), which scales the
    two-level interval's own half-width by 1/sqrt(rollouts) (checkpoints and orders grown
    together) instead of assuming independent rollouts. A step with a non-finite value gets
    n and None for every figure."""
    K, O = boot.K, boot.O
    N = len(series[0][0])
    out = []
    for k in range(N):
        s = summarize(at(series, k), boot)
        e = {"n": k + 1}
        if s is None:
            e.update({f: None for f in ("mean", "sd", "lo", "hi", "half_width", "snr",
                                        "needed_exact", "needed", "needed_bootstrap")})
        else:
            e.update(s)
            m, sd, hw = s["mean"], s["sd"], s["half_width"]
            e["snr"] = abs(m) / sd if sd > 0 else (math.inf if m != 0 else math.nan)
            e["needed_exact"] = required_rollouts(m, sd, z)
            e["needed"] = rounded_up(e["needed_exact"])
            e["needed_bootstrap"] = rounded_up(math.inf if m == 0 else
                                               K * O * (hw / abs(m)) ** 2)
        out.append(e)
    return out


def recipe_series(d, boot, z=Z95):
    """Per recipe (not the fp32 reference): name, and the step_entries of its loss gap to fp32
    at each step ("at_step") and of its mean gap over steps 1..n ("cumulative")."""
    out = []
    for r in range(1, len(d["recipes"])):
        lg = loss_gaps(d, r)
        out.append({"name": d["recipes"][r], "at_step": step_entries(lg, boot, z),
                    "cumulative": step_entries(cumulative(lg), boot, z)})
    return out


def contrast_series(d, boot, z=Z95):
    """Per pair of recipes A, B (A listed first, as rollout.md): the step_entries of B - A,
    gap_B - gap_A on the same (checkpoint, order), at each step and of the mean over 1..n
    (the difference of the two mean gaps)."""
    gaps = [None] + [loss_gaps(d, r) for r in range(1, len(d["recipes"]))]
    cums = [None] + [cumulative(g) for g in gaps[1:]]
    out = []
    for a in range(1, len(d["recipes"])):
        for b in range(a + 1, len(d["recipes"])):
            out.append({"a": d["recipes"][a], "b": d["recipes"][b],
                        "at_step": step_entries(difference_series(gaps[b], gaps[a]), boot, z),
                        "cumulative": step_entries(difference_series(cums[b], cums[a]), boot, z)})
    return out
