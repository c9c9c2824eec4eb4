// Strict UTF-8 validation for the data room's readers (private to the room).
#pragma once
#include <cstddef>
#include <string_view>

namespace fp4::detail {

/// Offset of the first byte of the first invalid UTF-8 sequence of `s`, or
/// std::string_view::npos if it is valid. Strict (RFC 3629): no overlong forms, no surrogates
/// (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequence at the end.
size_t first_invalid_utf8(std::string_view s);

}  // namespace fp4::detail
