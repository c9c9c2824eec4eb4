// Text matrices for the CLI (see matrix_text.h).
#include "matrix_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "fp4/base/error.h"

namespace fp4::cli {

/// Parse one whitespace-separated token as a finite FP32 number; `where` names the position.
float parse_number(const std::string& tok, const std::string& where) {
  const char* first = tok.data();
  const char* last = tok.data() + tok.size();
  if (first != last && *first == '+') ++first;  // from_chars does not take a leading '+'
  double d = 0.0;
  const auto [ptr, ec] = std::from_chars(first, last, d, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) {
    throw UserError(where + ": '" + tok + "' is out of the FP32 range");
  }
  if (ec != std::errc() || ptr != last || first == last || (first != tok.data() && *first == '-')) {
    throw UserError(where + ": '" + tok + "' is not a number");
  }
  if (std::isnan(d) || std::isinf(d)) {
    throw UserError(where + ": '" + tok + "' is NaN or Inf; inputs must be finite");
  }
  const float f = static_cast<float>(d);
  if (std::isinf(f)) throw UserError(where + ": '" + tok + "' is out of the FP32 range");
  return f;
}

/// Rows of numbers, one row per line, whitespace separated; blank lines are skipped.
Matrix read_matrix(std::istream& in, const std::string& name, const std::string& what) {
  Matrix m;
  std::string line;
  int64_t lineno = 0, first_row_line = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::vector<float> row;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i >= line.size()) break;
      size_t j = i;
      while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
      const std::string where = name + ": line " + std::to_string(lineno) + ", column " +
                                std::to_string(i + 1) + " (value " +
                                std::to_string(row.size() + 1) + ")";
      row.push_back(parse_number(line.substr(i, j - i), where));
      i = j;
    }
    if (row.empty()) continue;
    if (m.rows == 0) {
      m.cols = static_cast<int64_t>(row.size());
      first_row_line = lineno;
    } else if (static_cast<int64_t>(row.size()) != m.cols) {
      throw UserError(name + ": line " + std::to_string(lineno) + ", column 1: ragged rows: " +
                      std::to_string(row.size()) + " values, but line " +
                      std::to_string(first_row_line) + " has " + std::to_string(m.cols));
    }
    m.data.insert(m.data.end(), row.begin(), row.end());
    ++m.rows;
  }
  if (in.bad()) throw UserError(name + ": read error");
  if (m.rows == 0) throw UserError(name + ": empty " + what + " (expected numbers, one row per line)");
  return m;
}

std::string format_matrix(const Matrix& m) {
  std::string out;
  char buf[32];
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      std::snprintf(buf, sizeof buf, "%s%.9g", c ? " " : "",
                    static_cast<double>(m.data[static_cast<size_t>(r * m.cols + c)]));
      out += buf;
    }
    out += '\n';
  }
  return out;
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Rounding parse_rounding(const std::string& s, const std::string& opt) {
  try {
    return parse_rounding_name(s);
  } catch (const std::invalid_argument&) {
    throw UserError(opt + ": unknown value '" + s + "' (valid choices: rne, sr8, rna)");
  }
}

}  // namespace fp4::cli
