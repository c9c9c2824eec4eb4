"""fp4train's model in plain PyTorch: an independent implementation for checking it.

The Llama-style decoder and the Nemotron-H hybrid of fp4train (``include/fp4/nn/model.h``,
docs/models.md "Models: Llama-style and the Nemotron-H hybrid") written with torch's own
operators only (``torch.nn.functional``, matmul, a Python loop for the Mamba-2 recurrence),
never fp4train's kernels, in float32 or float64 on the CPU. It loads the Hugging Face style
directory of ``fp4train export`` (``model.safetensors`` + ``config.json``, docs/export.md)
with the HF parameter names, or a fp4train checkpoint directly (:func:`from_checkpoint`,
parameters found by name from the checkpoint's config).

Pure Python (torch, numpy and the standard library); it does not need the compiled
``fp4train._core`` extension. Every block computes ``x + mixer(RMSNorm(x))``:

* RMSNorm: ``x * rsqrt(mean(x^2) + eps) * weight`` (eps = config ``rms_norm_eps`` /
  ``layer_norm_epsilon``);
* attention (``*``): causal grouped-query attention, query head h reading key/value head
  ``h // (H / Hkv)``, softmax(q k^T / sqrt(hd)) v, no biases; RoPE (when on) in HF's
  rotate-half form on the exported (row-permuted) q/k weights, angle ``t * theta^(-2i/hd)``
  and cos/sin computed in float64 and rounded to the model dtype, as fp4train does;
* MLP (``-``): ``down(relu(up(x))^2)`` or SwiGLU ``down(silu(gate(x)) * up(x))``;
* Mamba-2 (``M``, HF ``NemotronHMamba2Mixer`` / mamba_ssm ``Mamba2``): ``in_proj`` split into
  z | xBC | dt, causal depthwise conv1d + SiLU on xBC, split into x | B | C, Δ =
  softplus(dt + dt_bias), A = −exp(A_log), the plain sequential recurrence
  ``S_t = exp(Δ_t A) S_{t−1} + Δ_t x_t B_t^T``, ``y_t = S_t C_t + D x_t`` (no chunking), the
  gated RMSNorm ``RMSNorm_group(y * silu(z)) * weight`` per group of d_inner / G channels,
  then ``out_proj``;
* final RMSNorm, untied LM head, mean cross-entropy.

:class:`RoundingBound` turns a float64 forward into a first-order bound on how far any FP32
evaluation of the same model may land from the exact NLL (see its docstring); the tests use it
as the tolerance of the fp4train-vs-PyTorch comparison.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "read_safetensors",
    "write_safetensors",
    "FP4TrainLM",
    "from_pretrained",
    "from_checkpoint",
    "fp4train_parameter_table",
    "hf_state_dict_from_flat",
    "RoundingBound",
    "mean_nll",
]

_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64,
           "U8": np.uint8, "U16": np.uint16, "I16": np.int16, "F16": np.float16}


def read_safetensors(path):
    """Read a safetensors file (8-byte little-endian header length N, N bytes of JSON, the raw
    little-endian tensors). Returns ``(tensors, metadata)``: a dict name -> numpy array (a copy,
    in the file's dtype and shape) and the ``__metadata__`` dict (``{}`` when absent). Raises
    ``ValueError`` naming the file on a truncated file, a bad header or an unknown dtype."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} exceeds the file")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: bad safetensors header: {e}") from None
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        dt = _DTYPES.get(info.get("dtype"))
        if dt is None:
            raise ValueError(f"{path}: tensor {name} has unknown dtype {info.get('dtype')}")
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= b <= e <= len(data) or (e - b) != int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize:
            raise ValueError(f"{path}: tensor {name}: data_offsets {b}..{e} do not fit its shape "
                             f"{list(shape)} or the file (truncated?)")
        out[name] = np.frombuffer(data[b:e], dtype=np.dtype(dt).newbyteorder("<")).astype(dt).reshape(shape)
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """Write ``tensors`` (dict name -> numpy array or torch tensor; float32, float64, int32,
    int64, uint8, ...) to ``path`` as safetensors, in the dict's order, with ``metadata`` (a dict
    of strings) in ``__metadata__``. The header is padded with spaces to a multiple of 8."""
    rev = {np.dtype(v): k for k, v in _DTYPES.items()}
    header, chunks, off = {}, [], 0
    for name, t in tensors.items():
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        a = np.ascontiguousarray(a)
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": rev[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


