// GGUF's FP4 blocks (fp4/nn/gguf_layout.h pack_gguf_fp4) against ggml's own decoding,
// transcribed here from ggml-quants.c dequantize_row_mxfp4 / dequantize_row_nvfp4 and
// ggml-impl.h (E8M0 half, UE4M3 half, kvalues = 2·E2M1): the packed bytes decode to exactly
// the values fp4train's quantizer gives, on random and adversarial weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/nn/gguf_layout.h"
#include "fp4/numerics/block_quant.h"

namespace {
using fp4::BlockQuantSpec;
using fp4::QuantizedTensor;
using fp4::gguf::TensorType;

// ggml-common.h kvalues_mxfp4: twice the E2M1 value of each 4-bit code.
constexpr int8_t kValues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float e8m0_half(uint8_t e) { return e == 0 ? 0x1p-128f : std::ldexp(1.0f, int(e) - 128); }
float ue4m3_half(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int exp = (x >> 3) & 0xF, man = x & 7;
  const float raw = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + man / 8.0f, exp - 7);
  return raw * 0.5f;
}

// ggml's decoding of one row of K values packed as `type`.
std::vector<float> ggml_decode(const uint8_t* p, int64_t K, TensorType type) {
  std::vector<float> y(K);
  if (type == TensorType::MXFP4) {
    for (int64_t i = 0; i < K / 32; ++i, p += 17) {
      const float d = e8m0_half(p[0]);
      for (int j = 0; j < 16; ++j) {
        y[i * 32 + j] = kValues[p[1 + j] & 0xF] * d;
        y[i * 32 + j + 16] = kValues[p[1 + j] >> 4] * d;
      }
    }
  } else {
    for (int64_t i = 0; i < K / 64; ++i, p += 36)
      for (int s = 0; s < 4; ++s) {
        const float d = ue4m3_half(p[s]);
        for (int j = 0; j < 8; ++j) {
          y[i * 64 + s * 16 + j] = kValues[p[4 + s * 8 + j] & 0xF] * d;
          y[i * 64 + s * 16 + j + 8] = kValues[p[4 + s * 8 + j] >> 4] * d;
        }
      }
  }
  return y;
}

// Random weights with adversarial rows: all zeros, one huge element, negative zeros, ties.
std::vector<float> weights(int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w(N * K);
  for (float& v : w) v = nd(rng);
  for (int64_t j = 0; j < K; ++j) w[j] = 0.0f;                                      // row 0: zeros
  for (int64_t j = 0; j < K; ++j) w[K + j] = j % 3 ? -0.0f : 0.25f * float(j % 7);  // ties, -0
  w[2 * K + 5] = 3.0e4f;                                                            // one outlier
  return w;
}

void expect_packs_as_ggml_decodes(const BlockQuantSpec& spec, TensorType type, int64_t N,
                                  int64_t K) {
  const std::vector<float> w = weights(N, K, 7 + uint32_t(K));
  const QuantizedTensor q = fp4::quantize_blocks(w.data(), N, K, spec,
                                                 fp4::tensor_amax(w.data(), N * K), nullptr);
  std::vector<float> want(N * K);
  fp4::dequantize(q, want.data());
  // The whole tensor, and a row range (as SwiGLU's halves and the packing of one of them).
  for (const auto& [row0, rows] : {std::pair<int64_t, int64_t>{0, N}, {N / 2, N - N / 2}}) {
    const std::vector<uint8_t> b = fp4::pack_gguf_fp4(q, row0, rows, type, "test");
    const int64_t row_bytes = K / (type == TensorType::MXFP4 ? 32 : 64) *
                              (type == TensorType::MXFP4 ? 17 : 36);
    ASSERT_EQ(int64_t(b.size()), rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> y = ggml_decode(b.data() + r * row_bytes, K, type);
      for (int64_t j = 0; j < K; ++j) {
        // NVFP4's tensor decode scale gd is the separate .scale tensor: ggml applies it to the
        // output, fp4train's x̂ = q·(c_b·gd); compare x̂ with the ggml value times gd in double.
        const double got = type == TensorType::NVFP4 ? double(y[j]) * q.gd : double(y[j]);
        const double ref = want[(row0 + r) * K + j];
        ASSERT_NEAR(got, ref, std::fabs(ref) * 1.2e-7) << "row " << row0 + r << " col " << j;
        if (type == TensorType::MXFP4) {
          ASSERT_EQ(float(got), float(ref));  // exact: no tensor scale
        }
      }
    }
  }
}

TEST(GgufFp4, MxfpBlocksDecodeAsFp4trainQuantizes) {
  BlockQuantSpec s;
  s.scale_format = fp4::ScaleFormat::UE8M0;
  s.scale_rule = fp4::ScaleRule::MxTe;
  s.block = 32;
  expect_packs_as_ggml_decodes(s, TensorType::MXFP4, 6, 96);
  s.scale_rule = fp4::ScaleRule::MxOcp;
  expect_packs_as_ggml_decodes(s, TensorType::MXFP4, 5, 64);
}

TEST(GgufFp4, NvfpBlocksAndTilesDecodeAsFp4trainQuantizes) {
  BlockQuantSpec s;
  s.scale_format = fp4::ScaleFormat::E4M3;
  s.block = 16;
  expect_packs_as_ggml_decodes(s, TensorType::NVFP4, 7, 128);  // 1-D blocks
  s.two_d = true;
  expect_packs_as_ggml_decodes(s, TensorType::NVFP4, 40, 64);  // 16 × 16 tiles, ragged rows
}

TEST(GgufFp4, OtherSpecsAreRefusedByName) {
  const std::vector<float> w = weights(4, 96, 1);
  BlockQuantSpec ue5m3;  // the paper's: UE5M3, block 16
  const QuantizedTensor q = fp4::quantize_blocks(w.data(), 4, 96, ue5m3,
                                                 fp4::tensor_amax(w.data(), w.size()), nullptr);
  EXPECT_THROW(fp4::pack_gguf_fp4(q, 0, 4, TensorType::NVFP4, "x"), fp4::UserError);
  EXPECT_THROW(fp4::pack_gguf_fp4(q, 0, 4, TensorType::MXFP4, "x"), fp4::UserError);
  BlockQuantSpec e4m3;
  e4m3.scale_format = fp4::ScaleFormat::E4M3;
  const QuantizedTensor q2 = fp4::quantize_blocks(w.data(), 4, 96, e4m3,
                                                  fp4::tensor_amax(w.data(), w.size()), nullptr);
  try {
    fp4::pack_gguf_fp4(q2, 0, 4, TensorType::NVFP4, "layers.0.mixer.q_proj");
    ADD_FAILURE() << "K = 96 accepted";
  } catch (const fp4::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("96 is not a multiple of 64"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("layers.0.mixer.q_proj"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fp4::pack_gguf_fp4(q2, 3, 2, TensorType::MXFP4, "x"), fp4::UserError);
  EXPECT_THROW(fp4::pack_gguf_fp4(q2, 0, 4, TensorType::F32, "x"), std::invalid_argument);
}

}  // namespace
