// Shared by the fuzz targets of tests/fuzz/ (docs/robustness.md "Fuzzing"). Each target
// defines LLVMFuzzerTestOneInput, which libFuzzer calls (build-fuzz/, FP4_FUZZ=ON) and which
// the plain replay programs of the default build call on every file of a corpus
// (replay_main.cpp, registered in CTest).
//
// Contract of every target: bad input is refused with fp4::UserError (the error type the CLI
// reports as "fp4train: error: ..." and exit status 2); anything else that escapes (another
// exception, a crash, a sanitizer report) is a finding. Input that is accepted must
// round-trip; a failed property calls FUZZ_CHECK's __builtin_trap after printing what failed.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

/// Set by replay_main.cpp's --exact: the inputs are files fp4train wrote itself, so their
/// re-serialisation must be byte-identical to the input (targets where a lenient reader
/// accepts other spellings check this only then). False under libFuzzer.
inline bool g_fuzz_exact = false;

#define FUZZ_CHECK(cond, what)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "fuzz property failed at %s:%d: %s: %s\n", __FILE__, __LINE__,   \
                   #cond, std::string(what).c_str());                                       \
      std::fflush(stderr);                                                                  \
      __builtin_trap();                                                                     \
    }                                                                                       \
  } while (0)

namespace fuzz {
inline std::string_view bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}
/// Bitwise equality of two values (floats: the same bits, so -0 != 0 and NaN == NaN).
template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}
}  // namespace fuzz
