// Locating the repository's configs and data from the CLI: relative to the working
// directory first, then to the source tree the binary was built from.
#pragma once
#include <filesystem>
#include <string>

namespace fp4::cli {
/// `rel` if it exists relative to the working directory, else FP4_SOURCE_DIR/rel if that
/// exists, else `rel` unchanged (so the error names what the user typed).
std::filesystem::path resolve(const std::string& rel);
}  // namespace fp4::cli
