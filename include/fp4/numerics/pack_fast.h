// Fast (SIMD + OpenMP) quantize-to-packed and dequantize-from-packed kernels of QTensor
// (fp4/numerics/qtensor.h), each bit-identical to its scalar twin:
//
//   quantize_pack_fast(x, ...)             ==  pack(quantize_blocks(x, ...))
//   quantize_pack_transposed_fast(x, ...)  ==  pack(quantize_blocks(RHT?(xᵀ), ...))
//   dequantize_fast(t, out)                ==  dequantize(t, out)              (FP32)
//   dequantize_bf16_fast(t, out)           ==  round_bf16(dequantize(t)), as BF16 bit patterns
//
// Contract: docs/numerics.md "Formats" (E2M1 codes, two per byte, even element in the low
// nibble; scale codes), "Quantizing one operand" (exact FP32 operation order) and "Rounding a
// magnitude" (RNE and the 8-bit SR rule). tests/numerics/test_pack_fast.cpp compares every kernel with
// its twin by memcmp, on every SIMD target (quant_fast_use_target selects the target for these
// kernels too) and for 1 and 2 threads.
//
// One pass per block-row: block amax → scale code (UE5M3, UE5M3-PTX, E4M3, UE8M0) → E2M1 codes
// (RNE, or SR8 with the counter-based bytes of sr_bytes) → packed nibbles + one scale byte per
// block; no FP32 intermediate tensor is written. MXFP4 (UE8M0 scales under the MX rules) runs
// the scalar composition, which packs it. Other specs (other element formats, spelled scale
// formats, MX rules on other formats) are not QTensor material: the scalar composition then
// throws what pack() throws.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/philox.h"
#include "fp4/numerics/qtensor.h"

namespace fp4 {

/// Quantize x [rows, cols] (row-major FP32) into a packed QTensor in one fused pass: 1-D blocks
/// of spec.block along cols (fprop X, dgrad dY), or spec.block × spec.block tiles when
/// spec.two_d (weights). Bit-identical to pack(quantize_blocks(x, rows, cols, spec, g, sr),
/// facts): same element codes (packed[i/2] nibble i%2), scale codes ([block_rows, block_cols]),
/// decode_scale gd = 1/ge, reference g and target T. SR8 element (i, j) uses
/// sr_byte(*sr, i·cols + j). Parallel over block-rows; bits do not depend on the thread count.
/// Throws what the scalar composition throws (same types; messages name this function):
/// std::invalid_argument for negative shapes, block ≤ 0, g negative/NaN/Inf, T ≤ 0 or
/// non-finite, null sr with SR8, and for specs pack() rejects (element format other than
/// E2M1, spec.scale_desc set, an MX rule without UE8M0 scales); NonFiniteError naming the
/// first NaN/Inf of x. MXFP4 specs run the scalar composition itself (no fused kernel).
QTensor quantize_pack_fast(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                           float g, const SrKey* sr, std::map<std::string, std::string> facts = {});

/// The same, into an existing QTensor whose buffers are reused (no allocation when their sizes
/// already match, e.g. a training loop or a benchmark): every field except `facts` is
/// overwritten; `facts` is left as it is. Same errors; if it throws, `out` is left in an
/// unspecified but valid state (partly written codes).
void quantize_pack_fast(const float* x, int64_t rows, int64_t cols, const BlockQuantSpec& spec,
                        float g, const SrKey* sr, QTensor& out);

/// The wgrad quantize-transpose into a packed QTensor (docs/numerics.md "Notation": dYᵀ and Xᵀ,
/// blocks along tokens). x is [rows, cols] (rows = tokens M); the result is the [cols, rows]
/// QTensor, bit-identical to
///     t = xᵀ [cols, rows];  if (rht) rht16_rows(t, cols, rows);
///     pack(quantize_blocks(t, cols, rows, spec, g, sr), facts)
/// (the composition quantize_dequantize_transposed_fast also matches): blocks of spec.block
/// run along the ORIGINAL rows; the optional 16-point RHT (docs/numerics.md "Random Hadamard
/// transform") acts on 16-long chunks along them; SR8 element (c, r) of xᵀ uses
/// sr_byte(*sr, c·rows + r). g is the reference of the operand as quantized (with rht: the amax
/// of the transformed tensor, e.g. amax_rht16_transposed). One pass over x, in panels of 128
/// columns: with rows % 16 == 0 and blocks of a multiple of 16, each block-row of a panel is
/// read into an L1 tile (RHT-transformed there) and quantized straight into the packed output
/// rows; otherwise a panel is transposed into a per-thread buffer that stays in cache and
/// quantized there by the row kernel. spec.two_d (tiles of xᵀ) goes through a transposed FP32
/// copy. Parallel over panels; bits do not depend on the thread count. Throws what the
/// reference composition throws: std::invalid_argument if rht and rows % 16 != 0, for the
/// spec/g/sr errors above and specs pack() rejects; NonFiniteError if x or its RHT holds
/// NaN/Inf.
QTensor quantize_pack_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                      const BlockQuantSpec& spec, float g, const SrKey* sr,
                                      bool rht, std::map<std::string, std::string> facts = {});

/// The same, into an existing QTensor whose buffers are reused (no allocation when their sizes
/// already match): every field except `facts` is overwritten. Same errors; if it throws, `out`
/// is left in an unspecified but valid state.
void quantize_pack_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                   const BlockQuantSpec& spec, float g, const SrKey* sr, bool rht,
                                   QTensor& out);

/// Which path quantize_pack_fast / quantize_pack_transposed_fast (and a probe-matched linear's
/// operands, docs/numerics.md "GEMM emulation") take for spec when it is not a fused SIMD
/// packer: "" if it is one (every block size, 1-D and 2-D); else a phrase naming the scalar
/// path, e.g. "scalar quantize_blocks, then pack (MXFP4 has no fused packer)", for a run's one
/// warning (docs/performance.md "Block sizes and the quantizer's fast path"). Honours
/// quant_fast_force_slow_path. Throws nothing.
std::string pack_fast_slow_path(const BlockQuantSpec& spec);

/// x̂ [t.rows, t.cols] (row-major FP32) = e2m1_decode(code) · (scale_decode(scale code) ·
/// decode_scale): bit-identical to dequantize(t, out) (qtensor.h; docs/numerics.md "Quantizing one
/// operand", x̂ = q · d_b). Parallel over rows; bits do not depend on the thread count.
/// Throws std::invalid_argument (before writing anything) if the QTensor is inconsistent
/// (negative shape, block ≤ 0, packed or scale_codes of the wrong size — the scalar twin does
/// not check these) and, exactly as the scalar twin, if a scale code is reserved/NaN in
/// t.scale_format (the message of scale_decode for the first such block).
void dequantize_fast(const QTensor& t, float* out);

/// The same values rounded to BF16 (round-to-nearest-even, NaN kept quiet: fp4::round_bf16),
/// written as BF16 bit patterns (the upper 16 bits of the FP32 value): out[i] ==
/// bit_cast<uint32_t>(round_bf16(x̂_i)) >> 16 for x̂ = dequantize(t) (one rounding of the
/// FP32 product, never of d_b alone). Same errors as dequantize_fast.
void dequantize_bf16_fast(const QTensor& t, uint16_t* out);

}  // namespace fp4
