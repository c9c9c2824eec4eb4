#!/usr/bin/env python3
"""Compare your own FP4 quantizer's output with fp4train's, bit for bit.

A kernel writer (CUDA, Triton, a new CPU kernel) quantizes an input x [rows, cols] and gets
element codes, block-scale codes and dequantized values. This script quantizes the same x with
fp4train (the reference of docs/numerics.md) and reports every difference by class, the way a
bit-exactness test suite would:

  scale code    a block with a nonzero amax whose scale code differs: the scale arithmetic
                (tensor scale, multiplier order, scale rounding or saturation) differs
  zero block    an all-zero block whose scale code differs: harmless (every element is 0, so
                x_hat is the same whatever scale is stored; fp4train stores 1, a kernel that
                computes floor(log2 0) and clamps stores the smallest code)
  element code  an element code that differs (magnitude, or the sign of a nonzero value):
                the element rounding differs (ties, SR bits, saturation) or follows from a
                different scale
  sign of zero  codes or dequantized values that differ only in the sign of a zero (fp4train
                keeps -0 for negative inputs that round to 0, as E2M1 encoders do)
  value         dequantized values that differ by more than the sign of zero: the decode
                (q * c_b * gd, in that FP32 order, no FMA) differs

Usage as a library:

    import numpy as np, check_kernel
    report = check_kernel.check(x, codes=my_codes, scale_codes=my_scales, xhat=my_xhat,
                                scale_format="e4m3", reference=my_amax)   # quantize() options
    print(report)            # counts per class and the first differences of each
    assert report.ok

Any of codes / scale_codes / xhat may be None (not compared). codes: uint8 [rows, cols], one
code per byte (unpack_e2m1 turns two-per-byte packing, low nibble first, into that);
scale_codes: uint8 [block_rows, block_cols]; xhat: float32 [rows, cols]. The keyword options
are those of fp4train.quantize (element_format, scale_format, scale_rule, block, two_d, target,
reference, rounding, seed, sr_key).

From the shell:  python3 examples/check_kernel.py --demo      (plants one mismatch of each
class into fp4train's own output and reports them)
                 python3 examples/check_kernel.py FILE.npz [--scale-format e4m3 ...]
(FILE.npz holds x and any of codes, scale_codes, xhat).

Needs the fp4train Python package: PYTHONPATH=build/python (docs/python.md).
"""
import argparse
import sys

import numpy as np

import fp4train

CLASSES = ("scale code", "zero block", "element code", "sign of zero", "value")


def unpack_e2m1(packed, n):
    """Unpack n E2M1 codes stored two per byte (element 2i in the low nibble, as fp4train's
    QTensor files): uint8 [ceil(n/2)] -> uint8 [n]."""
    packed = np.asarray(packed, dtype=np.uint8).ravel()
    out = np.empty(2 * packed.size, np.uint8)
    out[0::2] = packed & 0xF
    out[1::2] = packed >> 4
    return out[:n]


class Report:
    """Mismatches by class: `counts[cls]` and `examples[cls]` (up to `max_examples` tuples)."""

    def __init__(self, shape, block_shape, max_examples):
        self.shape = shape
        self.block_shape = block_shape
        self.counts = {c: 0 for c in CLASSES}
        self.examples = {c: [] for c in CLASSES}
        self.max_examples = max_examples
        self.compared = []

    def add(self, cls, where, detail):
        self.counts[cls] += 1
        if len(self.examples[cls]) < self.max_examples:
            self.examples[cls].append((where, detail))

    @property
    def ok(self):
        """True when nothing but harmless zero-block scales differ."""
        return all(self.counts[c] == 0 for c in CLASSES if c != "zero block")

    def __str__(self):
        lines = [f"compared {', '.join(self.compared)} of a [{self.shape[0]}, {self.shape[1]}] tensor "
                 f"({self.block_shape[0]} x {self.block_shape[1]} blocks)"]
        for c in CLASSES:
            n = self.counts[c]
            lines.append(f"  {c:<13} {n:>8}" + ("" if n else "   ok"))
            for where, detail in self.examples[c]:
                lines.append(f"      at {where}: {detail}")
        lines.append("PASS: bit-identical" if self.ok and not self.counts["zero block"] else
                     "PASS (only zero-block scales differ, harmless)" if self.ok else
                     "FAIL: not bit-identical")
        return "\n".join(lines)


def _sign_bit(element_format):
    info = fp4train.format_info(element_format)
    if info["kind"] != "float":
        return 0  # integer grids have no -0
    return 1 << (info["bits"] - 1)


