// Fuzz target: the text matrices of `fp4train quant` and `fp4train gemm`, through
// fp4::cli::read_matrix (src/cli/matrix_text.cpp, the reader both commands use).
// Property: an accepted matrix printed by format_matrix (%.9g, the format gemm prints C in)
// reads back to the same shape and the same FP32 bits, and prints to the same text again.
#include <sstream>
#include <string>

#include "fp4/base/error.h"
#include "fuzz_common.h"
#include "matrix_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fp4::cli::Matrix;
  std::istringstream in{std::string(fuzz::bytes(data, size))};
  Matrix m;
  try {
    m = fp4::cli::read_matrix(in, "fuzz.txt");
  } catch (const fp4::UserError&) {
    return 0;
  }
  FUZZ_CHECK(m.rows > 0 && m.cols > 0 && m.data.size() == static_cast<size_t>(m.rows * m.cols),
             "inconsistent shape");
  const std::string text = fp4::cli::format_matrix(m);
  std::istringstream in2(text);
  Matrix m2;
  try {
    m2 = fp4::cli::read_matrix(in2, "printed.txt");
  } catch (const fp4::UserError& e) {
    FUZZ_CHECK(false, std::string("a printed matrix does not read back: ") + e.what());
  }
  FUZZ_CHECK(m2.rows == m.rows && m2.cols == m.cols, "shape changed");
  FUZZ_CHECK(std::memcmp(m2.data.data(), m.data.data(), 4 * m.data.size()) == 0,
             "values changed bits: " + text);
  FUZZ_CHECK(fp4::cli::format_matrix(m2) == text, "printing is not a fixed point");
  return 0;
}
