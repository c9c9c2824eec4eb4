// The block-scaled operands of the decoded-BF16 GEMM (docs/gemm.md "Decoded FP4 on the BF16
// GEMM"): quantize_block_scaled (the scalar twin, block_quant.h) against an independent
// composition from quantize_blocks' codes and scales, and the fast kernels
// quantize_block_scaled_fast / quantize_block_scaled_transposed_fast (quant_fast.h) against the
// twin by memcmp, on every SIMD target, at 1 and 3 threads, on random and adversarial inputs.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/numerics/bf16.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/numerics/quant_fast.h"
#include "support/quant_test_inputs.h"

using namespace fp4;
using namespace fp4::testing;

namespace {

const SrKey* key_for(const BlockQuantSpec& s) { return s.rounding == Rounding::SR8 ? &kKey : nullptr; }

/// out[i] = e2m1_decode(code_i) · c_b from quantize_blocks' own fields, read element by element
/// (rows of 2-D tiles share a tile's scale): the definition, written without dequantize.
std::vector<float> by_definition(const std::vector<float>& x, int64_t rows, int64_t cols,
                                 const BlockQuantSpec& s, float g) {
  const QuantizedTensor q = quantize_blocks(x.data(), rows, cols, s, g, key_for(s));
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t br = s.two_d ? r / s.block : r, bc = c / s.block;
      out[size_t(r * cols + c)] = e2m1_decode(q.codes[size_t(r * cols + c)]) *
                                  q.scales[size_t(br * q.block_cols + bc)];
    }
  return out;
}

std::vector<float> twin(const std::vector<float>& x, int64_t rows, int64_t cols,
                        const BlockQuantSpec& s, float g) {
  std::vector<float> out(x.size());
  quantize_block_scaled(x.data(), rows, cols, s, g, key_for(s), out.data());
  return out;
}

/// The twin of the quantize-transpose: t = xᵀ, the transform if any, then the row twin.
std::vector<float> twin_t(const std::vector<float>& x, int64_t rows, int64_t cols,
                          const BlockQuantSpec& s, float g, const HadamardTransform* h) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  if (h) hadamard_rows(t.data(), cols, rows, *h);
  return twin(t, cols, rows, s, g);
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const int64_t i = first_diff(got, want);
  EXPECT_EQ(i, -1) << what << ": first difference at " << i << ": got "
                   << (i >= 0 ? got[size_t(i)] : 0.f) << " want " << (i >= 0 ? want[size_t(i)] : 0.f);
}

/// The BF16-output variants against the FP32 twin: got[i] == fp4::bf16_bits(want[i]) (the
/// scalar conversion, element by element).
void expect_bf16_of(const std::vector<uint16_t>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != bf16_bits(want[i])) {
      ADD_FAILURE() << what << " (BF16 out): first difference at " << i << ": got 0x" << std::hex
                    << got[i] << " want 0x" << bf16_bits(want[i]) << std::dec << " (" << want[i] << ")";
      return;
    }
}

/// n BF16 outputs in a 64-byte aligned allocation (as the streamed stores need), filled with a
/// marker (0x7777) so that an output left unwritten shows.
std::unique_ptr<uint16_t, decltype(&std::free)> aligned_bf16(size_t n) {
  std::unique_ptr<uint16_t, decltype(&std::free)> p(
      static_cast<uint16_t*>(std::aligned_alloc(64, (n * 2 + 63) / 64 * 64)), &std::free);
  std::fill(p.get(), p.get() + n, uint16_t{0x7777});
  return p;
}

/// Runs fn on every SIMD target at 1 and 3 threads.
template <class F>
void each_target_and_team(F&& fn) {
  const int saved = omp_get_max_threads();
  for (const std::string& t : quant_fast_targets()) {
    quant_fast_use_target(t);
    for (int team : {1, 3}) {
      omp_set_num_threads(team);
      SCOPED_TRACE("target " + t + ", " + std::to_string(team) + " threads");
      fn();
    }
  }
  quant_fast_use_target("");
  omp_set_num_threads(saved);
}

BlockQuantSpec mx_spec(ScaleRule rule, Rounding r) {
  BlockQuantSpec s = make_spec(ScaleFormat::UE8M0, r, 32);
  s.scale_rule = rule;
  return s;
}

