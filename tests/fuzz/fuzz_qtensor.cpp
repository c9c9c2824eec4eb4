// Fuzz target: QTensor files (safetensors; `fp4train quant --save`), through
// qtensor_from_bytes, the code of load_safetensors. Also dequantizes what it accepts (a
// reader must not hand out a tensor whose codes or scales do not cover its shape).
// Property: an accepted QTensor re-saves (qtensor_to_bytes) to bytes that read back to the
// same QTensor and re-save to the same bytes; with --exact (files save_safetensors wrote:
// the seeds) the re-saved bytes are the input's.
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/numerics/qtensor.h"
#include "fuzz_common.h"

namespace {
bool same(const fp4::QTensor& a, const fp4::QTensor& b) {
  return a.rows == b.rows && a.cols == b.cols && a.block == b.block && a.two_d == b.two_d &&
         a.scale_format == b.scale_format && a.scale_rule == b.scale_rule &&
         a.element_format == b.element_format && fuzz::same_bits(a.decode_scale, b.decode_scale) &&
         fuzz::same_bits(a.reference, b.reference) && fuzz::same_bits(a.target, b.target) &&
         a.packed == b.packed && a.scale_codes == b.scale_codes && a.facts == b.facts;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = fuzz::bytes(data, size);
  fp4::QTensor t;
  try {
    t = fp4::qtensor_from_bytes(in, "fuzz.safetensors");
  } catch (const fp4::UserError&) {
    return 0;
  }
  if (t.rows * t.cols <= (int64_t{1} << 22)) {
    std::vector<float> x(static_cast<size_t>(t.rows * t.cols));
    fp4::dequantize(t, x.data());
  }
  const std::string y = fp4::qtensor_to_bytes(t);
  fp4::QTensor t2;
  try {
    t2 = fp4::qtensor_from_bytes(y, "resaved.safetensors");
  } catch (const fp4::UserError& e) {
    FUZZ_CHECK(false, std::string("a re-saved QTensor does not load: ") + e.what());
  }
  FUZZ_CHECK(same(t, t2), "the re-saved QTensor reads back to another QTensor");
  FUZZ_CHECK(fp4::qtensor_to_bytes(t2) == y, "re-saving is not a fixed point");
  if (g_fuzz_exact) FUZZ_CHECK(y == in, "a QTensor save_safetensors wrote re-saves to other bytes");
  return 0;
}
