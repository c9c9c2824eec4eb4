// The Linear under fp4.row_scaled_activation (docs/numerics.md "Per-row reference"): fprop
// and wgrad against hand-built references (quantize per row with the scalar functions, decode,
// the same FP32 GEMM) bit for bit, the BF16 boundary, inference policies, telemetry, and the
// recipe key's parsing, serialisation and errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/gemm/gemm.h"
#include "fp4/nn/linear.h"
#include "fp4/numerics/bf16.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/hadamard.h"
#include "fp4/recipe/recipe.h"

using namespace fp4;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

// nvfp4-te's numerics (E4M3 scales, current scaling, 16×16 W tiles, SR dY) with the key.
Recipe row_scaled_recipe(bool rht) {
  Recipe r;
  r.name = "row-scaled";
  r.mode = LinearMode::FP4;
  r.scale_format = ScaleFormat::E4M3;
  r.block = 16;
  r.weight_2d = true;
  r.amax_interval = 1;
  r.rht_wgrad = rht;
  r.round_dy = Rounding::SR8;
  r.row_scaled_activation = true;
  return r;
}

// X [M, K] with rows spanning 2^±12 around N(0, 1): per-row and per-tensor scaling differ.
std::vector<float> spread_rows(int64_t M, int64_t K, uint32_t seed) {
  auto X = randn(size_t(M * K), seed);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) X[r * K + k] *= std::ldexp(1.f, int(r % 25) - 12);
  return X;
}

// x̂ of x [rows, cols] quantized with one reference per row (its current amax), scalar path.
std::vector<float> qdq_rows(const std::vector<float>& x, int64_t rows, int64_t cols,
                            const BlockQuantSpec& s) {
  std::vector<float> g(static_cast<size_t>(rows)), out(x.size());
  row_amax(x.data(), rows, cols, g.data());
  const QuantizedTensor q = quantize_blocks_rows(x.data(), rows, cols, s, g.data(), nullptr);
  dequantize(q, out.data());
  return out;
}

std::vector<float> qdq_tensor(const std::vector<float>& x, int64_t rows, int64_t cols,
                              const BlockQuantSpec& s, float g, const SrKey* key) {
  const QuantizedTensor q = quantize_blocks(x.data(), rows, cols, s, g, key);
  std::vector<float> out(x.size());
  dequantize(q, out.data());
  return out;
}

std::vector<float> transpose(const std::vector<float>& a, int64_t r, int64_t c) {
  std::vector<float> t(a.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) t[j * r + i] = a[i * c + j];
  return t;
}

TEST(LinearRowScaled, FpropAndWgradEqualTheirHandBuiltReferencesBitForBit) {
  const int64_t M = 48, K = 40, N = 24;  // K, N not multiples of 16
  for (bool rht : {false, true}) {
    SCOPED_TRACE(rht ? "RHT" : "no RHT");
    const Recipe r = row_scaled_recipe(rht);
    const auto X = spread_rows(M, K, 1), W = randn(size_t(N * K), 2, 0.1f),
               dY = randn(size_t(M * N), 3, 1e-3f);
    std::vector<float> dW(size_t(N * K), 0.f), Y(size_t(M * N)), dX(size_t(M * K), 0.f);
    nn::Linear lin(7, K, N, LinearPlan::uniform(r, LinearMode::FP4));
    lin.bind(const_cast<float*>(W.data()), dW.data());
    nn::StepContext ctx;
    ctx.step = 3;
    ctx.seed = 99;
    lin.forward(X.data(), Y.data(), M, ctx);
    lin.backward(dY.data(), dX.data(), M, ctx);

    // fprop: X per row (scalar quantize_blocks_rows), W per tensor, the same FP32 GEMM.
    const auto Xq = qdq_rows(X, M, K, r.spec_x());
    const auto Wq = qdq_tensor(W, N, K, r.spec_w(), tensor_amax(W.data(), N * K), nullptr);
    std::vector<float> Yref(size_t(M * N));
    sgemm(false, true, M, N, K, 1.f, Xq.data(), K, Wq.data(), K, 0.f, Yref.data(), N);
    EXPECT_TRUE(same_bits(Y, Yref)) << "fprop";
    EXPECT_EQ(lin.refs().g_x, tensor_amax(X.data(), M * K));

    // wgrad: dYᵀ per tensor (its RHT amax), Xᵀ per row of the (transformed) Xᵀ.
    auto dYt = transpose(dY, M, N), Xt = transpose(X, M, K);
    if (rht) rht16_rows(dYt.data(), N, M), rht16_rows(Xt.data(), K, M);
    const SrKey kd{99, 3, 7, 2, 2};
    const auto dYtq = qdq_tensor(dYt, N, M, r.spec_dy(), tensor_amax(dYt.data(), N * M), &kd);
    const auto Xtq = qdq_rows(Xt, K, M, r.spec_x());
    std::vector<float> dWref(size_t(N * K), 0.f);
    sgemm(false, true, N, K, M, 1.f, dYtq.data(), M, Xtq.data(), M, 1.f, dWref.data(), K);
    EXPECT_TRUE(same_bits(dW, dWref)) << "wgrad";

    // dgrad does not read X: the per-tensor layer's dX, bit for bit.
    Recipe plain = r;
    plain.row_scaled_activation = false;
    std::vector<float> dW2(size_t(N * K), 0.f), Y2(size_t(M * N)), dX2(size_t(M * K), 0.f);
    nn::Linear ref(7, K, N, LinearPlan::uniform(plain, LinearMode::FP4));
    ref.bind(const_cast<float*>(W.data()), dW2.data());
    ref.forward(X.data(), Y2.data(), M, ctx);
    ref.backward(dY.data(), dX2.data(), M, ctx);
    EXPECT_TRUE(same_bits(dX, dX2)) << "dgrad";
    EXPECT_FALSE(same_bits(Y, Y2)) << "per-row and per-tensor fprop coincide";
    EXPECT_FALSE(same_bits(dW, dW2)) << "per-row and per-tensor wgrad coincide";
    EXPECT_FALSE(lin.reference(nn::Role::X).has_value()) << "a per-row reference is never held";
  }
}

