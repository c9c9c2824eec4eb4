// Counter-based SR random bytes: Random123 Philox4x32-10 (r123::Philox4x32).
// Contract: philox.h and docs/numerics.md "Rounding a magnitude" (SR bits keyed by
// seed, step, layer, operand, GEMM and element).
#include "fp4/numerics/philox.h"

#include <Random123/philox.h>

namespace fp4 {

namespace {

using Gen = r123::Philox4x32;  // Philox4x32_R<10>

/// Key (seed low word, seed high word).
Gen::key_type make_key(const SrKey& k) {
  Gen::key_type key = {{static_cast<uint32_t>(k.seed), static_cast<uint32_t>(k.seed >> 32)}};
  return key;
}

/// Counter (index / 16, step, layer·2^8 + operand·2^4 + gemm, 0x5352 "SR"). The first word is
/// the low 32 bits of index / 16, so streams are distinct for the first 2^36 elements of an
/// operand (far above any operand size here).
/// `tag` is the stream's purpose: 0x5352 (element SR) or kEdenTag (MS-EDEN scale SR).
Gen::ctr_type make_ctr(const SrKey& k, uint64_t block16, uint32_t tag = 0x5352u) {
  Gen::ctr_type ctr = {{static_cast<uint32_t>(block16), k.step,
                        (k.layer << 8) + (k.operand << 4) + k.gemm, (k.micro << 16) + tag}};
  return ctr;
}

/// Byte b (0..15) of the 128-bit output, the four 32-bit words taken little-endian.
inline uint8_t byte_of(const Gen::ctr_type& out, unsigned b) {
  return static_cast<uint8_t>(out.v[b >> 2] >> (8 * (b & 3)));
}

}  // namespace

uint8_t sr_byte(const SrKey& key, uint64_t index) {
  Gen gen;
  const Gen::ctr_type out = gen(make_ctr(key, index / 16), make_key(key));
  return byte_of(out, static_cast<unsigned>(index % 16));
}

void sr_bytes(const SrKey& key, uint64_t first, uint64_t n, uint8_t* out) {
  if (n == 0) return;
  Gen gen;
  const Gen::key_type k = make_key(key);
  uint64_t i = first;
  const uint64_t end = first + n;
  while (i < end) {
    const uint64_t blk = i / 16;
    const Gen::ctr_type r = gen(make_ctr(key, blk), k);
    const uint64_t blk_end = (blk + 1) * 16 < end ? (blk + 1) * 16 : end;
    for (; i < blk_end; ++i) *out++ = byte_of(r, static_cast<unsigned>(i % 16));
  }
}

float eden_uniform(const SrKey& key, uint64_t index) {
  Gen gen;
  const Gen::ctr_type out = gen(make_ctr(key, index / 4, kEdenTag), make_key(key));
  const uint32_t w = out.v[index % 4];
  return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);  // exact: < 2^24, times 2^−24
}

}  // namespace fp4
