// Quantized GEMM emulation: C [M, N] = A [M, K] · B [N, K]ᵀ for two block-scaled FP4 operands
// quantized along K (the contraction dim), in the two modes of docs/numerics.md
// "GEMM emulation":
//
//  * decoded (training default): dequantize both operands to FP32 (x̂ = q·d_b, d_b = c_b·gd)
//    and run the FP32 GEMM fp4::sgemm.
//  * probe-matched (fidelity mode): the native Blackwell FP4 GEMM's arithmetic as probed in
//    the paper (arXiv 2609.02846): operands held as q·c_b (E2M1 value times decoded block
//    scale, no tensor scale); each output is a sum over K-chunks of 64 products [k0, k0 + 64)
//    (the last chunk shorter when K % 64 != 0); each chunk's sum is computed exactly and
//    rounded ONCE to FP32 (round to nearest even); the chunk sums are accumulated in K order
//    starting from +0 with FP32 round-toward-zero additions; the accumulator is snapped to the
//    1/1024 grid with round to nearest even; the result is multiplied (FP32, RNE) by
//    α = g_a·g_b / ((T_a·6)(T_b·6)), computed in FP32 in that order (probe_gemm_alpha).
//
// The probe-matched result is bit-exact by construction (see docs/gemm.md for the
// arguments): every intermediate is computed exactly and rounded exactly once per rule, so
// the bits do not depend on the kernel (AVX-512 VNNI, AVX2 or portable), the thread count or
// the tiling.
#pragma once
#include <cstdint>
#include <string>

#include "fp4/gemm/accumulator.h"
#include "fp4/gemm/gemm_mode.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/qtensor.h"

