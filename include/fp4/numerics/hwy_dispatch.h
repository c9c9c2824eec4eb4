// One home for the CPU dispatch of fp4train's Highway kernels (src/numerics/quant_fast.cpp,
// src/numerics/pack_fast.cpp, src/nn/layers_fast.cpp; docs/design.md "SIMD bodies, per
// kernel"), as ggml keeps its CPU dispatch in one place beside the portable `_ref` kernels.
//
// Each of those files is compiled once per Highway target by hwy/foreach_target.h and keeps
// one table of kernel pointers per target. fp4train does not link libhwy (whose
// hwy::GetChosenTarget backs HWY_DYNAMIC_DISPATCH), so the choice is made here: a target runs
// when the CPU has the features Highway compiles it for and FP4_MAX_CPU_ISA
// (fp4/base/cpu_isa.h) allows its level. The best runnable target is the default; tests select
// every other one (quant_fast_use_target), which switches all three files at once.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace fp4::hwy_dispatch {

/// The Highway targets of Debian's libhwy build that fp4train dispatches between, best first.
/// AVX3 is Highway's AVX-512 target (F, VL, DQ, BW). EMU128 is listed for completeness (Debian
/// does not compile it).
enum class Target { Avx3, Avx2, Sse4, Ssse3, Emu128, Scalar };

/// Highway's name of the target: "AVX3", "AVX2", "SSE4", "SSSE3", "EMU128", "SCALAR".
const char* target_name(Target t);

/// Whether this process may run target t: the CPU has every feature Highway compiles t for
/// (AVX3: avx512f/vl/dq/bw plus AVX2's; AVX2: avx2, fma, bmi, bmi2, f16c plus SSE4's; SSE4:
/// sse4.1, sse4.2, pclmul, aes; SSSE3: ssse3; EMU128 and SCALAR: always) and FP4_MAX_CPU_ISA
/// allows its level (EMU128 and SCALAR: always).
bool runnable(Target t);

/// The kernels of one file for every target compiled into it, best first: `compiled` holds
/// one {target, kernels} pair per target, in FP4_HWY_FOR_EACH_TARGET order.
template <class Kernels>
class Table {
 public:
  explicit Table(std::vector<std::pair<Target, Kernels>> compiled) : compiled_(std::move(compiled)) {
    for (const auto& [t, k] : compiled_)
      if (hwy_dispatch::runnable(t)) runnable_.push_back(k);
  }
  /// The compiled targets this process may run, best first (never empty: SCALAR is always
  /// compiled and runnable). The first is the default.
  const std::vector<Kernels>& runnable() const { return runnable_; }
  /// The compiled kernels of the target named `name` (target_name), or nullptr.
  const Kernels* find(const std::string& name) const {
    for (const auto& [t, k] : compiled_)
      if (name == target_name(t)) return &k;
    return nullptr;
  }

 private:
  std::vector<std::pair<Target, Kernels>> compiled_;
  std::vector<Kernels> runnable_;
};

}  // namespace fp4::hwy_dispatch

// FP4_HWY_FOR_EACH_TARGET(X) expands to X(NS, TARGET) for each Highway target compiled into
// this translation unit (HWY_TARGETS), best first: NS is the target's namespace (N_AVX2, ...)
// and TARGET its fp4::hwy_dispatch::Target. Include this header after hwy/highway.h, in the
// HWY_ONCE section of a file built with hwy/foreach_target.h.
#ifdef HWY_TARGETS
#if HWY_TARGETS & HWY_AVX3
#define FP4_HWY_X_AVX3(X) X(N_AVX3, ::fp4::hwy_dispatch::Target::Avx3)
#else
#define FP4_HWY_X_AVX3(X)
#endif
#if HWY_TARGETS & HWY_AVX2
#define FP4_HWY_X_AVX2(X) X(N_AVX2, ::fp4::hwy_dispatch::Target::Avx2)
#else
#define FP4_HWY_X_AVX2(X)
#endif
#if HWY_TARGETS & HWY_SSE4
#define FP4_HWY_X_SSE4(X) X(N_SSE4, ::fp4::hwy_dispatch::Target::Sse4)
#else
#define FP4_HWY_X_SSE4(X)
#endif
#if HWY_TARGETS & HWY_SSSE3
#define FP4_HWY_X_SSSE3(X) X(N_SSSE3, ::fp4::hwy_dispatch::Target::Ssse3)
#else
#define FP4_HWY_X_SSSE3(X)
#endif
#if HWY_TARGETS & HWY_EMU128
#define FP4_HWY_X_EMU128(X) X(N_EMU128, ::fp4::hwy_dispatch::Target::Emu128)
#else
#define FP4_HWY_X_EMU128(X)
#endif
#if HWY_TARGETS & HWY_SCALAR
#define FP4_HWY_X_SCALAR(X) X(N_SCALAR, ::fp4::hwy_dispatch::Target::Scalar)
#else
#define FP4_HWY_X_SCALAR(X)
#endif
#define FP4_HWY_FOR_EACH_TARGET(X) \
  FP4_HWY_X_AVX3(X) FP4_HWY_X_AVX2(X) FP4_HWY_X_SSE4(X) FP4_HWY_X_SSSE3(X) FP4_HWY_X_EMU128(X) FP4_HWY_X_SCALAR(X)
#endif  // HWY_TARGETS
