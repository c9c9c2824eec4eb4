// Embedding forward/backward (see fp4/nn/layers.h). The other non-linear layers (RMSNorm,
// RoPE, squared ReLU, SwiGLU, cross-entropy, residual add) are in layers_fast.cpp with scalar
// twins in layers_ref.cpp; attention lives in attention.cpp.
//
// Determinism: the embedding forward is a copy per row; its backward (a reduction over tokens)
// is parallelised over channel chunks, each chunk summing tokens in ascending order, so results
// do not depend on the number of OpenMP threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/nn/layers.h"
#include "layers_internal.h"

namespace fp4::nn {
namespace {

constexpr int64_t kChunk = 64;  // channels per task in token reductions
// Loops with less work (in elements) than this run on the calling thread only: waking a
// thread team costs more than it saves, and a busy machine makes it far worse. Results
// do not depend on it.
constexpr int64_t kParallelMin = int64_t{1} << 15;

using internal::check_ids;

}  // namespace

// ---------------------------------------------------------------- embedding
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t BT,
                       int64_t C, int64_t V) {
  check_ids(tokens, BT, V, "embedding_forward", "tokens");
#pragma omp parallel for schedule(static) if (BT * C >= kParallelMin)
  for (int64_t t = 0; t < BT; ++t) {
    const float* src = wte + static_cast<int64_t>(tokens[t]) * C;
    std::copy(src, src + C, out + t * C);
  }
}

// dwte[tokens[t], c] += dout[t, c]; parallel over channel chunks, tokens in ascending order,
// so repeated tokens are summed in a fixed order.
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t BT,
                        int64_t C) {
  check_ids(tokens, BT, -1, "embedding_backward", "tokens");
  const int64_t nchunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (BT * C >= kParallelMin)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t c0 = ch * kChunk, c1 = std::min(C, c0 + kChunk);
    for (int64_t t = 0; t < BT; ++t) {
      float* dst = dwte + static_cast<int64_t>(tokens[t]) * C;
      const float* g = dout + t * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += g[c];
    }
  }
}

}  // namespace fp4::nn
