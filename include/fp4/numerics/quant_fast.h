// Fast (SIMD + OpenMP) twins of the scalar block quantizers of block_quant.h.
//
// Every function here is bit-identical to a composition of the scalar reference functions
// (named in each docstring) for every input, including the errors it throws; the scalar code is
// the contract (docs/numerics.md "Quantizing one operand", "Rounding a magnitude", "Random
// Hadamard transform") and tests/numerics/test_quant_fast.cpp compares the two with memcmp.
//
// Implementation: Google Highway, compiled for several x86 targets (AVX-512 "AVX3", AVX2, SSE4,
// SSSE3 and a portable fallback, "EMU128" or, with GCC < 12.3, "SCALAR") and chosen at run time
// from the CPU's features, so the project keeps its generic x86-64 flags. Work is split over
// OpenMP threads in fixed units (block-rows; panels of whole blocks for the quantize-transpose),
// and every block's result depends only on its own inputs and on the counter-based SR bytes of
// its elements, so the bits never depend on the thread count or schedule.
//
// Fast path: E2M1 elements with block-scale formats UE5M3, UE5M3-PTX, E4M3 and UE8M0 (the
// plain RNE power-of-two scale of block_quant.cpp), any block size, 1-D blocks and 2-D tiles,
// RNE and SR8; and MXFP4: the MX scale rules mx-te / mx-ocp with UE8M0 scales. Anything else
// (other element formats, a scale format added later, Four Over Six) runs the scalar reference;
// quant_fast_supports() says which path a spec takes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/philox.h"

namespace fp4 {

/// max |x_i| over x [n] (FP32), 0 for n == 0: the same value as tensor_amax(x, n).
/// Throws NonFiniteError (fp4/base/error.h) naming the first NaN/Inf index if any element is not
/// finite, std::invalid_argument if n < 0 — as tensor_amax does. Parallel over fixed chunks;
/// max is exact, so the result does not depend on the thread count.
float amax_fast(const float* x, int64_t n);

/// Fused quantize → dequantize of x [rows, cols] (row-major FP32) into out [rows, cols]:
/// bit-identical to quantize_dequantize(x, rows, cols, spec, g, sr, out) (docs/numerics.md
/// "Quantizing one operand"): 1-D blocks of spec.block along cols (fprop X and W, dgrad dY), or
/// spec.block × spec.block tiles when spec.two_d (weights). SR8 element (i, j) uses
/// sr_byte(*sr, i·cols + j). out may alias x exactly (not partially).
/// Throws what quantize_dequantize throws (same types; messages name this function):
/// std::invalid_argument for negative shapes,
/// block ≤ 0, g negative/NaN/Inf, T ≤ 0 or non-finite, null sr with SR8; NonFiniteError (a
/// std::invalid_argument) naming the first non-finite element of x. If it throws for a
/// non-finite x, out is left partly written (block-rows holding the bad value are never written).
void quantize_dequantize_fast(const float* x, int64_t rows, int64_t cols,
                              const BlockQuantSpec& spec, float g, const SrKey* sr, float* out);

/// The wgrad quantize-transpose (docs/numerics.md "Notation": dYᵀ and Xᵀ, blocks along tokens):
/// x is [rows, cols] (rows = tokens M), out is [cols, rows] and equals, bit for bit,
///     t = xᵀ [cols, rows];  if (rht) rht16_rows(t, cols, rows);
///     quantize_dequantize(t, cols, rows, spec, g, sr, out);
/// i.e. blocks of spec.block run along the ORIGINAL rows, the optional 16-point RHT
/// (docs/numerics.md "Random Hadamard transform") acts on each 16-long chunk along the original rows
/// before quantization, and SR8 element (c, r) of xᵀ uses sr_byte(*sr, c·rows + r).
/// g is the caller's tensor reference of the operand as quantized: with rht it must be the
/// amax of the TRANSFORMED tensor (held or current), e.g. amax_rht16_transposed(x, rows, cols)
/// for current scaling; without rht it is the amax of x itself (amax_fast(x, rows·cols)).
/// out must not overlap x. spec.two_d (tiles of xᵀ), and the RHT with a block whose smallest
/// common multiple with 16 exceeds 256 (odd blocks over 16, ...), go through a slower path
/// (transpose, RHT, quantize_dequantize_fast in place): quant_fast_slow_path names it.
/// Throws what the reference composition throws: std::invalid_argument if rht and
/// rows % 16 != 0 (the RHT works on 16-long chunks) and for the spec/g/sr errors above;
/// NonFiniteError if x, or its RHT, holds NaN/Inf (the message names an element of x, or the
/// transformed chunk when only the RHT overflowed).
void quantize_dequantize_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                         const BlockQuantSpec& spec, float g, const SrKey* sr,
                                         bool rht, float* out);
