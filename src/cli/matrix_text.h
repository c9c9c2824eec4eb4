// Text matrices for the CLI (quant, gemm): one row per line, whitespace-separated finite
// numbers, blank lines skipped; errors name the input, line, column and value.
#pragma once
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "fp4/numerics/format.h"

namespace fp4::cli {

struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;  ///< row-major [rows, cols]
};

/// Parse one token as a finite FP32 number; throws fp4::UserError naming `where` on a
/// non-number, NaN/Inf or a value outside the FP32 range.
float parse_number(const std::string& tok, const std::string& where);

/// Read rows of numbers from `in`; `name` prefixes messages, `what` names the input in the
/// empty-input message ("input", "A file", ...). Throws fp4::UserError on ragged rows, bad
/// tokens, read errors and empty input.
Matrix read_matrix(std::istream& in, const std::string& name, const std::string& what = "input");

/// `m` as text read_matrix reads back bit for bit: one row per line, values printed "%.9g"
/// (every FP32 value, -0 and subnormals included, round-trips through 9 significant digits),
/// separated by one space, each line ending in '\n'.
std::string format_matrix(const Matrix& m);

/// Shortest round-trip-ish decimal of v (ostream default formatting).
std::string num(double v);

/// "rne" | "sr8" | "rna" → Rounding; throws fp4::UserError naming option `opt` otherwise.
Rounding parse_rounding(const std::string& s, const std::string& opt = "--rounding");

}  // namespace fp4::cli
