// Token shards of the token cache (see include/fp4/data/data.h): bytes to token ids and back.
// Layout (little-endian): "FP4TOK01" | uint32 version = 1 | uint32 vocab | uint64 count |
// count x uint16 token ids.
#include <bit>
#include <cstring>

#include "fp4/data/data.h"
#include "fp4/base/error.h"

namespace fp4 {
namespace {
constexpr char kMagic[8] = {'F', 'P', '4', 'T', 'O', 'K', '0', '1'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;
}  // namespace

std::string token_cache_corrupt(const std::filesystem::path& file, const std::string& why) {
  return "token cache file '" + file.string() + "' is corrupt (" + why + "); delete '" +
         file.parent_path().string() + "' to rebuild it";
}

std::string token_shard_to_bytes(const std::vector<uint16_t>& tokens, int vocab) {
  std::string b(kHeaderBytes + 2 * tokens.size(), '\0');
  char* p = b.data();
  std::memcpy(p, kMagic, 8);
  auto put = [](char* dst, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) dst[i] = static_cast<char>(v >> (8 * i));
  };
  put(p + 8, kTokenShardVersion, 4);
  put(p + 12, static_cast<uint32_t>(vocab), 4);
  put(p + 16, tokens.size(), 8);
  char* d = p + kHeaderBytes;
  if constexpr (std::endian::native == std::endian::little) {
    if (!tokens.empty()) std::memcpy(d, tokens.data(), 2 * tokens.size());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) put(d + 2 * i, tokens[i], 2);
  }
  return b;
}

std::vector<uint16_t> token_shard_from_bytes(std::string_view b, int vocab,
                                             const std::filesystem::path& name) {
  auto corrupt = [&](const std::string& why) { return UserError(token_cache_corrupt(name, why)); };
  if (b.size() < kHeaderBytes)
    throw corrupt("only " + std::to_string(b.size()) + " bytes, header is " +
                  std::to_string(kHeaderBytes));
  if (std::memcmp(b.data(), kMagic, 8) != 0) throw corrupt("bad magic");
  auto get = [&](size_t off, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(b[off + i])} << (8 * i);
    return v;
  };
  const uint64_t version = get(8, 4), file_vocab = get(12, 4), count = get(16, 8);
  if (version != kTokenShardVersion)
    throw corrupt("version " + std::to_string(version) + ", expected " +
                  std::to_string(kTokenShardVersion));
  if (file_vocab != static_cast<uint64_t>(vocab))
    throw corrupt("vocab " + std::to_string(file_vocab) + ", expected " + std::to_string(vocab));
  const uint64_t payload = b.size() - kHeaderBytes;
  if (count > payload / 2 || payload != 2 * count)
    throw corrupt("header says " + std::to_string(count) + " tokens but the file holds " +
                  std::to_string(payload) + " payload bytes");
  std::vector<uint16_t> tokens(count);
  const char* d = b.data() + kHeaderBytes;
  if constexpr (std::endian::native == std::endian::little) {
    if (count) std::memcpy(tokens.data(), d, 2 * count);
  } else {
    for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<uint16_t>(get(kHeaderBytes + 2 * i, 2));
  }
  for (size_t i = 0; i < count; ++i)
    if (tokens[i] >= vocab)
      throw corrupt("token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                    " is outside the vocabulary");
  return tokens;
}

}  // namespace fp4