/// The same with the RHT's arithmetic chosen by `precision` (recipe key fp4.rht_precision):
/// RhtPrecision::FP32 is the function above; RhtPrecision::BF16 replaces rht16_rows by
/// rht16_rows_bf16 in the reference composition (inputs and outputs of the transform rounded to
/// BF16, docs/numerics.md "Random Hadamard transform"), fused into the SIMD kernel and
/// bit-identical to that composition on every target. Ignored without rht. Same errors.
void quantize_dequantize_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                         const BlockQuantSpec& spec, float g, const SrKey* sr,
                                         bool rht, RhtPrecision precision, float* out);

/// The quantize-transpose with any Hadamard transform (docs/numerics.md "Random Hadamard
/// transform", "Sizes, roles and sign policies"): out [cols, rows] equals, bit for bit,
///     t = xᵀ [cols, rows];  if (had) hadamard_rows(t, cols, rows, *had);
///     quantize_dequantize(t, cols, rows, spec, g, sr, out);
/// had == nullptr: no transform. A 16-point transform (any signs, either precision) is fused
/// into the SIMD kernel as above; larger ones run that composition (FP32 transpose, the scalar
/// hadamard_rows, quantize_dequantize_fast in place), which quant_fast_slow_path(spec, true,
/// true, n) names. g must be the amax of the transformed tensor (amax_hadamard_transposed).
/// Throws std::invalid_argument if had and rows % had->n != 0, or had->n is not a supported
/// size; otherwise as the overloads above.
void quantize_dequantize_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                         const BlockQuantSpec& spec, float g, const SrKey* sr,
                                         const HadamardTransform* had, float* out);

/// The block-scaled operands of the decoded-BF16 GEMM (docs/gemm.md "Decoded FP4 on the BF16
/// GEMM"): the same kernels with the output multiplier c_b in place of d_b = c_b·gd, so out holds
/// q·c_b (exact in BF16 for E2M1 with UE5M3 or E4M3 scales) and the tensor decode scale gd
/// (tensor_decode_scale, block_quant.h) is left for the GEMM's output. Bit-identical to
/// quantize_block_scaled(x, rows, cols, spec, g, sr, out) (block_quant.h), the scalar twin;
/// every spec, path, alias rule and error as quantize_dequantize_fast (errors name this
/// function).
void quantize_block_scaled_fast(const float* x, int64_t rows, int64_t cols,
                                const BlockQuantSpec& spec, float g, const SrKey* sr, float* out);
/// quantize_block_scaled_fast with out as BF16 bit patterns [rows, cols] (uint16): bit-identical
/// to quantize_block_scaled(x, rows, cols, spec, g, sr, t); to_bf16_bits(t, rows·cols, out)
/// (bf16.h: RNE, exact where q·c_b is a BF16 value, as for the decoded-BF16 GEMM's formats), so
/// the GEMM reads the operand without a conversion pass of its own. The kernels stage each
/// output row in a per-thread FP32 buffer and convert it there; other specs (no SIMD kernel)
/// compose the scalar twin and to_bf16_bits in a per-thread FP32 buffer of the whole operand,
/// kept for the thread's life (Linear takes the FP32 output there instead). out must not
/// overlap x. Same errors.
void quantize_block_scaled_fast(const float* x, int64_t rows, int64_t cols,
                                const BlockQuantSpec& spec, float g, const SrKey* sr,
                                uint16_t* out);
/// The quantize-transpose of quantize_dequantize_transposed_fast (any Hadamard transform or none)
/// with q·c_b out: bit-identical to t = xᵀ; if (had) hadamard_rows(t, cols, rows, *had);
/// quantize_block_scaled(t, cols, rows, spec, g, sr, out). Same paths and errors as that
/// function (errors name this one; a composed path's row pass names quantize_block_scaled_fast).
void quantize_block_scaled_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                           const BlockQuantSpec& spec, float g, const SrKey* sr,
                                           const HadamardTransform* had, float* out);
