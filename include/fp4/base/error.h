// Typed error for bad user input (config, data, CLI values). The CLI prints what() and
// exits non-zero; library code throws it with a message naming the file, field and the
// expected value.
#pragma once
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace fp4 {
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A tensor that must be finite holds NaN or Inf (e.g. activations or gradients of a
/// diverging run reaching a quantizer). Derives from std::invalid_argument.
struct NonFiniteError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// First words of a run's error.txt when the run failed (an error that is not a divergence).
inline constexpr const char* kRunFailedPrefix = "failed ";

/// What <run_dir>/error.txt records (written by fp4::train): None (no error.txt), Diverged (a
/// non-finite loss, tensor or gradient norm: a result, reported as such) or Failed (its first
/// line starts with kRunFailedPrefix: the run could not be carried out, e.g. a GEMM error or a
/// full disk; not a result, to be run again). first_line, if given, receives that line.
enum class RunError { None, Diverged, Failed };
inline RunError run_error(const std::filesystem::path& run_dir, std::string* first_line = nullptr) {
  std::ifstream f(run_dir / "error.txt");
  if (!f) return RunError::None;
  std::string line;
  std::getline(f, line);
  if (first_line) *first_line = line;
  return line.rfind(kRunFailedPrefix, 0) == 0 ? RunError::Failed : RunError::Diverged;
}
}  // namespace fp4
