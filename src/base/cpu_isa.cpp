// FP4_MAX_CPU_ISA: the cap on fp4train's own SIMD kernels (fp4/base/cpu_isa.h).
#include "fp4/base/cpu_isa.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace fp4 {
namespace {
struct Parsed {
  CpuIsa cap = CpuIsa::Avx512;
  std::string error;
};

Parsed parse_env() {
  Parsed p;
  const char* v = std::getenv("FP4_MAX_CPU_ISA");
  if (!v || !*v) return p;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  if (s == "ALL" || s == "AVX512" || s == "AVX3" || s == "AVX512_CORE") p.cap = CpuIsa::Avx512;
  else if (s == "AVX2") p.cap = CpuIsa::Avx2;
  else if (s == "SSE4" || s == "SSE41") p.cap = CpuIsa::Sse4;
  else if (s == "SSSE3") p.cap = CpuIsa::Ssse3;
  else if (s == "SCALAR") p.cap = CpuIsa::Scalar;
  else
    p.error = std::string("FP4_MAX_CPU_ISA=") + v +
              " is not a SIMD level; use one of ALL, AVX512, AVX2, SSE4, SSSE3, SCALAR";
  return p;
}

// Read once. A bad value means no cap, silently here: kernels pick their target during static
// initialisation, before any caller could report it; fp4train's CLI refuses the value up front
// (cpu_isa_env_error), and other callers can ask the same.
const Parsed& parsed() {
  static const Parsed p = parse_env();
  return p;
}
}  // namespace

CpuIsa max_cpu_isa() { return parsed().cap; }

bool cpu_isa_allowed(CpuIsa isa) { return static_cast<int>(isa) <= static_cast<int>(max_cpu_isa()); }

std::string cpu_isa_env_error() { return parse_env().error; }

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Ssse3: return "SSSE3";
    case CpuIsa::Sse4: return "SSE4";
    case CpuIsa::Avx2: return "AVX2";
    case CpuIsa::Avx512: return "AVX-512";
  }
  return "?";
}

}  // namespace fp4