def check(x, codes=None, scale_codes=None, xhat=None, max_examples=5, **quant_options):
    """Compare a quantizer's output with fp4train.quantize(x, **quant_options).

    x: float32 [rows, cols] (C-contiguous), the input both quantized. codes: uint8 [rows, cols];
    scale_codes: uint8 [block_rows, block_cols]; xhat: float32 [rows, cols]; None = not compared.
    Returns a Report. Raises ValueError (or TypeError) for arrays of the wrong shape or dtype, and
    whatever fp4train.quantize raises for x and the options.
    """
    ref = fp4train.quantize(x, **quant_options)
    rows, cols = ref.shape
    ref_codes, ref_sc, ref_xhat = ref.codes, ref.scale_codes, ref.dequantize()
    amax = ref.block_amax
    report = Report(ref.shape, ref_sc.shape, max_examples)
    block, two_d = ref.block, ref.two_d

    def block_of(r, c):
        return (r // block if two_d else r, c // block)

    def arr(a, name, dtype, shape):
        if not isinstance(a, np.ndarray) or a.dtype != dtype:
            raise TypeError(f"{name} must be a numpy.ndarray of dtype {np.dtype(dtype).name}")
        if a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
        return a

    if scale_codes is not None:
        report.compared.append("scale codes")
        sc = arr(scale_codes, "scale_codes", np.uint8, ref_sc.shape)
        for br, bc in zip(*np.nonzero(sc != ref_sc)):
            cls = "zero block" if amax[br, bc] == 0 else "scale code"
            report.add(cls, f"block [{br}, {bc}]", f"fp4train 0x{ref_sc[br, bc]:02x} ({ref.scales[br, bc]!r}), "
                       f"yours 0x{sc[br, bc]:02x}; block amax {amax[br, bc]!r}")
    sign = _sign_bit(ref.element_format)
    szero = np.zeros(ref.shape, bool)
    if codes is not None:
        report.compared.append("element codes")
        cd = arr(codes, "codes", np.uint8, ref.shape)
        diff = cd != ref_codes
        mag_ref, mag = ref_codes & ~np.uint8(sign), cd & ~np.uint8(sign)
        if sign:
            szero |= diff & (mag_ref == 0) & (mag == 0)
        for r, c in zip(*np.nonzero(diff & ~szero)):
            report.add("element code", f"[{r}, {c}] (block {list(block_of(r, c))})",
                       f"x = {x[r, c]!r}: fp4train 0x{ref_codes[r, c]:x}, yours 0x{cd[r, c]:x}")
    if xhat is not None:
        report.compared.append("dequantized values")
        xh = arr(xhat, "xhat", np.float32, ref.shape)
        b_ref, b = ref_xhat.view(np.uint32), np.ascontiguousarray(xh).view(np.uint32)
        diff = b_ref != b
        zero_sign = diff & (ref_xhat == 0) & (xh == 0)
        for r, c in zip(*np.nonzero(diff & ~zero_sign)):
            report.add("value", f"[{r}, {c}]", f"x = {x[r, c]!r}: fp4train {ref_xhat[r, c]!r}, yours {xh[r, c]!r}")
        szero |= zero_sign
    for r, c in zip(*np.nonzero(szero)):
        report.add("sign of zero", f"[{r}, {c}]", f"x = {x[r, c]!r}: fp4train keeps "
                   f"{'-0' if np.signbit(ref_xhat[r, c]) else '+0'}")
    return report


def demo():
    """Quantize random data with fp4train, plant one mismatch of each class, report them."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    x[0, :16] = 0.0                       # a zero block
    x[1, 0] = np.float32(-1e-6)           # rounds to -0
    opts = {"scale_format": "e4m3", "block": 16}
    q = fp4train.quantize(x, **opts)
    codes, sc, xhat = q.codes.copy(), q.scale_codes.copy(), q.dequantize()
    sc[0, 0] = 0x00                       # zero block stored as the smallest scale
    sc[2, 1] ^= 0x01                      # a wrong scale
    codes[3, 5] ^= 0x01                   # a wrong element code
    codes[1, 0] &= 0x7                    # -0 written as +0 ...
    xhat[1, 0] = 0.0                      # ... and decoded as +0
    xhat[4, 4] = np.nextafter(xhat[4, 4], np.float32(np.inf))  # a decode off by one ulp
    print("fp4train reference vs a planted kernel output (scale format e4m3, block 16):")
    report = check(x, codes=codes, scale_codes=sc, xhat=xhat, **opts)
    print(report)
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("npz", nargs="?", help="file with arrays x and any of codes, scale_codes, xhat")
    p.add_argument("--demo", action="store_true", help="plant one mismatch of each class and report")
    p.add_argument("--element-format", default="e2m1")
    p.add_argument("--scale-format", default="ue5m3")
    p.add_argument("--scale-rule", default="tensor-scaled")
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--2d", dest="two_d", action="store_true")
    p.add_argument("--target", type=float, default=448.0)
    p.add_argument("--reference", type=float, default=None)
    p.add_argument("--rounding", default="rne")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.demo:
        demo()
        return 0
    if not a.npz:
        p.error("give FILE.npz or --demo")
    d = np.load(a.npz)
    opts = {k: getattr(a, k) for k in ("element_format", "scale_format", "scale_rule", "block",
                                       "two_d", "target", "reference", "rounding", "seed")}
    report = check(d["x"], codes=d.get("codes"), scale_codes=d.get("scale_codes"), xhat=d.get("xhat"), **opts)
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
