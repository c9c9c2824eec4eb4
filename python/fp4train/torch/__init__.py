"""fp4train.torch: fp4train's C++ quantized Linear as a ``torch.nn.Module`` (CPU, float32).

``Linear`` is a drop-in for ``torch.nn.Linear`` (with a bias by default, as there) inside an
ordinary PyTorch CPU model; :func:`convert` swaps the ``torch.nn.Linear`` modules of a model's
blocks for it. Its autograd forward and backward call fp4train's C++ Linear
(``fp4/nn/linear.h``): fprop, dgrad and wgrad with the recipe's quantization, SR keys, held
tensor references (D = ``[fp4] amax_interval``) and, for NVFP4 recipes, the random Hadamard
transform of the wgrad operands. The results are bit-identical to the C++ Linear's on the same
weights, inputs and step (tests/python/test_torch_linear.py runs both).

A ``StepContext`` holds the optimizer step the layers quantize at (it keys the SR bytes and
clocks the held references) and the run seed; call ``steps.advance()`` after every
``optimizer.step()`` (or let ``convert(..., optimizer=opt)`` do it; a second training forward
of a layer at the same step and micro-batch is a RuntimeError by default)::

    import torch, fp4train.torch as ft
    steps = ft.StepContext(seed=1)
    model = torch.nn.Sequential(ft.Linear(64, 256, "ue5m3-b16", layer=0, steps=steps),
                                torch.nn.ReLU(),
                                ft.Linear(256, 64, "ue5m3-b16", layer=1, steps=steps))
    ...
    loss.backward(); opt.step(); opt.zero_grad(); steps.advance()

Rules: inputs and weights are float32 CPU tensors (anything else is a TypeError); a layer runs
one training forward, then its backward, before its next training forward (the C++ Linear keeps
one forward's operands; a second forward first is a RuntimeError); under ``torch.no_grad()`` (or
when neither input nor weight needs a gradient) a forward is an inference forward (no held
reference is updated). RHT recipes (nvfp4-te) need the token count (all leading dimensions
multiplied) to be a multiple of 16.

:mod:`fp4train.torch.models` is a plain-PyTorch implementation of fp4train's models (torch's
own ops, not fp4train's kernels), for checking fp4train against an independent framework and
for loading ``fp4train export`` directories (docs/export.md).
"""
import math
import warnings

import torch

from .. import Recipe, _core

__all__ = ["ConvertWarning", "Linear", "StepContext", "convert"]


class StepContext:
    """The step the fp4train layers quantize at.

    step (int): 1-based optimizer step (SR keys, held-reference refresh every D steps).
    seed (int): run seed (SR keys). micro (int): micro-batch of the step (SR keys), 0 normally.
    telemetry (bool): record numerics telemetry on training forwards (``Linear.telemetry``).
    repeat (str): what a second training forward of one Linear at the same (step, micro) does,
      which would draw the same SR bytes again and hold the references' clock (a forgotten
      ``advance()``): ``"error"`` (default) raises RuntimeError, ``"warn"`` warns
      (RuntimeWarning) and runs, ``"allow"`` runs (docs/python.md "Steps: advance or hook").
    Raises ValueError for step < 1 or an unknown ``repeat``.
    """

    _REPEAT = ("error", "warn", "allow")

    def __init__(self, seed=0, step=1, micro=0, telemetry=False, repeat="error"):
        if step < 1:
            raise ValueError(f"step must be >= 1 (1-based), got {step}")
        if repeat not in self._REPEAT:
            raise ValueError(f"repeat: unknown value {repeat!r} (valid choices: {', '.join(self._REPEAT)})")
        self.seed = int(seed)
        self.step = int(step)
        self.micro = int(micro)
        self.telemetry = bool(telemetry)
        self.repeat = repeat
        self._trained_step = None  # the step of the last training forward of any layer

    def advance(self, n=1):
        """Move to the next optimizer step (call after optimizer.step())."""
        self.step += int(n)

    def after_optimizer_step(self):
        """What the optimizer hook of :func:`convert` calls after every ``optimizer.step()``:
        advance to the next step if a layer ran a training forward at the current one (so a
        manual ``advance()`` as well never skips a step). Returns True if it advanced."""
        if self._trained_step == self.step:
            self.advance()
            return True
        return False

    def _check_repeat(self, layer):
        """Before a training forward of `layer` (a Linear): refuse or warn when it ran one at
        this (step, micro) already, as ``repeat`` says."""
        if layer._trained_at == (self.step, self.micro) and self.repeat != "allow":
            msg = (f"{layer._label()}: a second training forward at step {self.step}, micro "
                   f"{self.micro} would repeat that step's SR draws and hold the references' clock; "
                   "call steps.advance() after optimizer.step(), pass optimizer= to "
                   "fp4train.torch.convert, or give each micro-batch its own steps.micro "
                   "(docs/python.md \"Steps: advance or hook\"; StepContext(repeat='allow') permits it)")
            if self.repeat == "error":
                raise RuntimeError(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=4)

    def _record(self, layer):
        """After a training forward of `layer`: remember its (step, micro)."""
        layer._trained_at = (self.step, self.micro)
        self._trained_step = self.step

    def __repr__(self):
        return f"StepContext(seed={self.seed}, step={self.step})"


