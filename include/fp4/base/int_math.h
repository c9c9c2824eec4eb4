// Integer arithmetic of sizes and offsets shared by the rooms (padded widths, aligned byte
// counts, blocked layouts).
#pragma once
#include <cstdint>

namespace fp4 {

/// The smallest multiple of m that is ≥ x, for x ≥ 0 and m ≥ 1 (int64_t; e.g. round_up(17, 16)
/// is 32, round_up(0, 16) is 0). Precondition, not checked: x + m − 1 does not overflow.
constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace fp4
