// The SIMD level fp4train's own kernels may use, capped by the environment variable
// FP4_MAX_CPU_ISA, so that one machine can run (and test) what a smaller CPU runs.
//
// fp4train's SIMD kernels are each chosen once per process from the CPU's features: the
// Highway kernels of quant_fast.cpp / pack_fast.cpp / layers_fast.cpp (targets AVX3 =
// AVX-512, AVX2, SSE4, SSSE3, SCALAR as Debian's libhwy builds them), the attention and
// Mamba-2 kernels (AVX-512, AVX2, base), the probe-matched GEMM kernels of probe_gemm.cpp and
// the FP32 → BF16 conversion of bf16.cpp (docs/design.md, "SIMD bodies, per kernel").
// Every one of them is bit-identical to its scalar twin, so the cap changes speed, never bits.
// The cap also caps oneDNN (dnnl_set_max_cpu_isa before its first use, in gemm.cpp: AVX2 for
// AVX2, SSE4.1 below), and there it does change bits: oneDNN's FP32 GEMM kernels sum in an order
// that depends on the ISA, and below AVX512_CORE there is no native BF16 matmul (gemm_bf16 then
// widens to FP32; see fp4/gemm/gemm.h). So FP4_MAX_CPU_ISA=AVX2 runs what an AVX2-only CPU (e.g. AMD
// Zen 3) runs. oneDNN's own variable ONEDNN_MAX_CPU_ISA caps oneDNN alone.
#pragma once
#include <string>

namespace fp4 {

/// SIMD levels, in increasing order.
enum class CpuIsa { Scalar = 0, Ssse3 = 1, Sse4 = 2, Avx2 = 3, Avx512 = 4 };

/// The cap from FP4_MAX_CPU_ISA, read once per process. Accepted values (case-insensitive):
/// "ALL" or unset or empty (no cap), "AVX512" (alias "AVX3", "AVX512_CORE"), "AVX2", "SSE4"
/// (alias "SSE41"), "SSSE3", "SCALAR". An unrecognised value means no cap (silently: kernels
/// choose their target during static initialisation); fp4train's CLI refuses it up front with
/// exit 2 (cpu_isa_env_error).
CpuIsa max_cpu_isa();

/// True if kernels of level `isa` may be used (isa <= max_cpu_isa()). Whether the CPU has
/// the instructions is the caller's check.
bool cpu_isa_allowed(CpuIsa isa);

/// "" if FP4_MAX_CPU_ISA is unset or valid, else a message naming the value and the choices.
std::string cpu_isa_env_error();

/// Name of a level: "scalar", "SSSE3", "SSE4", "AVX2", "AVX-512".
const char* cpu_isa_name(CpuIsa isa);

}  // namespace fp4
