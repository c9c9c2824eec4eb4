// Internal to src/dist: the tree combine with the mean's division fused into its last pass.
#pragma once
#include <cstdint>
#include <vector>

#include "fp4/dist/dist.h"

namespace fp4::dist::detail {

/// tree_combine (fp4/dist/dist.h), then, if divisor != 0, out[i] = sum[i] / divisor (one FP32
/// division of the FP32 sum, so the result equals a separate combine and division bit for
/// bit). Same arguments and throws as tree_combine.
void tree_combine_div(int n, const std::vector<TreeNode>& nodes,
                      const std::vector<const float*>& values, int64_t len, float* out,
                      float divisor);

}  // namespace fp4::dist::detail