TEST(BlockScaled, TwinIsTheDefinition) {
  // q·c_b by the definition, for every format, rounding, layout and references that saturate.
  const auto x = make_data(Dist::Cauchy, 61 * 97, 3);
  const float amax = tensor_amax(x.data(), int64_t(x.size()));
  for (ScaleFormat f : kFormats)
    for (Rounding r : kRoundings)
      for (bool two_d : {false, true})
        for (float g : {amax, amax * 1e-3f, amax * 1e3f, 0.f}) {
          const BlockQuantSpec s = make_spec(f, r, 16, two_d);
          expect_same_bits(twin(x, 61, 97, s, g), by_definition(x, 61, 97, s, g),
                           spec_str(s) + " g=" + std::to_string(g));
        }
  for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp}) {
    const BlockQuantSpec s = mx_spec(rule, Rounding::RNE);
    expect_same_bits(twin(x, 61, 97, s, amax), by_definition(x, 61, 97, s, amax), "MX");
  }
}

TEST(BlockScaled, DequantizeBlockScaledOfAQuantizedTensor) {
  // the QuantizedTensor entry (decoded_bf16_gemm's) gives the definition's values and refuses
  // a row-scaled tensor (one decode scale per row)
  const auto x = make_data(Dist::Normal, 24 * 48, 6);
  const BlockQuantSpec s = make_spec(ScaleFormat::E4M3, Rounding::RNE, 16, true);
  const float g = tensor_amax(x.data(), int64_t(x.size()));
  QuantizedTensor q = quantize_blocks(x.data(), 24, 48, s, g, nullptr);
  std::vector<float> got(x.size());
  dequantize_block_scaled(q, got.data());
  expect_same_bits(got, by_definition(x, 24, 48, s, g), "dequantize_block_scaled");
  q.row_gd.assign(24, 1.f);
  EXPECT_THROW(dequantize_block_scaled(q, got.data()), std::invalid_argument);
}

TEST(BlockScaled, DecodeScaleIsQuantizeBlocksOwn) {
  const auto x = make_data(Dist::Normal, 16 * 32, 4);
  for (ScaleFormat f : kFormats)
    for (float g : {0.f, 1e-30f, 0.5f, 3.f, 1e30f, FLT_MAX}) {
      const BlockQuantSpec s = make_spec(f, Rounding::RNE);
      EXPECT_EQ(tensor_decode_scale(s, g), quantize_blocks(x.data(), 16, 32, s, g, nullptr).gd)
          << spec_str(s) << " g=" << g;
    }
  EXPECT_EQ(tensor_decode_scale(mx_spec(ScaleRule::MxTe, Rounding::RNE), 3.f), 1.f);
  EXPECT_THROW(tensor_decode_scale(make_spec(ScaleFormat::UE5M3, Rounding::RNE), -1.f),
               std::invalid_argument);
  EXPECT_THROW(tensor_decode_scale(make_spec(ScaleFormat::UE5M3, Rounding::RNE), NAN),
               std::invalid_argument);
}

TEST(BlockScaled, UE5M3AndE4M3ValuesAreExactInBf16) {
  // The claim the BF16 GEMM rests on: every q·c_b of E2M1 with UE5M3 or E4M3 scales is a BF16
  // value, nonzero ones at least 2^-18 in magnitude (UE5M3's smallest scale 2^-17 times 0.5).
  for (Dist d : kDists) {
    const auto x = make_data(d, 64 * 128, 11);
    const float amax = tensor_amax(x.data(), int64_t(x.size()));
    for (ScaleFormat f : {ScaleFormat::UE5M3, ScaleFormat::UE5M3_PTX, ScaleFormat::E4M3})
      for (float g : {amax, amax * 1e-4f, std::min(amax * 1e4f, FLT_MAX)}) {
        const auto v = twin(x, 64, 128, make_spec(f, Rounding::SR8), g);
        for (float e : v) {
          ASSERT_EQ(bf16_value(bf16_bits(e)), e) << spec_str(make_spec(f, Rounding::SR8));
          if (e != 0.f) {
            ASSERT_GE(std::fabs(e), std::ldexp(1.f, -18));
          }
        }
      }
  }
}

TEST(BlockScaled, RelatesToTheDecodedOperand) {
  // x̂ = q·d_b with d_b = fl(c_b·gd): fl(q·c_b · fl(c_b·gd)/c_b) is not a contract, but q·c_b / c_b
  // is the E2M1 value q, and q·d_b rebuilt from it equals dequantize's x̂ bit for bit.
  const auto x = make_data(Dist::Normal, 32 * 64, 5);
  const float g = tensor_amax(x.data(), int64_t(x.size()));
  const BlockQuantSpec s = make_spec(ScaleFormat::UE5M3, Rounding::RNE);
  const QuantizedTensor q = quantize_blocks(x.data(), 32, 64, s, g, nullptr);
  std::vector<float> xhat(x.size());
  dequantize(q, xhat.data());
  const auto v = twin(x, 32, 64, s, g);
  for (size_t i = 0; i < v.size(); ++i) {
    const float c = q.scales[i / 16];
    const float qv = v[i] / c;  // exact: q·c_b has the bits of q times a scale of ≤ 4 bits
    ASSERT_EQ(qv, e2m1_decode(q.codes[i])) << i;
    ASSERT_EQ(qv * (c * q.gd), xhat[i]) << i;
  }
}