# ----------------------------------------------------------------------------- rounding bound

U32 = 2.0 ** -24  # unit roundoff of FP32 (round to nearest)


def gamma(n, u=U32):
    """Higham's gamma_n = n·u / (1 − n·u): the relative error bound of an n-term sum or dot
    product in floating point of unit roundoff u, in any order (with or without FMA)."""
    nu = n * u
    if nu >= 1:
        raise ValueError(f"gamma({n}) undefined: n·u >= 1")
    return nu / (1 - nu)


class RoundingBound:
    """First-order bound on the FP32 rounding error of the NLL (Higham, *Accuracy and Stability
    of Numerical Algorithms*, 2nd ed., §3.1 and §3.5).

    Write the FP32 evaluation as the exact computation in which every operation's output v is
    replaced by v + δ_v, where δ_v is the operation's *local* error (its inputs exact). To first
    order the loss then moves by Σ_v ∂L/∂v · δ_v, so

        |L_fp32 − L_exact| ≤ B = Σ_v Σ_elements |∂L/∂v| · e_v   (+ O(u²)),

    where e_v bounds |δ_v| elementwise. The model, run in float64 (whose own error is ~1e-16,
    negligible), calls :meth:`add` for every operation with its output (in the autograd graph)
    and e_v; :meth:`total` takes ∂L/∂v by autograd and sums. The local bounds, with
    u = 2^−24 and γ_n = n·u/(1 − n·u) (any summation order, with or without FMA):

    * a dot product of n terms (linears: n = K; P·V: n = T): γ_n · Σ|terms|, i.e.
      γ_K · (|X| @ |W|ᵀ); attention scores (q·k)·(1/sqrt(hd)), the scale rounded too:
      γ_{hd+2} · Σ|q||k| / sqrt(hd);
    * RMSNorm out = x·r·w, r = 1/sqrt(Σx²/C + eps): Σx² from C squares, γ_{C+1}; /C, +eps,
      sqrt, 1/·, the rounding of r: ≤ 5u relative on r after the sqrt halves the sum's error;
      two products 2u: e = (γ_{C+1}/2 + 7u)·|out|;
    * RoPE a·c − b·s (c, s the rounded cos, sin: u each; two products, one sum):
      e = 4u·(|a·c| + |b·s|);
    * softmax p_j = exp(s_j − m)/Σ_k exp(s_k − m): the subtraction u·|s_j − m| (absolute, in
      the exponent), exp ≤ 2 ulp (fp4train's exp_ref asserts 2; torch's is ≤ 1), the T-term sum
      γ_T, the reciprocal and the product 2u: e = p_j·(u·|s_j − m| + 2u + γ_T + 2u);
    * elementwise: squared ReLU u·|out|; SiLU / SwiGLU / σ (exp 2u, 1 + e, 1/·, two products)
      6u·|out|; residual add u·|out|; softplus (the add, exp, log1p) 4u·|out|; exp(A_log) 2u;
    * cross-entropy of a row, loss = m + log Σ_v exp(z_v − m) − z_t (sum in FP32, the rest in
      double in fp4train): Σ_v p_v·(u·|z_v − m| + 2u) + γ_V;
    * Mamba-2 conv (W taps + bias): γ_{W+1}·(|b| + Σ|w||x|); the SSD output y_t = Σ_{s≤t} Σ_n
      C_tn B_sn Δ_s x_s·exp(Σ_{r=s+1..t} Δ_r A) + D x_t. Each term passes at most N + T + ⌈T/Q⌉
      additions (the N-term contraction, the sum over s, the chunk-state hand-overs) and ≤ 8
      products, < N + 2T + 16 operations: γ_{N+2T+16} relative; its decay exponent is a sum of at
      most T products Δ_r A, each rounded (u) and, in the chunked algorithm, summed in FP32
      (γ_T): an absolute exponent error ≤ (γ_T + 2u)·Σ_r|Δ_r A| (plus exp's 2u, inside the 16).
      So e = (γ_{N+2T+16} + (γ_T + 2u)·max_{b,h} Σ_t|Δ_t A|)·y_abs + u·|D x|, y_abs the
      recurrence on absolute values (S_abs = e^{ΔA} S_abs + Δ|x||B|ᵀ, y_abs = S_abs|C|); this
      covers both the sequential and fp4train's chunked evaluation.

    Two FP32 implementations (fp4train and PyTorch float32) each lie within B of the exact loss,
    so they differ by at most 2B; fp4train and the float64 PyTorch model by at most B. The
    bound is first order (terms of size u²·Σ are dropped: ~1e-13 relative here)."""

    def __init__(self):
        self.outs, self.errs = [], []
        self.direct = 0.0  # local errors of the loss itself (cross-entropy rows), already in nats

    def add(self, v, e):
        self.outs.append(v)
        self.errs.append(e.detach())

    def total(self, loss):
        gs = torch.autograd.grad(loss, self.outs, retain_graph=True, allow_unused=True)
        b = self.direct
        for g, e in zip(gs, self.errs):
            if g is not None:
                b += float((g.abs() * e).sum())
        return b