/// The same with out as BF16 bit patterns [cols, rows]: bit-identical to the function above
/// followed by to_bf16_bits(out, rows·cols, ·). The SIMD kernel converts each tile's column
/// runs from a per-thread FP32 buffer, on tiles of 32 rows where the block divides 32 (a column
/// run is then one 64-byte line of BF16), streamed for large outputs when out is 64-byte aligned
/// and rows % 32 == 0; the composed paths (quant_fast_slow_path) stage the whole operand in a
/// per-thread FP32 buffer kept for the thread's life. out must not overlap x. Same errors.
void quantize_block_scaled_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                           const BlockQuantSpec& spec, float g, const SrKey* sr,
                                           const HadamardTransform* had, uint16_t* out);

/// max |H(xᵀ)| for x [rows, cols] and the transform h of any supported size: the same value as
/// tensor_amax of hadamard_rows(xᵀ [cols, rows], h). n = 16 is fused (no transpose is
/// materialised); larger n transform a temporary transpose. Throws std::invalid_argument if
/// rows % h.n != 0 or a shape is negative; NonFiniteError if x or its transform holds NaN/Inf.
float amax_hadamard_transposed(const float* x, int64_t rows, int64_t cols,
                               const HadamardTransform& h);

/// max |RHT16(xᵀ)| for x [rows, cols]: the same value as
/// tensor_amax(rht16_rows(xᵀ [cols, rows])), without materialising the transpose (the RHT of
/// xᵀ along its rows is the RHT of x along its columns). This is the current-scaling reference g
/// of an RHT wgrad operand. Throws std::invalid_argument if rows % 16 != 0 or a shape is
/// negative; NonFiniteError if x or its transform holds NaN/Inf.
float amax_rht16_transposed(const float* x, int64_t rows, int64_t cols);
/// The same for the RHT of `precision`: with RhtPrecision::BF16 the value of
/// tensor_amax(rht16_rows_bf16(xᵀ)). Same errors.
float amax_rht16_transposed(const float* x, int64_t rows, int64_t cols, RhtPrecision precision);

// ---- Per-row reference (row-scaled operand; docs/numerics.md "Tensor reference g").

/// out[r] = max_c |x[r, c]| for x [rows, cols], out [rows]: the same values as row_amax (the
/// scalar twin, block_quant.h). Same errors (NonFiniteError naming the first non-finite element,
/// std::invalid_argument on a negative shape). Parallel over rows; exact, so any thread count
/// gives the same bits.
void row_amax_fast(const float* x, int64_t rows, int64_t cols, float* out);

/// Fused quantize → dequantize with one reference per row, row_g [rows]: bit-identical to
/// quantize_dequantize_rows(x, rows, cols, spec, row_g, sr, out) (block_quant.h; 1-D blocks,
/// tensor-scaled rule, the contract's steps with g_r in place of g). The row kernel of
/// quantize_dequantize_fast with each row's ge_r, gd_r, mult_r computed by the same
/// expressions. out may alias x exactly. Same errors as the scalar function (messages name
/// this function); specs without a SIMD kernel run the scalar function.
void quantize_dequantize_rows_fast(const float* x, int64_t rows, int64_t cols,
                                   const BlockQuantSpec& spec, const float* row_g,
                                   const SrKey* sr, float* out);

/// The wgrad quantize-transpose of a row-scaled operand (x [rows, cols], rows = tokens M):
/// out [cols, rows] and row_g [cols] equal, bit for bit,
///     t = xᵀ;  if (rht) rht16_rows(t, cols, rows, precision);
///     row_amax(t, cols, rows, row_g);  quantize_dequantize_rows(t, cols, rows, spec, row_g, sr, out);
/// i.e. one current reference per row of xᵀ (per column of x, after the RHT), as Transformer
/// Engine's reference quantizer takes the columnwise amax of a row-scaled tensor
/// (docs/numerics.md "Per-row reference"). Runs that composition (FP32 transpose, RHT, then the
/// SIMD row kernels): quant_fast_slow_path(spec, true, rht, true) names it. out must not
/// overlap x. Throws what the composition throws: std::invalid_argument for the shape (with
/// rht, rows % 16 != 0), the spec (2-D, MX rules) or a null sr with SR8; NonFiniteError naming
/// an element of the transposed (transformed) operand.
void quantize_dequantize_rows_transposed_fast(const float* x, int64_t rows, int64_t cols,
                                              const BlockQuantSpec& spec, const SrKey* sr,
                                              bool rht, RhtPrecision precision, float* row_g,
                                              float* out);