TEST(BlockScaled, FastRowsBitExact) {
  struct Case {
    std::vector<float> x;
    int64_t rows, cols;
    BlockQuantSpec s;
    float g;
    std::vector<float> want;
  };
  std::vector<Case> cases;
  int k = 0;
  const int64_t shapes[][2] = {{67, 272}, {33, 517}, {128, 256}};
  for (ScaleFormat f : kFormats)
    for (Rounding r : kRoundings)
      for (bool two_d : {false, true})
        for (Dist d : kDists) {
          Case c;
          c.rows = shapes[k % 3][0];
          c.cols = shapes[k % 3][1];
          c.x = make_data(d, size_t(c.rows * c.cols), 100 + k);
          c.s = make_spec(f, r, k % 5 == 4 ? 32 : 16, two_d);
          const float gm[] = {1.f, 1e-3f, 1e3f};
          c.g = std::min(tensor_amax(c.x.data(), int64_t(c.x.size())) * gm[k % 3], FLT_MAX);
          c.want = twin(c.x, c.rows, c.cols, c.s, c.g);
          cases.push_back(std::move(c));
          ++k;
        }
  for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp})
    for (Rounding r : {Rounding::RNE, Rounding::SR8}) {
      Case c;
      c.rows = 40, c.cols = 200;
      c.x = make_data(Dist::Cauchy, 8000, 900 + k++);
      c.s = mx_spec(rule, r);
      c.g = 1.f;
      c.want = twin(c.x, c.rows, c.cols, c.s, c.g);
      cases.push_back(std::move(c));
    }
  {  // Four Over Six (the row kernel's candidate scales)
    Case c;
    c.rows = 48, c.cols = 160;
    c.x = make_data(Dist::Normal, 48 * 160, 77);
    c.s = make_spec(ScaleFormat::E4M3, Rounding::RNE);
    c.s.four_over_six = FourOverSix::MSE;
    c.g = tensor_amax(c.x.data(), int64_t(c.x.size()));
    c.want = twin(c.x, c.rows, c.cols, c.s, c.g);
    cases.push_back(std::move(c));
  }
  each_target_and_team([&] {
    for (const Case& c : cases) {
      std::vector<float> got(c.x.size(), 7.f);
      quantize_block_scaled_fast(c.x.data(), c.rows, c.cols, c.s, c.g, key_for(c.s), got.data());
      expect_same_bits(got, c.want, spec_str(c.s) + " g=" + std::to_string(c.g));
      std::vector<uint16_t> got16(c.x.size(), 0x7777);
      quantize_block_scaled_fast(c.x.data(), c.rows, c.cols, c.s, c.g, key_for(c.s), got16.data());
      expect_bf16_of(got16, c.want, spec_str(c.s) + " g=" + std::to_string(c.g));
    }
  });
}

