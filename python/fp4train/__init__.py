"""fp4train from Python: the exact FP4 numerics of the fp4train C++ library on numpy arrays.

Every number comes from the C++ library the ``fp4train`` program uses (the compiled extension
``fp4train._core``); this package only checks arguments and arranges results. Arrays are numpy
``float32`` (codes ``uint8``), C-contiguous: anything else is refused with ``TypeError`` (not an
ndarray, wrong dtype: nothing is rounded silently) or ``ValueError`` (not C-contiguous, wrong
number of dimensions). C++ errors keep their message: ``std::invalid_argument`` becomes
``ValueError``, ``fp4::UserError`` (bad files, configs, recipes) ``fp4train.UserError`` (a
``ValueError``), anything else ``RuntimeError``. Results do not depend on the OpenMP thread
count (``OMP_NUM_THREADS``). See docs/python.md.

Functions and classes:

* formats: :func:`named_formats`, :func:`format_info`, :func:`encode`, :func:`decode`,
  :func:`round_to`, :func:`sr_bytes`
* quantization: :func:`quantize` -> :class:`QTensor` (codes, scale_codes, scales,
  decode_scales, dequantize(), save()), :func:`load_qtensor`
* GEMMs: :func:`gemm` (``fp4train gemm``), :func:`probe_gemm_alpha`
* recipes and runs: :class:`Recipe` (``Recipe.load``, ``plan(config)``), :class:`Config`,
  :func:`resolve_run` -> :class:`ResolvedRun` (a run resolved as the commands resolve it),
  :func:`load_checkpoint`, :func:`load_run` -> :class:`Run`
"""
import json as _json
import os as _os

from . import _core
from ._core import (  # noqa: F401  (re-exported)
    Checkpoint,
    Config,
    QTensor,
    Recipe,
    ResolvedRun,
    UserError,
    accumulate_partials,
    chunk_partials,
    chunked_dot,
    decode,
    encode,
    format_info,
    load_checkpoint,
    load_qtensor,
    named_formats,
    probe_gemm_alpha,
    quantize,
    resolve_run,
    round_to,
    sr_bytes,
)

__all__ = [
    "Checkpoint", "Config", "QTensor", "Recipe", "ResolvedRun", "Run", "UserError",
    "accumulate_partials",
    "chunk_partials", "chunked_dot", "decode", "encode",
    "format_info", "gemm", "load_checkpoint", "load_qtensor", "load_run", "named_formats",
    "probe_gemm_alpha", "quantize", "resolve_run", "round_to", "sr_bytes",
]

