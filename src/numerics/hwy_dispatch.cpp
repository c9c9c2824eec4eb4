// The CPU side of the Highway kernels' dispatch (see fp4/numerics/hwy_dispatch.h).
#include "fp4/numerics/hwy_dispatch.h"

#include <cpuid.h>

#include "fp4/base/cpu_isa.h"

namespace fp4::hwy_dispatch {
namespace {
// The feature sets Highway 1.0 compiles its x86 targets for (hwy/targets.cc), each including
// the one below it.
bool cpu_ssse3() { return __builtin_cpu_supports("ssse3"); }
bool cpu_sse4() {
  return cpu_ssse3() && __builtin_cpu_supports("sse4.1") && __builtin_cpu_supports("sse4.2") &&
         __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("aes");
}
bool cpu_avx2() {
  unsigned a, b, c, d;
  bool f16c = false;
  if (__get_cpuid(1, &a, &b, &c, &d)) f16c = (c >> 29) & 1;
  return cpu_sse4() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && f16c;
}
bool cpu_avx3() {
  return cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
}
}  // namespace

const char* target_name(Target t) {
  switch (t) {
    case Target::Avx3: return "AVX3";
    case Target::Avx2: return "AVX2";
    case Target::Sse4: return "SSE4";
    case Target::Ssse3: return "SSSE3";
    case Target::Emu128: return "EMU128";
    case Target::Scalar: return "SCALAR";
  }
  return "?";
}

bool runnable(Target t) {
  __builtin_cpu_init();
  switch (t) {
    case Target::Avx3: return cpu_avx3() && cpu_isa_allowed(CpuIsa::Avx512);
    case Target::Avx2: return cpu_avx2() && cpu_isa_allowed(CpuIsa::Avx2);
    case Target::Sse4: return cpu_sse4() && cpu_isa_allowed(CpuIsa::Sse4);
    case Target::Ssse3: return cpu_ssse3() && cpu_isa_allowed(CpuIsa::Ssse3);
    case Target::Emu128:
    case Target::Scalar: return true;
  }
  return false;
}

}  // namespace fp4::hwy_dispatch
