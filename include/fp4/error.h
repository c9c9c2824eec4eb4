// Typed error for bad user input (config, data, CLI values). The CLI prints what() and
// exits non-zero; library code throws it with a message naming the file, field and the
// expected value.
#pragma once
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
}  // namespace fp4