namespace fp4 {

/// Products per K-chunk of the probe-matched mode (the default Accumulator's chunk).
inline constexpr int kProbeChunk = 64;
/// The largest chunk an Accumulator may have.
inline constexpr int kProbeMaxChunk = 128;
/// The default accumulator is snapped to multiples of 2^-kProbeSnapBits (1/1024).
inline constexpr int kProbeSnapBits = 10;

/// Which probe-matched kernel runs. All give identical bits (tests/gemm/test_probe_gemm.cpp runs
/// every test against every kernel the CPU has); Portable is the scalar twin of the SIMD
/// kernels and the fallback for CPUs without AVX2.
enum class ProbeKernel {
  Auto,        ///< probe_gemm_auto_kernel(): AVX-512 VNNI, else AVX2, else Portable
  Portable,    ///< plain C++ (OpenMP over rows)
  Avx512Vnni,  ///< int8 dot products with vpdpbusd; throws std::runtime_error if unsupported
  Avx2,        ///< int8 dot products with vpmaddubsw (src/gemm/probe_gemm_avx2.cpp); needs
               ///< AVX2 and FMA, throws std::runtime_error if unsupported
  Avx512Emulated,  ///< the Avx512Vnni kernel's code with every instruction emulated in
                   ///< portable C++ (src/gemm/probe_tile_avx512.inc): any x86-64 CPU, slow;
                   ///< for tests of that code on CPUs without AVX-512. Never chosen by Auto.
};

/// How α's quotient is taken (docs/gemm.md "α as the GPU computed it"): Quotient, the FP32
/// division fl(num / den) (the paper's reference code on a CPU, fp4train's default); Reciprocal,
/// fl(num · fl(1 / den)), what PyTorch's CUDA true division by a scalar computes and so what the
/// paper's 8B runs used.
enum class AlphaRule { Quotient, Reciprocal };

/// "quotient" or "reciprocal". Inline: the parsers (tests/fuzz/fuzz.cmake) link no GEMM code.
inline const char* alpha_rule_name(AlphaRule r) {
  return r == AlphaRule::Reciprocal ? "reciprocal" : "quotient";
}

struct ProbeGemmOptions {
  ProbeKernel kernel = ProbeKernel::Auto;
  /// How the products are added up (fp4/gemm/accumulator.h): chunk, rounding of the partials'
  /// additions, snap. The default is the paper's probe (64, RTZ, 1/1024), the only one the SIMD
  /// kernels implement: any other runs the portable kernel under ProbeKernel::Auto.
  Accumulator accumulator;
  AlphaRule alpha = AlphaRule::Quotient;  ///< how α = num / den is taken
};

/// True if this CPU (and build) can run ProbeKernel::Avx512Vnni and FP4_MAX_CPU_ISA
/// (fp4/base/cpu_isa.h) allows AVX-512.
bool probe_gemm_avx512_available();
/// True if this CPU (and build) can run ProbeKernel::Avx2 (AVX2 and FMA) and FP4_MAX_CPU_ISA
/// allows AVX2.
bool probe_gemm_avx2_available();
/// The kernel ProbeKernel::Auto runs on this CPU (never Auto).
ProbeKernel probe_gemm_auto_kernel();
/// "auto", "portable", "avx512-vnni", "avx2".
const char* probe_kernel_name(ProbeKernel k);

/// α, the factor the probe-matched result is multiplied by: the contract's
/// α = g_a·g_b / ((T_a·6)(T_b·6)) (docs/numerics.md "GEMM emulation"), computed in FP32 (RNE)
/// in exactly that order, as the paper's reference implementation does:
///     fl(g_a·g_b) / fl(fl(T_a·6)·fl(T_b·6)),
/// with g = QuantizedTensor::g (the tensor reference used) and T = spec.target. An operand whose
/// quantizer used no tensor scale (ge = gd = 1: the MX scale rules, or the g = 0 guard) enters
/// with g = T·6 = 1, so α = 1 for two MX operands. This is not fl(gd_a·gd_b): the roundings
/// inside gd = 1/((T·6)/g) make that differ in the last bit for about half of all (g, T).
/// Overflow and underflow follow FP32: fl(g_a·g_b) is +Inf when g_a·g_b > FLT_MAX (e.g. both
/// g above ~1.85e19), and α is then +Inf (outputs ±Inf, or NaN where y = 0). Where
/// quantize_blocks capped ge at FLT_MAX (g below T·6/FLT_MAX) α still follows the formula.
/// With AlphaRule::Reciprocal the last step is fl(fl(g_a·g_b) · fl(1 / fl(fl(T_a·6)·fl(T_b·6)))).
/// Never throws (probe_gemm checks its operands).
float probe_gemm_alpha(const QuantizedTensor& a, const QuantizedTensor& b,
                       AlphaRule rule = AlphaRule::Quotient);

/// Probe-matched GEMM: c [M, N] (row-major, overwritten, ldc = N) = A·Bᵀ with
/// A = `a` [M = a.rows, K = a.cols], B = `b` [N = b.rows, K = b.cols], both quantized along K
/// (1-D blocks of any length, or 2-D tiles; block lengths may differ between a and b) with
/// E2M1 elements and any scale rule (MX rules have no tensor scale, so α = 1).
/// Rules in the file comment, with options.accumulator's chunk, rounding and snap in place of
/// 64, RTZ and 1/1024 (the defaults). Non-finite results: a chunk sum beyond FP32 range rounds to
/// ±Inf (RNE overflow) and propagates (Inf − Inf = NaN); RTZ accumulation of finite chunk sums
/// saturates at ±FLT_MAX instead. This only happens with UE8M0 scales near 2^127. An exactly
/// zero chunk sum is +0; the snap keeps the sign, so a tiny negative accumulator gives −0.
/// Needs the default FP environment (round to nearest, no flush-to-zero / denormals-are-zero).
/// Throws std::invalid_argument if a.cols != b.cols, if either
/// QuantizedTensor is inconsistent (vector sizes vs shapes and block grid, block ≤ 0, codes
/// > 15), if its element format is not E2M1, if a block scale is not finite and > 0 or has more
/// than 8 significant bits (every scale format here has at most 8), if gd is not finite
/// and > 0, or if its tensor scales do not follow from g and T as quantize_blocks sets them
/// (tensor-scaled: ge = (T·6)/g, 1 if g = 0, at most FLT_MAX, gd = 1/ge; MX: ge = gd = 1),
/// since α comes from g and T (codes and scales are checked while packing, so c may be partly
/// written when it throws for them), or if options.accumulator is not valid
/// (Accumulator::check), or is not the default and options.kernel names a SIMD kernel
/// (Avx512Vnni, Avx2, Avx512Emulated implement the default only). Throws std::runtime_error if
/// options.kernel is Avx512Vnni or Avx2 on a CPU without it. OpenMP-parallel over (64-row group, B panels) tasks,
/// dynamically scheduled, each operand part packed once by the first task that needs it; bits
/// do not depend on the thread count. Keeps its packing buffers (about (M + N)·K bytes plus
/// per-segment scales) per calling thread between calls, so repeated calls reuse them.
void probe_gemm(const QuantizedTensor& a, const QuantizedTensor& b, float* c,
                const ProbeGemmOptions& options = {});

/// The same for packed operands (fp4/numerics/qtensor.h, e.g. from quantize_pack_fast or
/// quantize_pack_transposed_fast): equals probe_gemm(unpack(a), unpack(b), c, options) bit for
/// bit. The unpacked copies live in per-thread buffers reused between calls. Throws what
/// unpack throws (a QTensor whose sizes do not match its layout, an invalid scale code) and
/// then what the QuantizedTensor overload throws (e.g. a decode_scale that does not follow
/// from reference and target).
void probe_gemm(const QTensor& a, const QTensor& b, float* c, const ProbeGemmOptions& options = {});

/// Decoded GEMM: c [M, N] (row-major, overwritten, ldc = N) = Â·B̂ᵀ with Â, B̂ the FP32
/// dequantized operands (fp4::dequantize: x̂ = q·(c_b·gd)) and fp4::sgemm (oneDNN, FP32
/// accumulation, deterministic). Throws std::invalid_argument on a.cols != b.cols or an
/// inconsistent QuantizedTensor.
void decoded_gemm(const QuantizedTensor& a, const QuantizedTensor& b, float* c);

/// Decoded-BF16 GEMM: c [M, N] (row-major, overwritten) = fl32(fl64(P · fl64(gd_a·gd_b))) with
/// P = A_s·B_sᵀ over the block-scaled operands q·c_b (dequantize with the tensor decode scale 1)
/// by fp4::gemm_block_scaled (gemm.h; docs/gemm.md "Decoded FP4 on the BF16 GEMM"). Throws
/// std::invalid_argument on a.cols != b.cols, a row-scaled operand (per-row decode scales), an
/// element format other than E2M1 or a spelled scale format (q·c_b need not be a BF16 value),
/// UE8M0 tensor-scaled scales with a target outside [kDecodedBf16MinTarget,
/// kDecodedBf16MaxTarget] (gemm_mode.h), or an inconsistent QuantizedTensor.
void decoded_bf16_gemm(const QuantizedTensor& a, const QuantizedTensor& b, float* c);

/// decoded_gemm, decoded_bf16_gemm or probe_gemm (default options) by mode.
void quantized_gemm(GemmMode mode, const QuantizedTensor& a, const QuantizedTensor& b, float* c);

}  // namespace fp4