# ----------------------------------------------------------------------------- the model

def _rms_norm(x, w, eps, bound=None):
    C = x.shape[-1]
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    out = x * r * w
    if bound is not None:
        bound.add(out, (gamma(C + 1) / 2 + 7 * U32) * out.abs())
    return out


def _linear(x, w, bound=None):
    y = torch.matmul(x, w.t())
    if bound is not None:
        bound.add(y, gamma(w.shape[1]) * torch.matmul(x.abs(), w.abs().t()))
    return y


def _rope_tables(T, hd, theta, dtype):
    # fp4train: inv_freq = theta^(−2i/hd) and angle t·inv_freq in double, cos/sin rounded.
    i = torch.arange(hd // 2, dtype=torch.float64)
    inv = torch.pow(torch.tensor(float(theta), dtype=torch.float64), -2.0 * i / hd)
    a = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(a).to(torch.float32), torch.sin(a).to(torch.float32)
    cos = torch.cat([cos, cos], -1).to(dtype)  # [T, hd], HF rotate-half layout
    sin = torch.cat([sin, sin], -1).to(dtype)
    return cos, sin


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def _rope(x, cos, sin, bound=None):
    # x [B, H, T, hd]: out = x·cos + rotate_half(x)·sin (HF apply_rotary_pos_emb).
    rx = _rotate_half(x)
    out = x * cos + rx * sin
    if bound is not None:
        bound.add(out, 4 * U32 * ((x * cos).abs() + (rx * sin).abs()))
    return out


class FP4TrainLM(torch.nn.Module):
    """fp4train's decoder (Llama layout or Nemotron-H layout) built from an exported
    ``config.json`` (a dict), with parameters named as in the export's ``model.safetensors``
    (``state_dict()`` keys are the HF names). Parameters are zero until loaded
    (:func:`from_pretrained`, :func:`from_checkpoint`, or ``load_state_dict``).

    ``forward(tokens)``: tokens LongTensor [B, T] (ids < vocab_size, T ≤ max_position_embeddings
    for RoPE tables of any length) -> logits [B, T, vocab] in the model's dtype. Raises
    ``ValueError`` on a config this implementation does not know."""

    def __init__(self, config, dtype=torch.float32):
        super().__init__()
        self.config = config
        ft = config.get("fp4train", {})
        self.layout = ft.get("layout", "llama" if config.get("model_type") == "llama" else "nemotron_h")
        if self.layout not in ("llama", "nemotron_h"):
            raise ValueError(f"unknown layout {self.layout!r}")
        self.pattern = ft.get("pattern") or config.get("hybrid_override_pattern") or \
            "*-" * int(config["num_hidden_layers"])
        self.V, self.d = int(config["vocab_size"]), int(config["hidden_size"])
        self.H = int(config["num_attention_heads"])
        self.Hkv = int(config.get("num_key_value_heads") or self.H)
        self.hd = int(config.get("head_dim") or config.get("attention_head_dim") or self.d // self.H)
        self.F_ = int(config["intermediate_size"])
        self.eps = float(config.get("rms_norm_eps", config.get("layer_norm_epsilon", 1e-5)))
        self.gated = bool(ft.get("mlp_gated", config.get("hidden_act") == "silu"))
        self.rope = bool(ft.get("rope", self.layout == "llama"))
        self.theta = float(ft.get("rope_theta", config.get("rope_theta", 10000.0)))
        if self.rope and ft.get("rope_pairs", "halves") != "halves":
            raise ValueError("only the rotate-half RoPE layout of fp4train export is supported")
        if self.layout == "llama" and self.pattern != "*-" * (len(self.pattern) // 2):
            raise ValueError(f"llama layout needs the pattern '*-' repeated, got {self.pattern!r}")
        if self.layout != "llama" and "M" in self.pattern:
            self.mH = int(config["mamba_num_heads"])
            self.mP = int(config["mamba_head_dim"])
            self.mG = int(config["n_groups"])
            self.mN = int(config["ssm_state_size"])
            self.mW = int(config["conv_kernel"])
            self.di = self.mH * self.mP
            self.mC = self.di + 2 * self.mG * self.mN
        self.dtype = dtype
        P = lambda *s: torch.nn.Parameter(torch.zeros(*s, dtype=dtype))  # noqa: E731

        def attn_params():
            m = torch.nn.Module()
            m.q_proj = torch.nn.Module(); m.q_proj.weight = P(self.H * self.hd, self.d)
            m.k_proj = torch.nn.Module(); m.k_proj.weight = P(self.Hkv * self.hd, self.d)
            m.v_proj = torch.nn.Module(); m.v_proj.weight = P(self.Hkv * self.hd, self.d)
            m.o_proj = torch.nn.Module(); m.o_proj.weight = P(self.d, self.H * self.hd)
            return m

        def mlp_params():
            m = torch.nn.Module()
            if self.gated:
                m.gate_proj = torch.nn.Module(); m.gate_proj.weight = P(self.F_, self.d)
            m.up_proj = torch.nn.Module(); m.up_proj.weight = P(self.F_, self.d)
            m.down_proj = torch.nn.Module(); m.down_proj.weight = P(self.d, self.F_)
            return m

        def mamba_params():
            m = torch.nn.Module()
            m.in_proj = torch.nn.Module(); m.in_proj.weight = P(2 * self.di + 2 * self.mG * self.mN + self.mH, self.d)
            m.conv1d = torch.nn.Module(); m.conv1d.weight = P(self.mC, 1, self.mW); m.conv1d.bias = P(self.mC)
            m.dt_bias = P(self.mH)
            m.A_log = P(self.mH)
            m.D = P(self.mH)
            m.norm = torch.nn.Module(); m.norm.weight = P(self.di)
            m.out_proj = torch.nn.Module(); m.out_proj.weight = P(self.d, self.di)
            return m

        if self.layout == "llama":
            self.model = torch.nn.Module()
            self.model.embed_tokens = torch.nn.Module(); self.model.embed_tokens.weight = P(self.V, self.d)
            layers = []
            for _ in range(len(self.pattern) // 2):
                lay = torch.nn.Module()
                lay.self_attn = attn_params()
                lay.mlp = mlp_params()
                lay.input_layernorm = torch.nn.Module(); lay.input_layernorm.weight = P(self.d)
                lay.post_attention_layernorm = torch.nn.Module(); lay.post_attention_layernorm.weight = P(self.d)
                layers.append(lay)
            self.model.layers = torch.nn.ModuleList(layers)
            self.model.norm = torch.nn.Module(); self.model.norm.weight = P(self.d)
        else:
            self.backbone = torch.nn.Module()
            self.backbone.embeddings = torch.nn.Module(); self.backbone.embeddings.weight = P(self.V, self.d)
            layers = []
            for ch in self.pattern:
                lay = torch.nn.Module()
                lay.norm = torch.nn.Module(); lay.norm.weight = P(self.d)
                if ch == "*":
                    lay.mixer = attn_params()
                elif ch == "-":
                    lay.mixer = mlp_params()
                elif ch == "M":
                    lay.mixer = mamba_params()
                else:
                    raise ValueError(f"unknown block {ch!r} in pattern {self.pattern!r}")
                layers.append(lay)
            self.backbone.layers = torch.nn.ModuleList(layers)
            self.backbone.norm_f = torch.nn.Module(); self.backbone.norm_f.weight = P(self.d)
        self.lm_head = torch.nn.Module(); self.lm_head.weight = P(self.V, self.d)

    # The (norm weight, mixer module, kind) of every block, in pattern order.
    def _blocks(self):
        if self.layout == "llama":
            for lay in self.model.layers:
                yield lay.input_layernorm.weight, lay.self_attn, "*"
                yield lay.post_attention_layernorm.weight, lay.mlp, "-"
        else:
            for ch, lay in zip(self.pattern, self.backbone.layers):
                yield lay.norm.weight, lay.mixer, ch

    def _attention(self, m, x, bound):
        B, T, _ = x.shape
        H, Hkv, hd = self.H, self.Hkv, self.hd
        q = _linear(x, m.q_proj.weight, bound).view(B, T, H, hd).transpose(1, 2)
        k = _linear(x, m.k_proj.weight, bound).view(B, T, Hkv, hd).transpose(1, 2)
        v = _linear(x, m.v_proj.weight, bound).view(B, T, Hkv, hd).transpose(1, 2)
        if self.rope:
            cos, sin = _rope_tables(T, hd, self.theta, x.dtype)
            q, k = _rope(q, cos, sin, bound), _rope(k, cos, sin, bound)
        rep = H // Hkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scale = 1.0 / math.sqrt(hd)
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        if bound is not None:
            bound.add(s, gamma(hd + 2) * torch.matmul(q.abs(), k.abs().transpose(-1, -2)) * scale * mask)
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        if bound is not None:
            m_ = s.max(-1, keepdim=True).values.detach()
            arg = (s.detach() - m_).masked_fill(~mask, 0.0).abs()
            bound.add(p, p.detach() * (U32 * arg + 4 * U32 + gamma(T)))
        y = torch.matmul(p, v)
        if bound is not None:
            bound.add(y, gamma(T) * torch.matmul(p.abs(), v.abs()))
        y = y.transpose(1, 2).reshape(B, T, H * hd)
        return _linear(y, m.o_proj.weight, bound)

    def _mlp(self, m, x, bound):
        if self.gated:
            g = _linear(x, m.gate_proj.weight, bound)
            u = _linear(x, m.up_proj.weight, bound)
            a = F.silu(g) * u
            if bound is not None:
                bound.add(a, 6 * U32 * a.abs())
        else:
            h = _linear(x, m.up_proj.weight, bound)
            a = torch.relu(h).square()
            if bound is not None:
                bound.add(a, U32 * a.abs())
        return _linear(a, m.down_proj.weight, bound)

    def _mamba(self, m, x, bound):
        B, T, _ = x.shape
        H, P_, G, N, W, di, Cc = self.mH, self.mP, self.mG, self.mN, self.mW, self.di, self.mC
        zx = _linear(x, m.in_proj.weight, bound)
        z, xbc, dt = zx[..., :di], zx[..., di:di + Cc], zx[..., di + Cc:]
        # Causal depthwise conv1d (zero padding on the left), then SiLU.
        pre = F.conv1d(xbc.transpose(1, 2), m.conv1d.weight, m.conv1d.bias, padding=W - 1, groups=Cc)[..., :T]
        pre = pre.transpose(1, 2)
        if bound is not None:
            absconv = F.conv1d(xbc.abs().transpose(1, 2), m.conv1d.weight.abs(), m.conv1d.bias.abs(),
                               padding=W - 1, groups=Cc)[..., :T].transpose(1, 2)
            bound.add(pre, gamma(W + 1) * absconv)
        xc = F.silu(pre)
        if bound is not None:
            bound.add(xc, 6 * U32 * xc.abs())
        xs = xc[..., :di].reshape(B, T, H, P_)
        Bm = xc[..., di:di + G * N].reshape(B, T, G, N).repeat_interleave(H // G, dim=2)
        Cm = xc[..., di + G * N:].reshape(B, T, G, N).repeat_interleave(H // G, dim=2)
        dtb = dt + m.dt_bias
        if bound is not None:
            bound.add(dtb, U32 * dtb.abs())
        delta = F.softplus(dtb)  # threshold 20, as fp4train: u > 20 ? u : log1p(exp(u))
        if bound is not None:
            bound.add(delta, 4 * U32 * delta.abs())
        A = -torch.exp(m.A_log)
        if bound is not None:
            bound.add(A, 2 * U32 * A.abs())
        S = torch.zeros(B, H, P_, N, dtype=x.dtype)
        S_abs = torch.zeros(B, H, P_, N, dtype=x.dtype) if bound is not None else None
        ys, yabs = [], []
        for t in range(T):
            dA = torch.exp(delta[:, t] * A)  # [B, H]
            upd = (delta[:, t, :, None, None] * xs[:, t, :, :, None]) * Bm[:, t, :, None, :]
            S = dA[..., None, None] * S + upd
            ys.append(torch.matmul(S, Cm[:, t, :, :, None])[..., 0])  # [B, H, P]
            if bound is not None:
                S_abs = dA.detach()[..., None, None] * S_abs + upd.detach().abs()
                yabs.append(torch.matmul(S_abs, Cm[:, t, :, :, None].detach().abs())[..., 0])
        ysd = torch.stack(ys, 1)  # [B, T, H, P]
        Dx = m.D[:, None] * xs
        y = (ysd + Dx).reshape(B, T, di)
        if bound is not None:
            decay = (delta.detach() * A.detach()).abs().sum(1).max()  # max over (b, h) of Σ_t |Δ A|
            kappa = gamma(N + 2 * T + 16) + (gamma(T) + 2 * U32) * float(decay)
            e = kappa * torch.stack(yabs, 1) + U32 * Dx.detach().abs()
            bound.add(y, e.reshape(B, T, di))
        g = y * F.silu(z)
        if bound is not None:
            bound.add(g, 6 * U32 * g.abs())
        gs = di // G
        gg = g.reshape(B, T, G, gs)
        yn = (gg * torch.rsqrt(gg.pow(2).mean(-1, keepdim=True) + self.eps)).reshape(B, T, di) * m.norm.weight
        if bound is not None:
            bound.add(yn, (gamma(gs + 1) / 2 + 7 * U32) * yn.abs())
        return _linear(yn, m.out_proj.weight, bound)

    def forward(self, tokens, bound=None):
        """Logits [B, T, vocab] of tokens [B, T] (LongTensor). ``bound``: a
        :class:`RoundingBound` collecting every operation's local FP32 error (float64 model)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens.shape)}")
        emb = self.model.embed_tokens.weight if self.layout == "llama" else self.backbone.embeddings.weight
        x = F.embedding(tokens, emb)
        for w, m, kind in self._blocks():
            h = _rms_norm(x, w, self.eps, bound)
            if kind == "*":
                y = self._attention(m, h, bound)
            elif kind == "-":
                y = self._mlp(m, h, bound)
            else:
                y = self._mamba(m, h, bound)
            x = x + y
            if bound is not None:
                bound.add(x, U32 * x.abs())
        nf = self.model.norm.weight if self.layout == "llama" else self.backbone.norm_f.weight
        h = _rms_norm(x, nf, self.eps, bound)
        return _linear(h, self.lm_head.weight, bound)


def mean_nll(model, inputs, targets, bound=None):
    """Mean cross-entropy (nats/token) of ``model`` on inputs, targets LongTensor [B, T], as a
    0-d tensor in the model's dtype. With ``bound`` (float64 model) the cross-entropy rows'
    own local errors are added to ``bound.direct`` (see :class:`RoundingBound`)."""
    logits = model(inputs, bound)
    V = logits.shape[-1]
    z = logits.reshape(-1, V)
    loss = F.cross_entropy(z, targets.reshape(-1))
    if bound is not None:
        zd = z.detach()
        mx = zd.max(-1, keepdim=True).values
        p = torch.softmax(zd, -1)
        row = (p * (U32 * (zd - mx).abs() + 2 * U32)).sum(-1) + gamma(V)
        bound.direct += float(row.mean())
    return loss


# ----------------------------------------------------------------------------- loading

def from_pretrained(directory, dtype=torch.float32):
    """The model of a ``fp4train export`` directory: ``config.json`` and ``model.safetensors``
    (F32 tensors under HF names), loaded with ``load_state_dict(strict=True)`` (so a missing or
    extra tensor raises ``RuntimeError`` naming it) and converted to ``dtype``. Raises
    ``FileNotFoundError`` naming a missing file."""
    for f in ("config.json", "model.safetensors"):
        if not os.path.exists(os.path.join(directory, f)):
            raise FileNotFoundError(f"{os.path.join(directory, f)} does not exist (not a fp4train export directory?)")
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    tensors, _ = read_safetensors(os.path.join(directory, "model.safetensors"))
    model = FP4TrainLM(config, dtype)
    model.load_state_dict({k: torch.from_numpy(v.copy()).to(dtype) for k, v in tensors.items()}, strict=True)
    return model


def fp4train_parameter_table(cfg):
    """fp4train's parameter buffer layout (``Model`` in src/nn/model.cpp) re-derived from a run
    config (the dict of its TOML): a list of (name, rows, cols) in buffer order: embeddings
    [V, d]; per block N: layers.N.norm [1, d], the mixer's parameters (Mamba-2: conv1d [C', W],
    conv1d_bias, dt_bias, A_log, D, norm), its linears' weights [out, in]; norm_f; lm_head."""
    m = cfg["model"]
    V, d = m.get("vocab_size", 4096), m.get("d_model", 256)
    pattern = m.get("pattern") or "*-" * m.get("n_layers", 4)
    H = m.get("n_heads", 4)
    Hkv = m.get("n_kv_heads", 0) or H
    hd = m.get("head_dim", 0) or d // H
    F_ = m.get("mlp_hidden", 1024)
    U = 2 * F_ if m.get("mlp", "squared_relu") == "swiglu" else F_
    mH, mP = m.get("mamba_num_heads", 0), m.get("mamba_head_dim", 64)
    mG, mN, mW = m.get("mamba_n_groups", 1), m.get("mamba_state_size", 64), m.get("mamba_conv_kernel", 4)
    di = mH * mP
    Cc = di + 2 * mG * mN
    t = [("embeddings", V, d)]
    for L, ch in enumerate(pattern):
        p = f"layers.{L}."
        t.append((p + "norm", 1, d))
        if ch == "*":
            t += [(p + "mixer.q_proj", H * hd, d), (p + "mixer.k_proj", Hkv * hd, d),
                  (p + "mixer.v_proj", Hkv * hd, d), (p + "mixer.o_proj", d, H * hd)]
        elif ch == "-":
            t += [(p + "mixer.up_proj", U, d), (p + "mixer.down_proj", d, F_)]
        elif ch == "M":
            t += [(p + "mixer.conv1d", Cc, mW), (p + "mixer.conv1d_bias", 1, Cc), (p + "mixer.dt_bias", 1, mH),
                  (p + "mixer.A_log", 1, mH), (p + "mixer.D", 1, mH), (p + "mixer.norm", 1, di),
                  (p + "mixer.in_proj", 2 * di + 2 * mG * mN + mH, d), (p + "mixer.out_proj", d, di)]
        else:
            raise ValueError(f"unknown block {ch!r} in pattern {pattern!r}")
    t += [("norm_f", 1, d), ("lm_head", V, d)]
    return t


def hf_state_dict_from_flat(cfg, flat):
    """HF-named numpy arrays of a fp4train parameter (or gradient) buffer ``flat`` (float32,
    [num_params]) of run config ``cfg`` (dict): the export's mapping (docs/export.md),
    implemented here independently of the C++ one, including the per-head RoPE row permutation
    of q_proj / k_proj (HF row j <- fp4train row 2j for j < hd/2, 2(j − hd/2) + 1 above)."""
    m = cfg["model"]
    pattern = m.get("pattern") or "*-" * m.get("n_layers", 4)
    llama = len(pattern) % 2 == 0 and pattern == "*-" * (len(pattern) // 2)
    rope = m.get("rope", True)
    swiglu = m.get("mlp", "squared_relu") == "swiglu"
    d, H = m.get("d_model", 256), m.get("n_heads", 4)
    hd = m.get("head_dim", 0) or d // H
    perm = np.array([2 * j if j < hd // 2 else 2 * (j - hd // 2) + 1 for j in range(hd)])
    out, off = {}, 0
    for name, r, c in fp4train_parameter_table(cfg):
        a = np.asarray(flat[off:off + r * c]).reshape(r, c)
        off += r * c
        if name == "embeddings":
            out["model.embed_tokens.weight" if llama else "backbone.embeddings.weight"] = a
            continue
        if name == "norm_f":
            out["model.norm.weight" if llama else "backbone.norm_f.weight"] = a.reshape(-1)
            continue
        if name == "lm_head":
            out["lm_head.weight"] = a
            continue
        _, L, rest = name.split(".", 2)
        L = int(L)
        kind = pattern[L]
        pre = f"model.layers.{L // 2}." if llama else f"backbone.layers.{L}."
        if rest == "norm":
            out[pre + ("input_layernorm.weight" if kind == "*" else "post_attention_layernorm.weight")
                if llama else pre + "norm.weight"] = a.reshape(-1)
            continue
        k = rest[len("mixer."):]
        mix = pre + (("self_attn." if kind == "*" else "mlp.") if llama else "mixer.")
        if k in ("q_proj", "k_proj") and rope:
            a = a.reshape(r // hd, hd, c)[:, perm, :].reshape(r, c)
        if k == "up_proj" and swiglu:
            out[mix + "gate_proj.weight"] = a[: r // 2]
            out[mix + "up_proj.weight"] = a[r // 2:]
        elif k == "conv1d":
            out[mix + "conv1d.weight"] = a.reshape(r, 1, c)
        elif k == "conv1d_bias":
            out[mix + "conv1d.bias"] = a.reshape(-1)
        elif k in ("dt_bias", "A_log", "D"):
            out[mix + k] = a.reshape(-1)
        elif k == "norm":
            out[mix + "norm.weight"] = a.reshape(-1)
        else:
            out[mix + k + ".weight"] = a
    if off != len(flat):
        raise ValueError(f"the config describes {off} parameters but the buffer holds {len(flat)}")
    return out


def from_checkpoint(path, dtype=torch.float32):
    """The model of a fp4train checkpoint file (``step_*.safetensors``): its config TOML (the
    ``config_toml`` metadata) gives the shapes, its ``params`` tensor the values, mapped to the HF
    names by :func:`hf_state_dict_from_flat` (independently of ``fp4train export``). The config
    dict is built as ``fp4train export`` would write it. Raises ``ValueError`` naming the file if
    it is not a fp4train checkpoint."""
    import tomllib
    tensors, meta = read_safetensors(path)
    if "params" not in tensors or "config_toml" not in meta:
        raise ValueError(f"{path}: not a fp4train checkpoint (no params tensor or config_toml metadata)")
    cfg = tomllib.loads(meta["config_toml"])
    sd = hf_state_dict_from_flat(cfg, tensors["params"])
    m = cfg["model"]
    pattern = m.get("pattern") or "*-" * m.get("n_layers", 4)
    llama = pattern == "*-" * (len(pattern) // 2)
    d, H = m.get("d_model", 256), m.get("n_heads", 4)
    conf = {
        "model_type": "llama" if llama else "nemotron_h",
        "vocab_size": m.get("vocab_size", 4096), "hidden_size": d,
        "num_hidden_layers": len(pattern) // 2 if llama else len(pattern),
        "num_attention_heads": H, "num_key_value_heads": m.get("n_kv_heads", 0) or H,
        "head_dim": m.get("head_dim", 0) or d // H, "intermediate_size": m.get("mlp_hidden", 1024),
        "rms_norm_eps": float(np.float32(m.get("norm_eps", 1e-5))),
        "mamba_num_heads": m.get("mamba_num_heads", 0), "mamba_head_dim": m.get("mamba_head_dim", 64),
        "n_groups": m.get("mamba_n_groups", 1), "ssm_state_size": m.get("mamba_state_size", 64),
        "conv_kernel": m.get("mamba_conv_kernel", 4),
        "fp4train": {"layout": "llama" if llama else "nemotron_h", "pattern": pattern,
                     "mlp_gated": m.get("mlp", "squared_relu") == "swiglu", "rope": m.get("rope", True),
                     "rope_theta": float(np.float32(m.get("rope_theta", 10000.0))), "rope_pairs": "halves"},
    }
    model = FP4TrainLM(conf, dtype)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in sd.items()},
                          strict=True)
    return model
