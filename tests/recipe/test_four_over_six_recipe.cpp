// The Four Over Six recipe keys (docs/recipes.md "Four Over Six"): parse, serialise, errors,
// the per-role specs of LinearPlan, the two shipped 4/6 recipes against their bases, and a
// Linear's fprop (decoded and probe-matched GEMM) against an independent quantize-then-GEMM.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/config/settings.h"
#include "fp4/nn/linear.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/recipe/recipe.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(FP4_SOURCE_DIR) / "configs/recipes";
const char* const kBase =
    "name = \"t\"\n[linear]\nmode = \"fp4\"\n[fp4]\nscale_format = \"e4m3\"\namax_interval = 1\n";

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

TEST(RecipeFourOverSix, DefaultOffAndShippedRecipesWithoutItUnchanged) {
  const Recipe d = recipe_from_text(kBase, "base");
  EXPECT_EQ(d.four_over_six, FourOverSixRoles::None);
  EXPECT_EQ(d.spec_x().four_over_six, FourOverSix::Off);
  for (const auto& e : fs::directory_iterator(kDir)) {
    if (e.path().stem().string().find("4over6") != std::string::npos) continue;
    const Recipe r = load_recipe_file(e.path());
    EXPECT_EQ(recipe_to_toml(r).find("four_over_six"), std::string::npos) << e.path();
    for (const BlockQuantSpec& s : {r.spec_x(), r.spec_w(), r.spec_dy()})
      EXPECT_EQ(s.four_over_six, FourOverSix::Off) << e.path();
  }
}

TEST(RecipeFourOverSix, RolesSetOnlyTheirSpecsAndRoundTrip) {
  struct Case {
    const char* roles;
    bool x, w, dy;
  } cases[] = {{"weights", false, true, false},
               {"activations", true, false, false},
               {"gradients", false, false, true},
               {"all", true, true, true}};
  for (const Case& c : cases) {
    const std::string text = std::string(kBase) + "four_over_six = \"" + c.roles +
                             "\"\nfour_over_six_error = \"mse\"\nfour_over_six_scale_target = 256\n";
    const Recipe r = recipe_from_text(text, "t");
    const LinearPlan p = LinearPlan::uniform(r, LinearMode::FP4);
    const bool on[3] = {c.x, c.w, c.dy};
    for (int g = 0; g < 3; ++g)
      for (int o = 0; o < 3; ++o) {
        const BlockQuantSpec& s = p.specs[g][o];
        EXPECT_EQ(s.four_over_six, on[o] ? FourOverSix::MSE : FourOverSix::Off) << c.roles << g << o;
        EXPECT_EQ(s.target, on[o] ? 256.f : 448.f) << c.roles << g << o;
      }
    const std::string t = recipe_to_toml(r);
    EXPECT_NE(t.find(std::string("four_over_six = \"") + c.roles + "\"\n"), std::string::npos) << t;
    EXPECT_NE(t.find("four_over_six_error = \"mse\"\n"), std::string::npos) << t;
    EXPECT_NE(t.find("four_over_six_scale_target = 256"), std::string::npos) << t;
    Recipe back = recipe_from_text(t, "t");
    back.source = r.source;
    EXPECT_TRUE(back == r) << t;
    EXPECT_EQ(recipe_to_toml(back), t);
  }
  // Defaults are not written; a target equal to scale_target is "the same" (stored as 0).
  const Recipe r = recipe_from_text(std::string(kBase) + "four_over_six = \"all\"\n"
                                    "four_over_six_error = \"mae\"\nfour_over_six_scale_target = 448\n", "t");
  EXPECT_EQ(r.four_over_six_scale_target, 0.f);
  const std::string t = recipe_to_toml(r);
  EXPECT_EQ(t.find("four_over_six_error"), std::string::npos) << t;
  EXPECT_EQ(t.find("four_over_six_scale_target"), std::string::npos) << t;
  EXPECT_EQ(r.spec_w().four_over_six, FourOverSix::MAE);
  EXPECT_EQ(r.spec_w().target, 448.f);
  // --set turns it on and names the recipe after it.
  const Recipe s = load_recipe("nvfp4-te", kDir, parse_settings({"fp4.four_over_six=weights"}).recipe);
  EXPECT_EQ(s.name, "nvfp4-te+fp4.four_over_six=weights");
  EXPECT_EQ(s.spec_w().four_over_six, FourOverSix::MAE);
  EXPECT_EQ(s.spec_x().four_over_six, FourOverSix::Off);
}

