"""fp4train.torch.convert: swap a PyTorch model's torch.nn.Linear modules for fp4train's Linear.

The rules (which linears, which block and kind, which plan): docs/python.md "Converting a
PyTorch model: convert". The recipe's [high_precision] and [[override]] rules are the C++
ones (``_core.resolve_linear_plans``, src/recipe/recipe.cpp): this module only says where each
linear sits.
"""
import fnmatch
import types
import warnings

import torch

from .. import Recipe, _core
from . import Linear, StepContext

__all__ = ["ConvertWarning", "convert"]

_DOC = 'docs/python.md "Converting a PyTorch model: convert"'


class ConvertWarning(UserWarning):
    """A linear product that :func:`convert` cannot run in FP4 (a module that reads a Linear's
    weight without calling its forward, such as torch.nn.MultiheadAttention)."""


def _module(model, name, what):
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"convert: {what}: the model has no module '{name}'") from None


def _block_roots(model, blocks, linear_names):
    """The module names whose subtrees are the recipe's blocks 0, 1, ... (see convert)."""
    if blocks is None:
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.ModuleList) and name and any(
                    n.startswith(name + ".") for n in linear_names):
                return [f"{name}.{c}" for c, _ in m.named_children()]
        raise ValueError("convert: no torch.nn.ModuleList of blocks holding an nn.Linear found in the "
                         "model; pass blocks='<container>' (its children are the blocks) or "
                         f"blocks=[module names] ({_DOC})")
    if isinstance(blocks, str):
        roots = [f"{blocks}.{c}" if blocks else c
                 for c, _ in _module(model, blocks, f"blocks='{blocks}'").named_children()]
        if not roots:
            raise ValueError(f"convert: blocks='{blocks}' has no child modules (its children are the blocks)")
        return roots
    if not isinstance(blocks, (list, tuple)) or not all(isinstance(b, str) for b in blocks) or not blocks:
        raise TypeError("convert: blocks must be None, a module name (str) or a non-empty list of module "
                        f"names, got {blocks!r}")
    for i, b in enumerate(blocks):
        _module(model, b, f"blocks[{i}]")
        for j, c in enumerate(blocks[:i]):
            if b == c or b.startswith(c + ".") or c.startswith(b + ".") or not b or not c:
                raise ValueError(f"convert: blocks[{j}] '{c}' and blocks[{i}] '{b}' overlap "
                                 "(a linear must sit in one block)")
    return list(blocks)


def _block_of(name, roots):
    for b, r in enumerate(roots):
        if name == r or name.startswith(r + "."):
            return b
    return None


def _kind_of(name, kinds, used):
    """The recipe's linear kind of module `name`: the first pattern of `kinds` that matches it,
    else its last two or last name components if they name a kind ('mlp.down', 'down_proj'),
    else '' (no [[override]] selects it)."""
    for pat, kind in kinds.items():
        if fnmatch.fnmatchcase(name, pat):
            used.add(pat)
            return _core.canonical_linear_kind(kind) if kind else ""
    parts = name.split(".")
    for tail in (".".join(parts[-2:]), parts[-1]):
        k = _core.canonical_linear_kind(tail)
        if k:
            return k
    return ""


def _warn(msg):
    warnings.warn(f"fp4train.torch.convert: {msg} ({_DOC})", ConvertWarning, stacklevel=4)


def _candidates(named, exclude):
    """The nn.Linear modules convert may swap, as (name, module) in named_modules() order, and
    {name: why} of those it keeps; warns for the modules that bypass a Linear's forward."""
    kept = {}  # name -> why it stays torch.nn.Linear
    bypass = [n for n, m in named if isinstance(m, torch.nn.MultiheadAttention)]
    for n in bypass:
        _warn(f"'{n}' is a torch.nn.MultiheadAttention: F.multi_head_attention_forward reads its "
              "in_proj_weight and out_proj.weight directly, never calling out_proj's forward, so it is "
              "left as it is and runs in FP32; build attention from nn.Linear q/k/v/o projections to run "
              "it in FP4")
    for n, m in named:
        if isinstance(m, torch.nn.TransformerEncoderLayer):
            _warn(f"'{n}' is a torch.nn.TransformerEncoderLayer: in eval mode without gradients its fast "
                  "path (torch._transformer_encoder_layer_fwd) reads linear1.weight and linear2.weight "
                  "directly, so those forwards run them in FP32; training forwards run them in FP4")
    cands = []
    for n, m in named:
        if isinstance(m, Linear):
            raise ValueError(f"convert: the model already holds a fp4train Linear at '{n}' (convert a "
                             "model of torch.nn.Linear once)")
        if not isinstance(m, torch.nn.Linear):
            continue
        if any(n.startswith(b + ".") for b in bypass):
            kept[n] = "inside a MultiheadAttention"
        elif type(m) is not torch.nn.Linear:
            kept[n] = f"a subclass of nn.Linear ({type(m).__name__})"
            _warn(f"'{n}' is a {type(m).__name__}, a subclass of torch.nn.Linear whose forward or use "
                  "may differ: left as it is (FP32)")
        else:
            cands.append((n, m))
    for pat in ((exclude,) if isinstance(exclude, str) else exclude):
        hit = [n for n, _ in cands if fnmatch.fnmatchcase(n, pat)]
        if not hit:
            raise ValueError(f"convert: exclude pattern '{pat}' matches no nn.Linear of the model")
        for n in hit:
            kept[n] = f"excluded ('{pat}')"
    return [(n, m) for n, m in cands if n not in kept], kept


