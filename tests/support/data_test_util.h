// Helpers shared by the data room's tests (tests/data/): scratch files and the check that a
// call throws fp4::UserError with given parts in its message.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fp4/base/error.h"

namespace fp4::testing {

/// Writes `bytes` to `p` (parent directories created, the file replaced).
inline void write(const std::filesystem::path& p, const std::string& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

/// The bytes of `p` ("" if it cannot be read).
inline std::string read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Expects `f` to throw fp4::UserError whose message contains every string of `parts`.
template <class F>
void expect_user_error(F&& f, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected fp4::UserError";
  } catch (const UserError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

}  // namespace fp4::testing