TEST(LinearRowScaled, Bf16BoundaryTakesTheRowAmaxesOfTheRoundedCopy) {
  const int64_t M = 32, K = 48, N = 16;
  Recipe on = row_scaled_recipe(true), off = row_scaled_recipe(true);
  on.bf16_boundary = true;
  const auto W = randn(size_t(N * K), 4, 0.1f);
  auto X = spread_rows(M, K, 5);
  X[3] = std::bit_cast<float>(0x3F808000u);  // a BF16 tie
  std::vector<float> Xr(X.size());
  round_bf16_array(X.data(), int64_t(X.size()), Xr.data());
  const auto dY = randn(size_t(M * N), 6, 1e-3f);
  std::vector<float> dWa(size_t(N * K), 0.f), dWb(size_t(N * K), 0.f), Ya(size_t(M * N)),
      Yb(size_t(M * N)), dXa(size_t(M * K), 0.f), dXb(size_t(M * K), 0.f);
  nn::Linear a(2, K, N, LinearPlan::uniform(on, LinearMode::FP4));
  nn::Linear b(2, K, N, LinearPlan::uniform(off, LinearMode::FP4));
  a.bind(const_cast<float*>(W.data()), dWa.data());
  b.bind(const_cast<float*>(W.data()), dWb.data());
  std::vector<float> dYr(dY.size());
  round_bf16_array(dY.data(), int64_t(dY.size()), dYr.data());
  nn::StepContext ctx;
  a.forward(X.data(), Ya.data(), M, ctx);
  b.forward(Xr.data(), Yb.data(), M, ctx);
  a.backward(dY.data(), dXa.data(), M, ctx);
  b.backward(dYr.data(), dXb.data(), M, ctx);
  EXPECT_TRUE(same_bits(Ya, Yb));
  EXPECT_TRUE(same_bits(dWa, dWb));
  EXPECT_TRUE(same_bits(dXa, dXb));
}

TEST(LinearRowScaled, InferenceCurrentIsPerRowAndHeldPoliciesAreRefused) {
  const int64_t M = 16, K = 32, N = 16;
  const Recipe r = row_scaled_recipe(false);
  const auto W = randn(size_t(N * K), 7, 0.1f), X = spread_rows(M, K, 8);
  std::vector<float> dW(size_t(N * K), 0.f), Yt(size_t(M * N)), Yi(size_t(M * N));
  nn::Linear lin(1, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(const_cast<float*>(W.data()), dW.data());
  nn::StepContext train;
  lin.forward(X.data(), Yt.data(), M, train);
  nn::StepContext inf;
  inf.training = false;
  inf.infer_ref = nn::InferenceRef::Current;
  lin.reset_inference();
  lin.forward(X.data(), Yi.data(), M, inf);
  EXPECT_TRUE(same_bits(Yt, Yi)) << "inference 'current' equals the training fprop";
  for (nn::InferenceRef p : {nn::InferenceRef::Replay, nn::InferenceRef::Calibrate}) {
    inf.infer_ref = p;
    try {
      lin.forward(X.data(), Yi.data(), M, inf);
      ADD_FAILURE() << "no error for a held inference policy";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("fp4.row_scaled_activation"), std::string::npos) << e.what();
    }
  }
  inf.infer_ref = nn::InferenceRef::LlamaQ8;  // X as Q8_0: unaffected
  EXPECT_NO_THROW(lin.forward(X.data(), Yi.data(), M, inf));
}