def _check(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype} (convert explicitly; fp4train does not round silently)")
    if t.device.type != "cpu":
        raise TypeError(f"{name} must be on the CPU, got {t.device}")


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, layer):
        core, steps = layer.core, layer.steps
        K, N = core.in_features, core.out_features
        x2 = x.detach().reshape(-1, K).contiguous()
        w = weight.detach().contiguous()
        y = core.forward(x2.numpy(), w.numpy(), steps.step, steps.seed, micro=steps.micro,
                         training=True, telemetry=steps.telemetry)
        layer._pending = True
        ctx.layer = layer
        ctx.x_shape = x.shape
        return torch.from_numpy(y).reshape(*x.shape[:-1], N)

    @staticmethod
    def backward(ctx, dy):
        layer = ctx.layer
        core = layer.core
        dy2 = dy.detach().reshape(-1, core.out_features).to(torch.float32).contiguous()
        dx, dw = core.backward(dy2.numpy(), need_dx=bool(ctx.needs_input_grad[0]))
        layer._pending = False
        dx = torch.from_numpy(dx).reshape(ctx.x_shape) if dx is not None else None
        return dx, torch.from_numpy(dw), None


class Linear(torch.nn.Module):
    """y = x · weightᵀ (+ bias) with fp4train's quantized Linear.

    in_features (K), out_features (N): sizes; weight is a Parameter [N, K] (float32), initialised
    as torch.nn.Linear's. recipe: a recipe name (configs/recipes), a path, or a fp4train.Recipe.
    layer: the layer index in the SR keys (give each layer of a model its own). steps: the
    StepContext shared by the model's layers (a new one at step 1, seed 0 if None). mode: 'fp32',
    'bf16', 'fp4' or '' (the recipe's [linear] mode). bias: a Parameter [N] (float32) added in
    FP32 after the GEMM, as torch.nn.Linear's (default True, as there); its gradient is dy
    summed over the leading dimensions in FP32, not quantized. plan (keyword): a
    ``fp4train._core.LinearPlan`` from ``_core.resolve_linear_plans`` (what :func:`convert`
    passes: the recipe's [high_precision] and [[override]] rules for this linear); it replaces
    ``mode`` (``.plan``, None without one; ``.plan.specs`` its quantizations). After
    :func:`convert`, ``name``, ``block`` and ``kind`` say where the layer sits (None otherwise).
    Input x [..., K] float32 CPU; output [..., N]. Raises TypeError for other dtypes/devices,
    ValueError for a wrong last dimension, RuntimeError for a second training forward before
    the backward of the first, or at the same step and micro-batch as the last one
    (StepContext ``repeat``). docs/python.md "PyTorch: fp4train.torch.Linear".
    """

    def __init__(self, in_features, out_features, recipe="ue5m3-b16", layer=0, steps=None, mode="",
                 bias=True, *, plan=None):
        super().__init__()
        self.recipe = recipe if isinstance(recipe, Recipe) else Recipe.load(str(recipe))
        self.in_features, self.out_features, self.layer = int(in_features), int(out_features), int(layer)
        if plan is not None:
            if mode:
                raise ValueError("Linear: give mode or plan, not both (a plan holds its mode)")
            self.core = _core.Linear(self.in_features, self.out_features, plan, self.layer)
        else:
            self.core = _core.Linear(self.in_features, self.out_features, self.recipe, self.layer, mode)
        self.steps = steps if steps is not None else StepContext()
        self.weight = torch.nn.Parameter(torch.empty(self.out_features, self.in_features, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(self.out_features, dtype=torch.float32)) if bias else None
        self.plan = plan
        self.name = self.block = self.kind = None
        self._pending = False     # a training forward waits for its backward
        self._trained_at = None   # (step, micro) of the last training forward
        self._calls = 0           # forwards run (convert's first-forward check)
        self.reset_parameters()

    def reset_parameters(self):
        """torch.nn.Linear's initialisation (Kaiming uniform with a = sqrt(5))."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @property
    def mode(self):
        """The Linear's mode: 'fp32', 'bf16' or 'fp4'."""
        return self.core.mode

    @property
    def telemetry(self):
        """Numerics telemetry of the last telemetry step (x, w, dy, dyt, xt), or None."""
        return self.core.telemetry

    def _label(self):
        return f"fp4train Linear '{self.name}'" if self.name else f"fp4train Linear(layer={self.layer})"

    def forward(self, x):
        _check(x, "x")
        _check(self.weight, "weight")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must be [..., {self.in_features}], got {list(x.shape)}")
        self._calls += 1
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            if not self._pending:  # (a pending forward: the C++ Linear's own error comes first)
                self.steps._check_repeat(self)
            y = _LinearFunction.apply(x, self.weight, self)
            self.steps._record(self)
        else:
            x2 = x.detach().reshape(-1, self.in_features).contiguous()
            y = torch.from_numpy(self.core.forward(
                x2.numpy(), self.weight.detach().contiguous().numpy(), self.steps.step, self.steps.seed,
                micro=self.steps.micro, training=False)).reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            _check(self.bias, "bias")
            y = y + self.bias  # FP32, after the GEMM
        return y

    def extra_repr(self):
        where = f", block={self.block}, kind={self.kind or '-'}" if self.block is not None else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, recipe={self.recipe.name}, "
                f"layer={self.layer}, mode={self.mode}, bias={self.bias is not None}{where}")


from ._convert import ConvertWarning, convert  # noqa: E402  (it builds on Linear and StepContext)
