// Which SIMD variants a twin test runs (docs/design.md "SIMD bodies, per kernel"), from the
// environment variable FP4_TEST_VARIANTS:
//   unset, "" or "native"  the variants this CPU runs natively (the default run of the suite);
//   "emulated"             only the emulated wide bodies: the AVX-512 code paths compiled for
//                          baseline x86-64 (GCC vectors, per-lane operations), which any
//                          x86-64 CPU runs; the CTest copies labelled `emulated` set this;
//   "all"                  both.
// Any other value ends the test program with exit status 2 at the first test that reads it (a
// typo must not silently run nothing).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fp4::test {

enum class VariantSet { kNative, kEmulated, kAll };

inline VariantSet variant_set() {
  static const VariantSet s = [] {
    const char* v = std::getenv("FP4_TEST_VARIANTS");
    if (!v || !*v || std::strcmp(v, "native") == 0) return VariantSet::kNative;
    if (std::strcmp(v, "emulated") == 0) return VariantSet::kEmulated;
    if (std::strcmp(v, "all") == 0) return VariantSet::kAll;
    std::fprintf(stderr, "FP4_TEST_VARIANTS=%s: expected native, emulated or all\n", v);
    std::exit(2);
  }();
  return s;
}

/// True if a variant (emulated or native) is selected by FP4_TEST_VARIANTS.
inline bool variant_selected(bool emulated) {
  switch (variant_set()) {
    case VariantSet::kNative: return !emulated;
    case VariantSet::kEmulated: return emulated;
    case VariantSet::kAll: return true;
  }
  return true;
}

}  // namespace fp4::test