TEST(LinearRowScaled, TelemetryIsPerRow) {
  const int64_t M = 32, K = 32, N = 16;
  const Recipe r = row_scaled_recipe(true);
  const auto W = randn(size_t(N * K), 9, 0.1f), X = spread_rows(M, K, 10),
             dY = randn(size_t(M * N), 11, 1e-3f);
  std::vector<float> dW(size_t(N * K), 0.f), Y(size_t(M * N)), dX(size_t(M * K), 0.f);
  nn::Linear lin(1, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(const_cast<float*>(W.data()), dW.data());
  nn::StepContext ctx;
  ctx.telemetry = true;
  lin.forward(X.data(), Y.data(), M, ctx);
  lin.backward(dY.data(), dX.data(), M, ctx);
  ASSERT_TRUE(lin.telemetry().valid);
  std::vector<float> g(static_cast<size_t>(M));
  row_amax(X.data(), M, K, g.data());
  const QuantStats want = quant_stats_rows(X.data(), M, K, r.spec_x(), g.data(), nullptr);
  EXPECT_EQ(lin.telemetry().op[0].rel_error, want.rel_error);
  EXPECT_FALSE(lin.telemetry().op[0].has_staleness);
  EXPECT_FALSE(lin.telemetry().op[4].has_staleness);
  EXPECT_TRUE(lin.telemetry().op[1].has_staleness);  // W keeps its tensor reference
}

std::string recipe_error(const std::string& toml) {
  try {
    recipe_from_text(toml, "t.toml");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(LinearRowScaled, RecipeKeyParsesSerialisesAndRefusesWhatItCannotDo) {
  const std::string base = "[linear]\nmode = \"fp4\"\n[fp4]\nscale_format = \"e4m3\"\n";
  const Recipe on = recipe_from_text(base + "row_scaled_activation = true\n", "t.toml");
  EXPECT_TRUE(on.row_scaled_activation);
  const std::string t = recipe_to_toml(on);
  EXPECT_NE(t.find("row_scaled_activation = true\n"), std::string::npos) << t;
  EXPECT_EQ(recipe_from_text(t, "t.toml"), on);
  const Recipe off = recipe_from_text(base, "t.toml");
  EXPECT_EQ(recipe_to_toml(off).find("row_scaled"), std::string::npos) << "written only when set";
  EXPECT_EQ(recipe_from_text(base + "row_scaled_activation = false\n", "t.toml"), off);
  EXPECT_TRUE(LinearPlan::uniform(on, LinearMode::FP4).row_scaled_activation);

  struct Bad {
    std::string extra, other;
  };
  const Bad bad[] = {{"amax_interval = 50\n", "amax_interval = 50"},
                     {"amax_sample = \"per-step\"\n", "amax_sample"},
                     {"scale_rule = \"mx-te\"\nscale_format = \"ue8m0\"\n", "mx-te"},
                     {"", "probe-matched"}};
  for (const Bad& b : bad) {
    std::string toml = base + "row_scaled_activation = true\n" + b.extra;
    if (b.other == "probe-matched")
      toml = "[linear]\nmode = \"fp4\"\ngemm = \"probe-matched\"\n[fp4]\nrow_scaled_activation = true\n";
    if (b.other == "mx-te")
      toml = "[linear]\nmode = \"fp4\"\n[fp4]\nrow_scaled_activation = true\nscale_rule = \"mx-te\"\n"
             "scale_format = \"ue8m0\"\nblock = 32\n";
    const std::string e = recipe_error(toml);
    EXPECT_NE(e.find("fp4.row_scaled_activation"), std::string::npos) << b.other << ": " << e;
    EXPECT_NE(e.find(b.other), std::string::npos) << e;
    EXPECT_NE(e.find("t.toml"), std::string::npos) << e;
  }
  EXPECT_NE(recipe_error(base + "row_scaled_activation = 1\n"), "");  // wrong type
}

}  // namespace