def _friendly_arguments(f, name):
    """``f`` (a pybind11 function) whose argument errors are one short TypeError.

    pybind11's own message for a misspelt keyword or a wrong type lists every overload and
    then the call's arguments, printing whole arrays. This names the unknown keyword (with the
    closest valid one) or the argument types, and the signature; nothing of the values."""
    import difflib
    import functools
    import re

    doc = (f.__doc__ or "").split("\n", 1)[0]
    sig = doc[doc.find("("):doc.rfind(")") + 1] if "(" in doc else "(...)"
    # Parameter names: each word after "(" or "," that a ":", "=", "," or ")" follows.
    valid = re.findall(r"(?:\(|,)\s*(\w+)\s*(?=[:=,)])", sig)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except TypeError as e:
            if "incompatible function arguments" not in str(e):
                raise
            unknown = [k for k in kwargs if k not in valid]
            if unknown:
                k = unknown[0]
                close = difflib.get_close_matches(k, valid, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                msg = (f"{name}() got an unexpected keyword argument '{k}' ({hint}"
                       f"its arguments: {', '.join(valid)})")
            else:
                got = [type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()]
                msg = f"{name}(): arguments of the wrong type ({', '.join(got)}); expected {name}{sig}"
            raise TypeError(msg) from None
    return wrapper


for _name in ("accumulate_partials", "chunk_partials", "chunked_dot", "decode", "encode",
              "format_info", "load_checkpoint", "load_qtensor", "probe_gemm_alpha", "quantize",
              "round_to", "sr_bytes"):
    globals()[_name] = _friendly_arguments(getattr(_core, _name), _name)
del _name


def _as_dict(self):
    """The TOML text (``.toml``) parsed into nested dicts (tomllib), e.g. ``["model"]["d_model"]``."""
    import tomllib
    return tomllib.loads(self.toml)


Config.as_dict = _as_dict
Recipe.as_dict = _as_dict

_OPERAND_KEYS = ("scale_format", "block", "two_d", "target", "reference", "rounding")


def _operand(x, common, opts, which, seed, operand):
    if isinstance(x, QTensor):
        if opts:
            raise ValueError(f"{which}_options apply to arrays, not to an already quantized {which}")
        return x
    opts = dict(opts or {})
    bad = sorted(set(opts) - set(_OPERAND_KEYS))
    if bad:
        raise ValueError(f"{which}_options: unknown key(s) {bad} (valid keys: {', '.join(_OPERAND_KEYS)})")
    kw = dict(common)
    kw.update(opts)
    return quantize(x, seed=seed, sr_key={"step": 1, "layer": 0, "operand": operand, "gemm": 0},
                    check_finite=False, **kw)


def gemm(a, b, mode="probe-matched", *, scale_format="ue5m3", scale_rule="tensor-scaled",
         block=16, target=448.0, rounding="rne", seed=0, a_options=None, b_options=None,
         chunk=64, accumulate="rtz", snap=1024):
    """Emulated FP4 GEMM C [M, N] = A [M, K] · B [N, K]ᵀ, exactly as ``fp4train gemm A B``.

    a, b: float32 ndarrays [M, K] and [N, K] (C-contiguous; each row of B is one output column,
    as the weight of a linear layer), quantized here along K as the CLI does (tensor reference
    max|operand| unless ``reference`` is given; SR keys step 1, layer 0, operand 0 for A and 1
    for B, gemm 0) -- or QTensors from :func:`quantize` (used as they are).
    mode: ``"probe-matched"`` (the CLI's default: the native Blackwell FP4 GEMM's arithmetic,
    docs/gemm.md), ``"decoded"`` (dequantize both, FP32 oneDNN GEMM; the reference) or
    ``"decoded-bf16"`` (q·c_b on the BF16 GEMM, decode scales on the output; what the shipped
    FP4 recipes train with; docs/gemm.md "Decoded FP4 on the BF16 GEMM").
    scale_format, scale_rule, block, target, rounding, seed: as ``--scale-format`` etc., for
    both operands; a_options / b_options: dicts overriding them for one operand (keys
    scale_format, block, two_d, target, reference, rounding; the ``--a-*`` / ``--b-*`` flags).
    chunk, accumulate, snap: the probe-matched mode's accumulator (``--chunk``, ``--accumulate``,
    ``--snap``; docs/gemm.md "The accumulator"): 16/32/64/128 products per chunk, ``"rtz"`` or
    ``"rne"`` additions of the chunk sums, snap grid 1/d (0 = none).
    Returns float32 [M, N].
    Raises TypeError / ValueError for bad arrays (dtype, layout, shape, NaN), a K mismatch,
    unknown names or keys; the messages are the C++ library's.
    """
    common = {"scale_format": scale_format, "scale_rule": scale_rule, "block": block,
              "target": target, "rounding": rounding}
    qa = _operand(a, common, a_options, "a", seed, 0)
    qb = _operand(b, common, b_options, "b", seed, 1)
    return _core.gemm_quantized(qa, qb, mode, chunk, accumulate, snap)


class Run:
    """A run directory of ``fp4train train``, loaded by :func:`load_run`.

    What the directory holds: docs/demo.md "What the demo does".

    Attributes:
      path (str): the directory.
      config (Config): ``config.toml``, the resolved run config.
      recipe (Recipe): ``recipe.toml``, the resolved recipe.
      metrics (list[dict]): ``metrics.jsonl``, one dict per logged step (step, loss, lr,
        grad_norm, ..., val_nll, telemetry where present), in file order.
      summary (dict | None): ``summary.json`` when the run completed, else None.
      error (str | None): the content of ``error.txt`` (diverged or failed run), else None.
      checkpoint (Checkpoint | None): the newest checkpoint that loads, or None without one;
        ``checkpoint.params`` are the FP32 weights by parameter name (numpy float32 [rows, cols]).
    """

    def __init__(self, path, config, recipe, metrics, summary, error, checkpoint):
        self.path = path
        self.config = config
        self.recipe = recipe
        self.metrics = metrics
        self.summary = summary
        self.error = error
        self.checkpoint = checkpoint

    @property
    def params(self):
        """The newest checkpoint's FP32 weights by parameter name (dict of float32 [rows, cols])."""
        if self.checkpoint is None:
            raise ValueError(f"{self.path}: the run has no checkpoint")
        return self.checkpoint.params

    def __repr__(self):
        step = self.checkpoint.step if self.checkpoint is not None else None
        return f"<fp4train.Run {self.path!r} recipe {self.recipe.name} checkpoint step {step}>"


def load_run(path, checkpoint=True):
    """Load a run directory: config, recipe, metrics.jsonl, summary, error.txt, newest checkpoint.

    A compacted run's metrics.jsonl.zst (``fp4train compact``) is read as its metrics.jsonl.

    path: a directory written by ``fp4train train`` (``runs/<name>``).
    checkpoint: False to skip loading the checkpoint tensors (faster for big models).
    Returns a :class:`Run`. Raises fp4train.UserError if the directory, ``config.toml`` or
    ``recipe.toml`` is missing or invalid, or a metrics line is not JSON (naming the file and
    line; a corrupt or truncated metrics.jsonl.zst, or a directory holding both files); a run
    without checkpoints gets ``checkpoint = None``.
    """
    path = _os.fspath(path)
    if not _os.path.isdir(path):
        raise UserError(f"{path}: not a run directory (no such directory)")
    for name in ("config.toml", "recipe.toml"):
        if not _os.path.isfile(_os.path.join(path, name)):
            raise UserError(f"{path}: not a run directory ({name} is missing)")
    with open(_os.path.join(path, "config.toml"), encoding="utf-8") as f:
        config = Config.from_toml(f.read(), _os.path.join(path, "config.toml"))
    with open(_os.path.join(path, "recipe.toml"), encoding="utf-8") as f:
        recipe = Recipe.from_toml(f.read(), _os.path.join(path, "recipe.toml"))
    metrics = []
    mpath = _os.path.join(path, "metrics.jsonl")
    if _os.path.exists(mpath + ".zst"):
        # A compacted run (`fp4train compact`): read by the C++ reader of `fp4train report`,
        # which also refuses a directory holding both files.
        mpath, lines = _core.run_metrics_lines(path)
    elif _os.path.isfile(mpath):
        with open(mpath, encoding="utf-8") as f:
            lines = list(f)
    else:
        lines = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            metrics.append(_json.loads(line))
        except ValueError as e:
            raise UserError(f"{mpath}: line {n} is not JSON ({e})") from None
    summary = None
    spath = _os.path.join(path, "summary.json")
    if _os.path.isfile(spath):
        with open(spath, encoding="utf-8") as f:
            summary = _json.load(f)
    error = None
    epath = _os.path.join(path, "error.txt")
    if _os.path.isfile(epath):
        with open(epath, encoding="utf-8") as f:
            error = f.read()
    ck = None
    if checkpoint:
        cdir = _os.path.join(path, "checkpoints")
        if _os.path.isdir(cdir) and any(n.endswith(".safetensors") for n in _os.listdir(cdir)):
            ck = load_checkpoint(path)
    return Run(path, config, recipe, metrics, summary, error, ck)