def _swap(model, todo, sites, plans, recipe, steps):
    """Replace each (name, nn.Linear) of `todo` by a Linear with its site and plan, layer index
    i, and the old module's Parameters, wherever the model holds it; {id(old): new}."""
    new = {}
    with torch.random.fork_rng(devices=[]):  # the new modules' own init must not move the RNG
        for i, ((n, m), (b, kind), plan) in enumerate(zip(todo, sites, plans)):
            lin = Linear(m.in_features, m.out_features, recipe, layer=i, steps=steps,
                         bias=m.bias is not None, plan=plan)
            lin.weight = m.weight  # the same Parameter objects (an optimizer holds them)
            if m.bias is not None:
                lin.bias = m.bias
            lin.name, lin.block, lin.kind = n, b, kind
            lin.train(m.training)
            new[id(m)] = lin
    for parent in model.modules():
        for cname, child in list(parent._modules.items()):
            if child is not None and id(child) in new:
                setattr(parent, cname, new[id(child)])
    return new


def _attach_optimizer(optimizer, steps):
    """After every optimizer.step(): steps.after_optimizer_step() (a step post-hook where the
    Optimizer has one, torch >= 2.0; else optimizer.step wrapped as a bound method, which the LR
    schedulers of torch 1.13 can wrap again)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"convert: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if hasattr(optimizer, "register_step_post_hook"):
        optimizer.register_step_post_hook(lambda opt, args, kwargs: steps.after_optimizer_step())
        return
    inner = optimizer.step

    def step(self, *args, **kwargs):
        out = inner(*args, **kwargs)
        steps.after_optimizer_step()
        return out

    optimizer.step = types.MethodType(step, optimizer)


def _first_forward_check(model, converted):
    """Warn, after the model's first forward in each mode (model.training x grad enabled), for
    each converted Linear whose forward did not run then: its parent may read its weight
    directly, as MultiheadAttention does with out_proj, or TransformerEncoderLayer's fast path
    with linear1 and linear2 in eval mode without gradients."""
    checked, active, handles = set(), [], []

    def mode():
        return (model.training, torch.is_grad_enabled())

    def pre(module, args):
        if mode() in checked or active:
            return
        active.append(mode())
        for _, lin in converted:
            lin._calls = 0

    def post(module, args, out):
        if not active or active[0] != mode():
            return
        active.clear()
        checked.add(mode())
        how = (f"in {'training' if model.training else 'eval'} mode "
               f"{'with' if torch.is_grad_enabled() else 'without'} gradients")
        for name, lin in converted:
            if lin._calls == 0:
                parent = name.rpartition(".")[0]
                ptype = type(model.get_submodule(parent)).__name__ if parent else type(model).__name__
                warnings.warn(f"fp4train.torch.convert: '{name}' (fp4train Linear) did not run its forward "
                              f"during the model's first forward {how}: if its parent '{parent}' ({ptype}) "
                              f"reads its weight directly (as torch.nn.MultiheadAttention reads "
                              f"out_proj.weight), that product runs in FP32, not FP4 ({_DOC})",
                              ConvertWarning, stacklevel=2)
        if len(checked) == 4:
            for h in handles:
                h.remove()

    handles += [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]


def convert(model, recipe="ue5m3-b16", *, steps=None, optimizer=None, blocks=None, kinds=None,
            exclude=(), verbose=False):
    """Swap every torch.nn.Linear of `model` (recursively) inside its blocks for
    fp4train.torch.Linear, in place; returns `model` (the same object).

    model: a torch.nn.Module (CPU, float32 linears; not an nn.Linear itself).
    recipe: a recipe name, a path or a fp4train.Recipe; its [high_precision] blocks and
      [[override]] tables apply by position (below), resolved by the C++ rules.
    steps: the StepContext of the converted layers (a new StepContext() if None; each converted
      Linear's ``.steps``).
    optimizer: a torch.optim.Optimizer; after each of its ``step()`` calls the StepContext
      advances if a layer ran a training forward at the current step. Without it, advance
      ``steps`` yourself: a second training forward at the same step raises RuntimeError
      (StepContext ``repeat``).
    blocks: which modules are the recipe's blocks 0..n-1: None (the children of the first
      torch.nn.ModuleList, in named_modules() order, that holds an nn.Linear), a module name
      (its children), or a list of module names (block i = blocks[i]). A linear belongs to the
      block whose subtree holds it; linears outside every block stay torch.nn.Linear (FP32, as
      fp4train keeps its LM head and embeddings).
    kinds: {fnmatch pattern on the module name: linear kind} (q_proj .. down_proj, in_proj,
      out_proj, or an alias such as 'mlp.down'); the first matching pattern wins. Unmatched
      linears take the kind their name ends with ('...mlp.down_proj' -> down_proj), else none
      (no [[override]] selects them).
    exclude: fnmatch patterns of module names kept as torch.nn.Linear.
    verbose: print one line per nn.Linear: its block, kind and mode, or why it was kept.

    Each new Linear gets layer index i (the SR keys) in named_modules() order, takes over the
    old module's weight and bias Parameters (the same objects, so an optimizer built before
    convert still updates them), and its bias (True where the old one had one) is added in FP32.
    nn.Linear subclasses are not converted, and torch.nn.MultiheadAttention (which reads
    out_proj.weight directly) is left whole; each is named in a ConvertWarning, as is every
    TransformerEncoderLayer (its eval fast path reads linear1/linear2 weights). After the model's
    first forward in each mode (train/eval x with/without gradients), a converted Linear whose
    forward did not run is named in a ConvertWarning.
    Raises TypeError for a non-float32 or non-CPU linear (naming it) or bad argument types,
    ValueError for a blocks / exclude / kinds entry that names or matches no module, an unknown
    kind, a model with no blocks or already holding fp4train Linears, fp4train.UserError for a
    recipe rule that does not fit the blocks. docs/python.md "Converting a PyTorch model: convert".
    """
    if not isinstance(model, torch.nn.Module) or isinstance(model, (torch.nn.Linear, Linear)):
        raise TypeError("convert: model must be a torch.nn.Module holding nn.Linear modules, got "
                        f"{type(model).__name__} (for one layer use fp4train.torch.Linear)")
    recipe = recipe if isinstance(recipe, Recipe) else Recipe.load(str(recipe))
    steps = steps if steps is not None else StepContext()
    if not isinstance(steps, StepContext):
        raise TypeError(f"convert: steps must be a fp4train.torch.StepContext, got {type(steps).__name__}")
    kinds = dict(kinds or {})
    for pat, kind in kinds.items():
        if not isinstance(kind, str) or (kind and not _core.canonical_linear_kind(kind)):
            raise ValueError(f"convert: kinds['{pat}']: unknown linear kind {kind!r} (valid kinds: "
                             f"{', '.join(_core.linear_kinds())}, or '' for none)")
    named = list(model.named_modules())
    cands, kept = _candidates(named, exclude)
    roots = _block_roots(model, blocks, [n for n, _ in cands])
    sites, todo, used = [], [], set()
    for n, m in cands:
        b = _block_of(n, roots)
        if b is None:
            kept[n] = "outside the blocks"
            continue
        for what, t in (("weight", m.weight), ("bias", m.bias)):
            if t is not None and (t.dtype != torch.float32 or t.device.type != "cpu"):
                raise TypeError(f"convert: '{n}'.{what} is {t.dtype} on {t.device}; fp4train's Linear "
                                "takes float32 CPU tensors (call model.float() first: fp4train does "
                                "not round silently)")
        sites.append((b, _kind_of(n, kinds, used)))
        todo.append((n, m))
    for pat in kinds:
        if pat not in used:
            raise ValueError(f"convert: kinds pattern '{pat}' matches no converted nn.Linear")
    if not todo:
        raise ValueError(f"convert: no nn.Linear inside the blocks {roots[:3]}{'...' if len(roots) > 3 else ''}")
    plans, _ = _core.resolve_linear_plans(recipe, sites, len(roots))
    new = _swap(model, todo, sites, plans, recipe, steps)
    if optimizer is not None:
        _attach_optimizer(optimizer, steps)
    converted = [(n, new[id(m)]) for n, m in todo]
    _first_forward_check(model, converted)
    if verbose:
        for n, m in named:
            if n in kept:
                print(f"{n}: kept torch.nn.Linear ({kept[n]})")
            elif isinstance(m, torch.nn.Linear) and id(m) in new:
                lin = new[id(m)]
                print(f"{n}: block {lin.block}, kind {lin.kind or '-'}, {lin.mode}, layer {lin.layer}")
    return model
