// Seeded random training windows and deterministic held-out windows (see
// include/fp4/data/data.h).
#include <string>
#include <vector>

#include "fp4/data/data.h"
#include "fp4/base/error.h"

namespace fp4 {

uint64_t splitmix64(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The sampler holds a copy of the stream (shared storage).
BatchSampler::BatchSampler(const TokenStream& tokens, int seq_len, int batch, uint64_t seed)
    : tokens_(tokens), seq_len_(seq_len), batch_(batch), seed_(seed) {
  if (seq_len <= 0) throw UserError("seq_len must be positive, got " + std::to_string(seq_len));
  if (batch <= 0) throw UserError("batch size must be positive, got " + std::to_string(batch));
  if (tokens.size() < static_cast<size_t>(seq_len) + 1)
    throw UserError("token stream has " + std::to_string(tokens.size()) +
                    " tokens, fewer than seq_len + 1 = " + std::to_string(seq_len + 1) +
                    "; use more data or a shorter seq_len");
}

void BatchSampler::next(int32_t* inputs, int32_t* targets) {
  // No allocation: training steps after the first allocate nothing (SteadyStateAlloc).
  const uint64_t span = tokens_.size() - static_cast<uint64_t>(seq_len_);
  const uint64_t base = draws_ * static_cast<uint64_t>(batch_);
  for (int r = 0; r < batch_; ++r) {
    const uint64_t start = splitmix64(seed_, base + static_cast<uint64_t>(r)) % span;
    const size_t T = static_cast<size_t>(seq_len_);
    tokens_.read(start, T, inputs + static_cast<size_t>(r) * T);
    tokens_.read(start + 1, T, targets + static_cast<size_t>(r) * T);
  }
  ++draws_;
}

std::vector<int64_t> heldout_windows(int64_t n_tokens, int seq_len, int max_windows) {
  if (seq_len <= 0) throw UserError("seq_len must be positive, got " + std::to_string(seq_len));
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + seq_len + 1 <= n_tokens && static_cast<int64_t>(starts.size()) < max_windows;
       s += seq_len)
    starts.push_back(s);
  return starts;
}

}  // namespace fp4