TEST(BlockScaled, FastTransposedBitExact) {
  const auto x = make_data(Dist::Cauchy, 256 * 72, 21);
  const auto y = make_data(Dist::Normal, 250 * 33, 22);  // tokens not a multiple of 16
  const HadamardTransform te = HadamardTransform::te16();
  const HadamardTransform te_bf16 = HadamardTransform::te16(RhtPrecision::BF16);
  const HadamardTransform rnd = HadamardTransform::make(16, HadamardSigns::PerStep, RhtPrecision::FP32, 9, 2, 5);
  const HadamardTransform big = HadamardTransform::make(64, HadamardSigns::PerCall, RhtPrecision::FP32, 9, 2, 5, 1);
  struct Case {
    const std::vector<float>* x;
    int64_t rows, cols;
    BlockQuantSpec s;
    const HadamardTransform* h;
    float g;
    std::vector<float> want;
  };
  std::vector<Case> cases;
  for (ScaleFormat f : kFormats)
    for (Rounding r : kRoundings) {
      for (const HadamardTransform* h : {(const HadamardTransform*)nullptr, &te, &te_bf16, &rnd, &big}) {
        Case c{&x, 256, 72, make_spec(f, r), h, 0.f, {}};
        // the reference of the operand as quantized: amax of the (transformed) transpose
        c.g = h ? amax_hadamard_transposed(x.data(), 256, 72, *h) : tensor_amax(x.data(), int64_t(x.size()));
        c.want = twin_t(x, 256, 72, c.s, c.g, h);
        cases.push_back(std::move(c));
      }
      Case c{&y, 250, 33, make_spec(f, r, 16, f == ScaleFormat::E4M3), nullptr,
             tensor_amax(y.data(), int64_t(y.size())) * 0.01f, {}};  // 2-D: composed path
      c.want = twin_t(y, 250, 33, c.s, c.g, nullptr);
      cases.push_back(std::move(c));
    }
  each_target_and_team([&] {
    for (const Case& c : cases) {
      std::vector<float> got(c.x->size(), 7.f);
      quantize_block_scaled_transposed_fast(c.x->data(), c.rows, c.cols, c.s, c.g, key_for(c.s), c.h,
                                            got.data());
      const std::string what = spec_str(c.s) + (c.h ? " H" + std::to_string(c.h->n) : " no transform");
      expect_same_bits(got, c.want, what);
      // BF16 out, with plain and with streaming stores (forced; the output from a 64-byte
      // aligned allocation, as the kernel's whole-line stores need)
      for (int64_t min_bytes : {int64_t{-1}, int64_t{0}}) {
        const int64_t saved = quant_fast_stream_min_bytes(min_bytes);
        const auto got16 = aligned_bf16(c.x->size());
        quantize_block_scaled_transposed_fast(c.x->data(), c.rows, c.cols, c.s, c.g, key_for(c.s),
                                              c.h, got16.get());
        quant_fast_stream_min_bytes(saved);
        expect_bf16_of(std::vector<uint16_t>(got16.get(), got16.get() + c.x->size()), c.want,
                       what + (min_bytes == 0 ? " (streamed)" : ""));
      }
    }
  });
}

TEST(BlockScaled, Bf16OutputEveryBlockRuleAndStoreMode) {
  // The BF16-output variants across what changes their tiles or takes another path: blocks of
  // 8, 16, 24 and 32 (the quantize-transpose's tiles of 32 rows hold 4, 2, 1 or 1 blocks;
  // 24 keeps 48), the MX rule, Four Over Six and E2M3 elements (composed paths), the RHT
  // with blocks of 8, and token counts that are (256) and are not (240) multiples of 32, with
  // plain and forced streaming stores: each equal to fp4::bf16_bits of the FP32 twin.
  const HadamardTransform te = HadamardTransform::te16();
  struct Case {
    BlockQuantSpec s;
    const HadamardTransform* h;
    std::string name;
  };
  std::vector<Case> cases;
  for (int b : {8, 16, 24, 32})
    for (Rounding r : {Rounding::RNE, Rounding::SR8})
      cases.push_back({make_spec(ScaleFormat::UE5M3, r, b), nullptr, "B" + std::to_string(b)});
  cases.push_back({mx_spec(ScaleRule::MxOcp, Rounding::SR8), nullptr, "mx-ocp"});
  BlockQuantSpec fos = make_spec(ScaleFormat::E4M3, Rounding::RNE);
  fos.four_over_six = FourOverSix::MSE;
  cases.push_back({fos, nullptr, "four-over-six"});
  BlockQuantSpec scalar = make_spec(ScaleFormat::E4M3, Rounding::RNE);
  scalar.element = parse_element_format("e2m3");  // no SIMD kernel: the scalar twin, converted
  cases.push_back({scalar, nullptr, "e2m3 elements"});
  cases.push_back({make_spec(ScaleFormat::UE5M3, Rounding::SR8, 8), &te, "B8 RHT"});
  for (const int64_t rows : {256, 240}) {
    const int64_t cols = 40;
    const auto x = make_data(Dist::Cauchy, size_t(rows * cols), 31 + rows);
    for (const Case& c : cases) {
      const float g = c.s.scale_rule != ScaleRule::TensorScaled ? 1.f
                      : c.h ? amax_hadamard_transposed(x.data(), rows, cols, *c.h)
                            : tensor_amax(x.data(), rows * cols);
      const auto want_t = twin_t(x, rows, cols, c.s, g, c.h);
      const auto want_r = twin(x, rows, cols, c.s, g);
      const std::string what = c.name + " rows=" + std::to_string(rows);
      each_target_and_team([&] {
        for (int64_t min_bytes : {int64_t{-1}, int64_t{0}}) {
          const int64_t saved = quant_fast_stream_min_bytes(min_bytes);
          const auto got = aligned_bf16(x.size());
          quantize_block_scaled_transposed_fast(x.data(), rows, cols, c.s, g, key_for(c.s), c.h,
                                                got.get());
          const std::string m = min_bytes == 0 ? " (streamed)" : "";
          expect_bf16_of(std::vector<uint16_t>(got.get(), got.get() + x.size()), want_t, what + " T" + m);
          if (!c.h) {
            std::fill(got.get(), got.get() + x.size(), uint16_t{0x7777});
            quantize_block_scaled_fast(x.data(), rows, cols, c.s, g, key_for(c.s), got.get());
            expect_bf16_of(std::vector<uint16_t>(got.get(), got.get() + x.size()), want_r, what + m);
          }
          quant_fast_stream_min_bytes(saved);
        }
      });
    }
  }
}