TEST(RecipeFourOverSix, BadValuesNameTheFileAndKey) {
  struct Case {
    const char* body;
    const char* key;
    const char* detail;
  } cases[] = {
      {"four_over_six = \"some\"\n", "'fp4.four_over_six'", "some"},
      {"four_over_six = true\n", "'fp4.four_over_six'", ""},
      {"four_over_six = \"all\"\nfour_over_six_error = \"MAE\"\n", "'fp4.four_over_six_error'", "MAE"},
      {"four_over_six = \"all\"\nfour_over_six_scale_target = -1\n",
       "'fp4.four_over_six_scale_target'", "-1"},
      {"four_over_six_error = \"mse\"\n", "'fp4.four_over_six_error'", "none"},
      {"four_over_six_scale_target = 256\n", "'fp4.four_over_six_scale_target'", "none"},
      {"four_over_sx = \"all\"\n", "'fp4.four_over_sx'", ""},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { recipe_from_text(std::string(kBase) + c.body, "bad.toml"); });
    EXPECT_NE(e.find("bad.toml"), std::string::npos) << c.body << " -> " << e;
    EXPECT_NE(e.find(c.key), std::string::npos) << c.body << " -> " << e;
    EXPECT_NE(e.find(c.detail), std::string::npos) << c.body << " -> " << e;
  }
  // Under an MX scale rule (no tensor scale).
  const std::string mx = error_of([&] { load_recipe("mxfp4", kDir, parse_settings({"fp4.four_over_six=all"}).recipe); });
  EXPECT_NE(mx.find("'fp4.four_over_six'"), std::string::npos) << mx;
  EXPECT_NE(mx.find("tensor-scaled"), std::string::npos) << mx;
  const std::string s = error_of(
      [&] { load_recipe("nvfp4-te", kDir, parse_settings({"fp4.four_over_six=half"}).recipe); });
  EXPECT_NE(s.find("--set fp4.four_over_six=half"), std::string::npos) << s;
}

// The shipped 4/6 recipes are their bases plus the 4/6 keys (and name, description).
TEST(RecipeFourOverSix, ShippedRecipesAreTheirBasesWithFourOverSix) {
  struct Pair {
    const char* name;
    const char* base;
    float target;
  } pairs[] = {{"nvfp4-te-4over6", "nvfp4-te", 256.f}, {"ue5m3-b16-4over6", "ue5m3-b16", 448.f}};
  for (const Pair& p : pairs) {
    Recipe r = load_recipe(p.name, kDir);
    const Recipe base = load_recipe(p.base, kDir);
    EXPECT_EQ(r.four_over_six, FourOverSixRoles::All) << p.name;
    EXPECT_EQ(r.four_over_six_error, FourOverSix::MAE) << p.name;
    for (const BlockQuantSpec& s : {r.spec_x(), r.spec_w(), r.spec_dy()}) {
      EXPECT_EQ(s.four_over_six, FourOverSix::MAE) << p.name;
      EXPECT_EQ(s.target, p.target) << p.name;
    }
    r.four_over_six = FourOverSixRoles::None;
    r.four_over_six_scale_target = 0.f;
    r.name = base.name;
    r.description = base.description;
    EXPECT_EQ(recipe_to_toml(r), recipe_to_toml(base)) << p.name;
  }
}

namespace {
// Y [M, N] = X̂·Ŵᵀ in double, relative max difference to got.
double fprop_rel_diff(const std::vector<float>& Y, const std::vector<float>& xq,
                      const std::vector<float>& wq, int64_t M, int64_t N, int64_t K) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(xq[i * K + k]) * double(wq[j * K + k]);
      d = std::max(d, std::abs(double(Y[i * N + j]) - s));
      m = std::max(m, std::abs(s));
    }
  return d / m;
}

// A Linear of `r` (decoded or probe-matched GEMM) against quantize_dequantize with r's specs
// and a naive GEMM; the same specs without 4/6 must be far off (the check can fail).
void check_fprop(const Recipe& r) {
  const int64_t M = 48, K = 64, N = 32;
  std::vector<float> X = randn(M * K, 1), W = randn(N * K, 2, 0.05f), dW(N * K, 0.f);
  for (int64_t k = 0; k < K; k += 5) X[3 * K + k] *= 40.f;
  nn::Linear lin(0, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  std::vector<float> Y(M * N);
  nn::StepContext ctx;
  ctx.step = 1;
  lin.forward(X.data(), Y.data(), M, ctx);
  for (bool four_over_six : {true, false}) {
    BlockQuantSpec sx = r.spec_x(), sw = r.spec_w();
    if (!four_over_six) sx.four_over_six = sw.four_over_six = FourOverSix::Off;
    std::vector<float> xq(X.size()), wq(W.size());
    quantize_dequantize(X.data(), M, K, sx, tensor_amax(X.data(), X.size()), nullptr, xq.data());
    quantize_dequantize(W.data(), N, K, sw, tensor_amax(W.data(), W.size()), nullptr, wq.data());
    const double rel = fprop_rel_diff(Y, xq, wq, M, N, K);
    if (four_over_six) EXPECT_LT(rel, 1e-5) << r.name;
    else EXPECT_GT(rel, 1e-4) << r.name;
  }
}
}  // namespace

TEST(RecipeFourOverSix, LinearFpropEqualsIndependentQuantizeThenGemm) {
  check_fprop(load_recipe("nvfp4-te-4over6", kDir));
  check_fprop(load_recipe("ue5m3-b16-4over6", kDir));
  // The probe-matched GEMM reads the 4/6 codes and scales of quantize_blocks.
  check_fprop(load_recipe("nvfp4-te-4over6", kDir, parse_settings({"linear.gemm=probe-matched"}).recipe));
}
