// Fuzz target: the token-id files fp4train reads.
//  * Token shards of the token cache (train.bin, heldout.bin under data/cache/<key>/), through
//    token_shard_from_bytes, the checks map_token_shard makes on a cache hit. The vocabulary
//    asked for: 4096 always (the mismatch path for other shards), and the one the header
//    states (bytes 12..15) when it is one prepare_tokens accepts (so that mutations reach the
//    width, count and id checks).
//    Property: every id read is below the vocabulary; accepted version-2 bytes are exactly
//    token_shard_to_bytes of the ids read (the format has one spelling); accepted version-1
//    bytes hold the same ids in their 2-byte payload.
//  * Pre-tokenized input files (data.format llmc, uint16, uint32), through token_file_layout.
//    Property: an accepted layout accounts for every byte of the file (header + count × width).
#include <string>
#include <vector>

#include "fp4/data/data.h"
#include "fp4/base/error.h"
#include "fuzz_common.h"

namespace {
void check_shard(std::string_view in, int vocab) {
  fp4::TokenStream t;
  try {
    t = fp4::token_shard_from_bytes(in, vocab, "cache/0123456789abcdef/train.bin");
  } catch (const fp4::UserError&) {
    return;
  }
  FUZZ_CHECK(t.first_at_or_above(static_cast<uint32_t>(vocab)) == t.size(),
             "an id at or above the vocabulary was accepted");
  const uint32_t version = uint32_t(uint8_t(in[8])) | uint32_t(uint8_t(in[9])) << 8 |
                           uint32_t(uint8_t(in[10])) << 16 | uint32_t(uint8_t(in[11])) << 24;
  if (version == 2) {
    FUZZ_CHECK(fp4::token_shard_to_bytes(t, vocab) == in, "accepted shard re-writes to other bytes");
  } else {
    FUZZ_CHECK(t.token_bytes() == 2 && in.size() == 24 + 2 * t.size() && in.substr(24) == t.bytes(),
               "a version-1 shard read other ids than its payload");
  }
}

void check_file(std::string_view in, const char* format) {
  fp4::TokenFileLayout l;
  try {
    l = fp4::token_file_layout(in, in.size(), format, "shards/train_000.bin");
  } catch (const fp4::UserError&) {
    return;
  }
  FUZZ_CHECK(l.token_bytes == 2 || l.token_bytes == 4, "accepted width is neither 2 nor 4");
  FUZZ_CHECK(l.header_bytes + l.count * uint64_t(l.token_bytes) == in.size(),
             "accepted layout does not account for every byte");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = fuzz::bytes(data, size);
  check_shard(in, 4096);
  if (size >= 16) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(data[12 + i]) << (8 * i);
    // prepare_tokens takes vocab sizes from 256; the model config's limit is 2^20.
    if (v >= 256 && v <= (1u << 20) && v != 4096) check_shard(in, static_cast<int>(v));
  }
  for (const char* f : {"llmc", "uint16", "uint32"}) check_file(in, f);
  return 0;
}