TEST(BlockScaled, FastAdversarialBitExact) {
  std::mt19937_64 rng(12);
  const auto inputs = adversarial_inputs(rng);
  each_target_and_team([&] {
    for (const auto& [name, v] : inputs) {
      const float amax = tensor_amax(v.data(), int64_t(v.size()));
      for (float g : {amax, 0.f, 1e-38f, std::numeric_limits<float>::denorm_min(), FLT_MAX})
        for (ScaleFormat f : kFormats)
          for (Rounding r : {Rounding::RNE, Rounding::SR8}) {
            const int64_t cols = 48, rows = std::min<int64_t>(int64_t(v.size()) / cols, 64);
            const std::vector<float> x(v.begin(), v.begin() + rows * cols);
            for (bool two_d : {false, true}) {
              const BlockQuantSpec s = make_spec(f, r, 16, two_d);
              std::vector<float> got(x.size());
              quantize_block_scaled_fast(x.data(), rows, cols, s, g, key_for(s), got.data());
              const auto want = twin(x, rows, cols, s, g);
              expect_same_bits(got, want, name + " " + spec_str(s));
              std::vector<uint16_t> got16(x.size());
              quantize_block_scaled_fast(x.data(), rows, cols, s, g, key_for(s), got16.data());
              expect_bf16_of(got16, want, name + " " + spec_str(s));
            }
            const BlockQuantSpec s = make_spec(f, r);
            std::vector<float> got(x.size());
            quantize_block_scaled_transposed_fast(x.data(), rows, cols, s, g, key_for(s), nullptr,
                                                  got.data());
            const auto want = twin_t(x, rows, cols, s, g, nullptr);
            expect_same_bits(got, want, name + " T " + spec_str(s));
            std::vector<uint16_t> got16(x.size());
            quantize_block_scaled_transposed_fast(x.data(), rows, cols, s, g, key_for(s), nullptr,
                                                  got16.data());
            expect_bf16_of(got16, want, name + " T " + spec_str(s));
          }
    }
  });
}

TEST(BlockScaled, InPlaceAndErrors) {
  auto x = make_data(Dist::Normal, 20 * 64, 8);
  const BlockQuantSpec s = make_spec(ScaleFormat::UE5M3, Rounding::SR8);
  const float g = tensor_amax(x.data(), int64_t(x.size()));
  const auto want = twin(x, 20, 64, s, g);
  quantize_block_scaled_fast(x.data(), 20, 64, s, g, &kKey, x.data());  // out aliases x exactly
  expect_same_bits(x, want, "in place");
  x[77] = NAN;
  std::vector<float> out(x.size());
  try {
    quantize_block_scaled_fast(x.data(), 20, 64, s, g, &kKey, out.data());
    ADD_FAILURE() << "no throw for a NaN";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("quantize_block_scaled_fast"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_block_scaled_fast(x.data(), 20, 64, s, g, nullptr, out.data()),
               std::invalid_argument);  // SR8 without a key
  std::vector<uint16_t> out16(x.size());
  try {  // the BF16-output variant: the same errors, naming the same function
    quantize_block_scaled_fast(x.data(), 20, 64, s, g, &kKey, out16.data());
    ADD_FAILURE() << "no throw for a NaN (BF16 out)";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("quantize_block_scaled_fast"), std::string::npos) << e.what();
  }
  try {
    quantize_block_scaled_transposed_fast(x.data(), 64, 20, s, g, &kKey, nullptr, out16.data());
    ADD_FAILURE() << "no throw for a NaN (BF16 out, transposed)";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("quantize_block_scaled_transposed_fast"), std::string::npos)
        << e.what();
  }
  const HadamardTransform te = HadamardTransform::te16();
  EXPECT_THROW(quantize_block_scaled_transposed_fast(x.data(), 20, 64, s, g, &kKey, &te, out.data()),
               std::invalid_argument);  // 20 tokens: not a multiple of 16
}

}  // namespace
