// Fuzz target: token shards of the token cache (train.bin, heldout.bin under
// data/cache/<key>/), through token_shard_from_bytes, the reader prepare_tokens uses on a
// cache hit. The vocabulary the reader is asked for: 4096 always (the mismatch path for
// other shards), and the one the header states (bytes 12..15) when it is a vocabulary size
// prepare_tokens accepts (so that mutations reach the count and id checks).
// Property: accepted bytes are exactly token_shard_to_bytes of the tokens read (the format
// has one spelling), and every id is below the vocabulary.
#include <string>
#include <vector>

#include "fp4/data/data.h"
#include "fp4/base/error.h"
#include "fuzz_common.h"

namespace {
void check(std::string_view in, int vocab) {
  std::vector<uint16_t> t;
  try {
    t = fp4::token_shard_from_bytes(in, vocab, "cache/0123456789abcdef/train.bin");
  } catch (const fp4::UserError&) {
    return;
  }
  for (uint16_t id : t) FUZZ_CHECK(id < vocab, "an id at or above the vocabulary was accepted");
  FUZZ_CHECK(fp4::token_shard_to_bytes(t, vocab) == in, "accepted shard re-writes to other bytes");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = fuzz::bytes(data, size);
  check(in, 4096);
  if (size >= 16) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(data[12 + i]) << (8 * i);
    // prepare_tokens takes vocab sizes 256..65535 (uint16 ids).
    if (v >= 256 && v <= 65535 && v != 4096) check(in, static_cast<int>(v));
  }
  return 0;
}