/// Whether quantize_dequantize_fast / quantize_dequantize_transposed_fast run the SIMD path
/// for this spec (true for E2M1 elements with UE5M3, UE5M3-PTX, E4M3, UE8M0 scales under the
/// tensor-scaled rule, and with UE8M0 scales under mx-te / mx-ocp; false for Four Over Six,
/// docs/numerics.md "Four Over Six"), rather than falling back to the scalar reference.
/// Results are identical either way.
bool quant_fast_supports(const BlockQuantSpec& spec);

/// Which path quantize_dequantize_fast (transposed = false) or
/// quantize_dequantize_transposed_fast (transposed = true, with the RHT if rht) takes for spec,
/// when it is not the fused SIMD kernel: "" if it is the SIMD kernel; otherwise a phrase naming
/// the slower path and why, for a run's one warning (docs/performance.md "Block sizes and the
/// quantizer's fast path"), e.g. "scalar reference quantizer (scale format ue4m3 has no SIMD
/// kernel)" or "composed quantize-transpose (FP32 transpose, scalar RHT, row kernel: the RHT's
/// 16-row chunks straddle tiles of block 17)". Every block size 1..kMaxBlock takes the SIMD
/// kernels, 1-D and 2-D, with and without the RHT, except the RHT with a block whose smallest
/// common multiple with 16 exceeds 256 rows (odd blocks over 16, ...) and 2-D tiles of the
/// transposed operand. Results are bit-identical on every path. Throws nothing.
std::string quant_fast_slow_path(const BlockQuantSpec& spec, bool transposed, bool rht);
/// The same for a row-scaled operand (quantize_dequantize_rows_fast, or with `transposed`
/// quantize_dequantize_rows_transposed_fast, which is always a composition and is named
/// "composed quantize-transpose (FP32 transpose, RHT, per-row amax, row kernel: a per-row
/// reference of the transposed operand)").
std::string quant_fast_slow_path_row_scaled(const BlockQuantSpec& spec, bool transposed, bool rht);
/// The same for an operand under a Hadamard transform of hadamard_n points (rht true): a
/// transposed (wgrad) operand with hadamard_n > 16 takes the composed quantize-transpose; a
/// row-wise (dgrad) operand always takes a separate scalar hadamard_rows pass before the row
/// kernel; both are named. With rht false or hadamard_n = 16 the 3-argument answer. Throws
/// nothing.
std::string quant_fast_slow_path(const BlockQuantSpec& spec, bool transposed, bool rht,
                                 int hadamard_n);

/// Test hook: while on, quant_fast_slow_path names a (pretended) slow path for every spec,
/// "scalar reference quantizer (forced by a test hook)", so that tests can see a run's warning
/// and the comparison report's "slow path" mark without a slow recipe. Kernels are unchanged.
/// Also switched on by the environment variable FP4_TEST_FORCE_SLOW_PATH=1 (read once).
void quant_fast_force_slow_path(bool on);

/// SIMD Philox4x32-10: out[0..n) = sr_byte(key, first + j), identical to sr_bytes.
void sr_bytes_fast(const SrKey& key, uint64_t first, uint64_t n, uint8_t* out);

/// SIMD targets compiled into this build that the running CPU supports, best first
/// (e.g. {"AVX3", "AVX2", "SSE4", "SSSE3", "EMU128"}).
std::vector<std::string> quant_fast_targets();
/// The target the kernels currently use (the best supported one unless overridden).
std::string quant_fast_target();
/// Use target `name` (one of quant_fast_targets()) for all later calls, or the best one for
/// "". For tests and benchmarks; not thread-safe against concurrent kernel calls.
/// Throws std::invalid_argument naming the available targets if `name` is not one of them.
void quant_fast_use_target(const std::string& name);

/// Large outputs are written with streaming (non-temporal) stores, which skip the read of every
/// output line: by default outputs of ≥ 16 MiB for the quantize-transpose and ≥ 32 MiB for the
/// row-wise quantizer (smaller ones stay in cache for the GEMM that reads them), when whole
/// 64-byte lines can be formed (cols resp. rows % 16 == 0; transposed, lcm(block, 16) ≤ 256;
/// a 64-byte aligned out on every target, any float-aligned out on 16-lane targets (AVX-512),
/// where misaligned lines are assembled in registers; the quantize-transpose into a misaligned
/// out is still ~1.4× slower than into an aligned one). Values never depend on it. Sets one
/// threshold in bytes for both (a negative value restores the defaults) and returns the
/// previous override (−1 if none); for tests and benchmarks, not thread-safe against
/// concurrent kernel calls.
int64_t quant_fast_stream_min_bytes(int64_t bytes);

}  // namespace fp4
