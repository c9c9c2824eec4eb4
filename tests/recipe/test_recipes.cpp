// Recipes of docs/numerics.md "Recipes" as files: every shipped recipe parses and trains; the new
// recipes' Linear equals an independent quantize-then-GEMM; high-precision rules combine as a
// union; [[override]] changes exactly the GEMM / operand / linears it names (the paper's
// T = 2048 for wgrad dY of the final mlp.down linears); strict errors name the file and key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/base/error.h"
#include "fp4/gemm/gemm.h"
#include "fp4/nn/linear.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"
#include "fp4/train/train.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
const fs::path kDir = fs::path(FP4_SOURCE_DIR) / "configs/recipes";

/// The temporary directory of test `t`: <tmp>/fp4_recipes_<pid>_<suite>.<name> ('/' of
/// parameterised names replaced by '_'). Created by write_tmp, removed when the test ends.
fs::path test_dir(const ::testing::TestInfo& t) {
  std::string name = std::string(t.test_suite_name()) + "." + t.name();
  for (char& c : name)
    if (c == '/') c = '_';
  return fs::temp_directory_path() / ("fp4_recipes_" + std::to_string(::getpid()) + "_" + name);
}

/// Removes each test's temporary directory when the test ends (passed or failed).
struct RemoveTestDir : ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& t) override {
    std::error_code ec;
    fs::remove_all(test_dir(t), ec);
  }
};
[[maybe_unused]] const bool kRemoveTestDirRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new RemoveTestDir);  // gtest owns it
  return true;
}();

/// Writes `text` to `name` in the current test's own temporary directory; returns the path.
fs::path write_tmp(const std::string& name, const std::string& text) {
  const fs::path dir = test_dir(*::testing::UnitTest::GetInstance()->current_test_info());
  fs::create_directories(dir);
  const fs::path p = dir / name;
  std::ofstream(p) << text;
  return p;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

ModelConfig micro_model(int n_layers) {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 32;
  m.n_layers = n_layers;
  m.n_heads = 2;
  m.mlp_hidden = 48;
  return m;
}

// Plans of a Llama-style model of n_layers layers (2·n_layers hybrid blocks); linear
// 6·l + j is kind j of q, k, v, o_proj, up, down_proj of layer l.
ResolvedLinears resolve_layers(const Recipe& r, int n_layers) {
  return resolve_linear_plans(r, llama_linear_sites(n_layers), 2 * n_layers);
}

RunConfig micro_run(int n_layers) {
  RunConfig c;
  c.model = micro_model(n_layers);
  c.train.seq_len = 16;
  c.train.batch_size = 2;  // 32 tokens: a multiple of 16 for the RHT
  c.train.lr = 1e-2;
  c.train.warmup_steps = 1;
  return c;
}

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

const char* const kBase =
    "name = \"t\"\n[linear]\nmode = \"fp4\"\n[fp4]\nscale_format = \"ue5m3\"\namax_interval = 1\n";
}  // namespace

// ----------------------------------------------------------------------------- shipped files

TEST(RecipeFiles, TheEightRecipesOfNumericsMdExist) {
  for (const char* n : {"fp32", "bf16", "ue5m3-b16", "ue5m3-b32", "ue5m3-te", "nvfp4-te",
                        "nvfp4-all", "mxfp4"})
    EXPECT_TRUE(fs::exists(kDir / (std::string(n) + ".toml"))) << n;
}

TEST(RecipeFiles, NewRecipesHaveTheirTableValues) {
  const Recipe b32 = load_recipe("ue5m3-b32", kDir);
  EXPECT_EQ(b32.scale_format, ScaleFormat::UE5M3);
  EXPECT_EQ(b32.block, 32);
  EXPECT_TRUE(b32.weight_2d);
  EXPECT_EQ(b32.amax_interval, 50);
  EXPECT_FALSE(b32.rht_wgrad);
  EXPECT_EQ(b32.round_dy, Rounding::SR8);
  EXPECT_EQ(b32.round_x, Rounding::RNE);
  EXPECT_EQ(b32.spec_w().block, 32);
  EXPECT_TRUE(b32.spec_w().two_d);
  EXPECT_EQ(b32.block_mode(3, 4), LinearMode::FP4);

  const Recipe te = load_recipe("ue5m3-te", kDir);
  const Recipe nv = load_recipe("nvfp4-te", kDir);
  EXPECT_EQ(te.scale_format, ScaleFormat::UE5M3);
  EXPECT_EQ(te.amax_interval, 1);
  EXPECT_TRUE(te.rht_wgrad);
  EXPECT_EQ(te.block, 16);
  EXPECT_EQ(te.final_blocks_fraction, nv.final_blocks_fraction);
  EXPECT_EQ(te.block_mode(3, 4), LinearMode::BF16);
  EXPECT_EQ(te.block_mode(2, 4), LinearMode::FP4);

  const Recipe all = load_recipe("nvfp4-all", kDir);
  EXPECT_EQ(all.scale_format, ScaleFormat::E4M3);
  EXPECT_EQ(all.amax_interval, 1);
  EXPECT_FALSE(all.rht_wgrad);
  EXPECT_TRUE(all.weight_2d);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(all.block_mode(b, 4), LinearMode::FP4);

  const Recipe mx = load_recipe("mxfp4", kDir);
  EXPECT_EQ(mx.scale_format, ScaleFormat::UE8M0);
  EXPECT_EQ(mx.scale_rule, ScaleRule::MxTe);
  EXPECT_EQ(mx.block, 32);
  EXPECT_FALSE(mx.weight_2d);
  EXPECT_FALSE(mx.rht_wgrad);
  EXPECT_EQ(mx.round_dy, Rounding::SR8);
  EXPECT_EQ(mx.round_x, Rounding::RNE);
  EXPECT_EQ(mx.round_w, Rounding::RNE);

  const Recipe t = load_recipe("ue5m3-b16-t2048", kDir);
  ASSERT_EQ(t.overrides.size(), 1u);
  EXPECT_EQ(t.overrides[0].linears, std::vector<std::string>{"down_proj"});
  EXPECT_EQ(t.overrides[0].final_blocks, 4);
  EXPECT_TRUE(t.overrides[0].has_gemm && t.overrides[0].gemm == Gemm::Wgrad);
  EXPECT_TRUE(t.overrides[0].has_role && t.overrides[0].role == Operand::DY);
  EXPECT_EQ(t.overrides[0].scale_target, 2048.f);

  // On a model with two down_proj blocks (llama_linear_sites(2)) its final four do not fit:
  // the error says what fits and names the shipped recipe that does.
  const std::string e = error_of([&] { resolve_linear_plans(t, llama_linear_sites(2), 4); });
  EXPECT_NE(e.find("override[0].final_blocks"), std::string::npos) << e;
  EXPECT_NE(e.find("has only 2 blocks with down_proj"), std::string::npos) << e;
  EXPECT_NE(e.find("--set override[0].final_blocks=2 or less"), std::string::npos) << e;
  EXPECT_NE(e.find("ue5m3-b16-t2048-last1"), std::string::npos) << e;
}

// Every file in configs/recipes parses, round-trips through recipe_to_toml, and trains two
// steps of a micro model (6 blocks, so the paper override's final four fit) with finite loss
// and gradients.
TEST(RecipeFiles, EveryShippedRecipeTrainsTwoStepsWithFiniteLoss) {
  const RunConfig cfg = micro_run(6);
  std::vector<int32_t> in(32), tg(32);
  std::mt19937 g(3);
  for (auto& x : in) x = int32_t(g() % 64);
  for (auto& x : tg) x = int32_t(g() % 64);
  int n = 0;
  for (const auto& e : fs::directory_iterator(kDir)) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    SCOPED_TRACE(e.path().string());
    const Recipe r = load_recipe_file(e.path());
    // Round trip: the written TOML loads to the same recipe text.
    const fs::path again = write_tmp("rt_" + e.path().filename().string(), recipe_to_toml(r));
    EXPECT_EQ(recipe_to_toml(load_recipe_file(again)), recipe_to_toml(r));
    fs::remove(again);
    ASSERT_NO_THROW(check_recipe_fits(r, cfg));
    nn::Model model(cfg.model, r, cfg.train.batch_size, cfg.train.seq_len);
    model.init(1);
    AdamW opt(model.num_params(), cfg.train);
    double first = 0;
    for (int step = 1; step <= 2; ++step) {
      nn::StepContext ctx;
      ctx.step = step;
      ctx.seed = 5;
      model.zero_grad();
      const double loss = model.forward(in.data(), tg.data(), 2, ctx);
      ASSERT_TRUE(std::isfinite(loss)) << "step " << step;
      model.backward(ctx);
      for (float v : model.grads()) ASSERT_TRUE(std::isfinite(v));
      opt.step(model.params().data(), model.grads().data(), model.param_infos(), 1e-2, step);
      if (step == 1) first = loss;
      else EXPECT_NE(loss, first);  // the step changed the parameters
    }
  }
  EXPECT_GE(n, 10);
}

// --------------------------------------- the new recipes' Linear vs an independent computation

namespace {
// Y [M, N] = X̂ · Ŵᵀ accumulated in double (naive triple loop).
std::vector<double> naive_gemm_nt(const std::vector<float>& a, const std::vector<float>& b,
                                  int64_t M, int64_t N, int64_t K) {
  std::vector<double> y(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(a[i * K + k]) * double(b[j * K + k]);
      y[i * N + j] = s;
    }
  return y;
}

// Max |got − want| relative to max |want|.
double rel_diff(const std::vector<float>& got, const std::vector<double>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    d = std::max(d, std::abs(double(got[i]) - want[i]));
    m = std::max(m, std::abs(want[i]));
  }
  return d / m;
}

// fprop of a Linear built from `recipe` vs quantize_dequantize with hand-written specs and a
// naive GEMM; also checks that the wrong block size would be caught.
void check_fprop(const Recipe& recipe, const BlockQuantSpec& sx, const BlockQuantSpec& sw) {
  const int64_t M = 40, K = 72, N = 48;  // K not a multiple of 32: a zero-padded block
  std::vector<float> X = randn(M * K, 1), W = randn(N * K, 2, 0.05f), dW(N * K, 0.f);
  for (int64_t k = 0; k < K; k += 5) X[3 * K + k] *= 40.f;  // uneven blocks
  nn::Linear lin(0, K, N, LinearPlan::uniform(recipe, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  std::vector<float> Y(M * N);
  nn::StepContext ctx;
  lin.forward(X.data(), Y.data(), M, ctx);

  std::vector<float> xq(X.size()), wq(W.size());
  quantize_dequantize(X.data(), M, K, sx, tensor_amax(X.data(), X.size()), nullptr, xq.data());
  quantize_dequantize(W.data(), N, K, sw, tensor_amax(W.data(), W.size()), nullptr, wq.data());
  const std::vector<double> want = naive_gemm_nt(xq, wq, M, N, K);
  EXPECT_LT(rel_diff(Y, want), 1e-6);

  // The same with block 16 differs by far more than the tolerance: the check can fail.
  BlockQuantSpec sx16 = sx, sw16 = sw;
  sx16.block = sw16.block = 16;
  quantize_dequantize(X.data(), M, K, sx16, tensor_amax(X.data(), X.size()), nullptr, xq.data());
  quantize_dequantize(W.data(), N, K, sw16, tensor_amax(W.data(), W.size()), nullptr, wq.data());
  EXPECT_GT(rel_diff(Y, naive_gemm_nt(xq, wq, M, N, K)), 1e-4);
}
}  // namespace

TEST(RecipeLinear, Mxfp4FpropEqualsIndependentQuantizeThenGemm) {
  BlockQuantSpec s;  // OCP MXFP4 with TE's round-up scale: E2M1, UE8M0, 1 × 32, no tensor scale
  s.scale_format = ScaleFormat::UE8M0;
  s.block = 32;
  s.two_d = false;
  s.scale_rule = ScaleRule::MxTe;
  s.rounding = Rounding::RNE;
  check_fprop(load_recipe("mxfp4", kDir), s, s);
}

TEST(RecipeLinear, Ue5m3B32FpropEqualsIndependentQuantizeThenGemm) {
  BlockQuantSpec sx;  // UE5M3, 1 × 32 along K, T = 448; W in 32 × 32 tiles
  sx.scale_format = ScaleFormat::UE5M3;
  sx.block = 32;
  sx.target = 448.f;
  BlockQuantSpec sw = sx;
  sw.two_d = true;
  check_fprop(load_recipe("ue5m3-b32", kDir), sx, sw);
}

// ------------------------------------------------------------------------- high precision

TEST(RecipeHighPrecision, RulesCombineAsAUnion) {
  Recipe r;
  r.mode = LinearMode::FP4;
  r.final_blocks = 1;
  r.blocks = {0};
  EXPECT_EQ(r.final_high_precision_blocks(6), 1);
  std::vector<LinearMode> want = {LinearMode::BF16, LinearMode::FP4, LinearMode::FP4,
                                  LinearMode::FP4,  LinearMode::FP4, LinearMode::BF16};
  for (int b = 0; b < 6; ++b) EXPECT_EQ(r.block_mode(b, 6), want[b]) << b;
  r.final_blocks_fraction = 0.5;  // round(3) = 3 final blocks > final_blocks = 1
  EXPECT_EQ(r.final_high_precision_blocks(6), 3);
  want = {LinearMode::BF16, LinearMode::FP4, LinearMode::FP4,
          LinearMode::BF16, LinearMode::BF16, LinearMode::BF16};
  for (int b = 0; b < 6; ++b) EXPECT_EQ(r.block_mode(b, 6), want[b]) << b;
  r.final_blocks = 5;  // now final_blocks is the larger suffix
  EXPECT_EQ(r.final_high_precision_blocks(6), 5);
  EXPECT_EQ(r.block_mode(1, 6), LinearMode::BF16);
  // The resolved plans agree with block_mode for every linear, by hybrid block.
  const std::vector<LinearSite> sites = llama_linear_sites(3);  // 6 blocks
  const ResolvedLinears res = resolve_linear_plans(r, sites, 6);
  for (int i = 0; i < 18; ++i) EXPECT_EQ(res.plans[i].mode, r.block_mode(sites[i].block, 6));
}

TEST(RecipeHighPrecision, ParsesFinalBlocksAndRejectsNegative) {
  const Recipe r = load_recipe_file(
      write_tmp("hp.toml", std::string(kBase) + "[high_precision]\nfinal_blocks = 2\n"));
  EXPECT_EQ(r.final_blocks, 2);
  EXPECT_EQ(r.block_mode(1, 4), LinearMode::FP4);
  EXPECT_EQ(r.block_mode(2, 4), LinearMode::BF16);
  const std::string e = error_of([] {
    load_recipe_file(write_tmp("hpneg.toml", std::string(kBase) + "[high_precision]\nfinal_blocks = -1\n"));
  });
  EXPECT_NE(e.find("hpneg.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("high_precision.final_blocks"), std::string::npos) << e;
}

TEST(RecipeHighPrecision, CheckRecipeFitsNamesTheKey) {
  const RunConfig cfg = micro_run(4);  // 8 hybrid blocks
  Recipe r = load_recipe_file(
      write_tmp("fit1.toml", std::string(kBase) + "[high_precision]\nfinal_blocks = 9\n"));
  std::string e = error_of([&] { check_recipe_fits(r, cfg); });
  EXPECT_NE(e.find("high_precision.final_blocks"), std::string::npos) << e;
  EXPECT_NE(e.find("fit1.toml"), std::string::npos) << e;
  r.final_blocks = 8;  // every block: fits
  EXPECT_NO_THROW(check_recipe_fits(r, cfg));
  r.blocks = {8};
  e = error_of([&] { check_recipe_fits(r, cfg); });
  EXPECT_NE(e.find("high_precision.blocks"), std::string::npos) << e;
}

// ------------------------------------------------------------------------------- overrides

TEST(RecipeOverride, PaperExampleResolvesToWgradDyOfTheFinalFourMlpDown) {
  const Recipe r = load_recipe("ue5m3-b16-t2048", kDir);
  const ResolvedLinears res = resolve_layers(r, 6);
  ASSERT_EQ(res.override_hits.size(), 1u);
  EXPECT_EQ(res.override_hits[0], (std::vector<int>{2 * 6 + 5, 3 * 6 + 5, 4 * 6 + 5, 5 * 6 + 5}));
  for (int i = 0; i < 36; ++i) {
    const bool hit = i % 6 == 5 && i / 6 >= 2;
    for (int g = 0; g < 3; ++g)
      for (int o = 0; o < 3; ++o) {
        if (!gemm_uses(Gemm(g), Operand(o))) continue;
        const bool changed = hit && Gemm(g) == Gemm::Wgrad && Operand(o) == Operand::DY;
        const BlockQuantSpec& s = res.plans[i].spec(Gemm(g), Operand(o));
        EXPECT_EQ(s.target, changed ? 2048.f : 448.f) << i << " " << g << " " << o;
        EXPECT_EQ(s.rounding, Operand(o) == Operand::DY ? Rounding::SR8 : Rounding::RNE);
      }
  }
  // A 4-block model: all four mlp.down; a 3-block model: does not fit, the key is named.
  EXPECT_EQ(resolve_layers(r, 4).override_hits[0].size(), 4u);
  const std::string e = error_of([&] { resolve_layers(r, 3); });
  EXPECT_NE(e.find("override[0].final_blocks"), std::string::npos) << e;
  EXPECT_NE(e.find("ue5m3-b16-t2048.toml"), std::string::npos) << e;
}

// The Linear of an overridden layer (ue5m3-b16-t2048 with r's GEMM mode): wgrad dW equals a
// hand-assembled reference quantizing dYᵀ with T = 2048 (and Xᵀ with T = 448); dgrad dX is
// bit-identical to the non-overridden layer's.
static void linear_wgrad_uses_t2048(const Recipe& r) {
  const std::string at = gemm_mode_name(r.gemm);
  const ResolvedLinears res = resolve_layers(r, 4);
  const int id = 3 * 6 + 5;  // layers.7.mixer.down_proj
  const LinearPlan& over = res.plans[id];
  const LinearPlan base = LinearPlan::uniform(r, LinearMode::FP4);
  const int64_t M = 48, K = 40, N = 24;
  const std::vector<float> X = randn(M * K, 11), W0 = randn(N * K, 12, 0.1f),
                           dY = randn(M * N, 13, 1e-3f);
  nn::StepContext ctx;
  ctx.step = 1;
  ctx.seed = 77;
  std::vector<float> dW[2], dX[2];
  for (int v = 0; v < 2; ++v) {
    std::vector<float> W = W0, Y(M * N);
    dW[v].assign(N * K, 0.f);
    dX[v].assign(M * K, 0.f);
    nn::Linear lin(id, K, N, v ? over : base);
    lin.bind(W.data(), dW[v].data());
    lin.forward(X.data(), Y.data(), M, ctx);
    lin.backward(dY.data(), dX[v].data(), M, ctx);
  }
  EXPECT_EQ(0, std::memcmp(dX[0].data(), dX[1].data(), dX[0].size() * sizeof(float))) << at;
  EXPECT_NE(0, std::memcmp(dW[0].data(), dW[1].data(), dW[0].size() * sizeof(float))) << at;

  // Hand-assembled wgrad: scalar quantizer on the transposes, SR keys as the Linear's
  // (operand dY = 2, GEMM wgrad = 2), one dY reference g = amax(dY) (held at step 1).
  std::vector<float> dyt(N * M), xt(K * M);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) dyt[n * M + m] = dY[m * N + n];
    for (int64_t k = 0; k < K; ++k) xt[k * M + m] = X[m * K + k];
  }
  for (float T : {448.f, 2048.f}) {
    BlockQuantSpec sdy;  // UE5M3, 1 × 16 along tokens, SR8
    sdy.target = T;
    sdy.rounding = Rounding::SR8;
    BlockQuantSpec sx;  // T = 448, RNE
    const SrKey kd{77, 1, uint32_t(id), 2, 2};
    std::vector<float> a(N * M), b(K * M), want(N * K, 0.f);
    const float gdy = tensor_amax(dY.data(), dY.size()), gx = tensor_amax(X.data(), X.size());
    if (r.gemm == GemmMode::DecodedBf16) {  // q·c_b operands, decode scales on the output
      quantize_block_scaled(dyt.data(), N, M, sdy, gdy, &kd, a.data());
      quantize_block_scaled(xt.data(), K, M, sx, gx, nullptr, b.data());
      BlockScaledGemmScratch scratch;
      gemm_block_scaled(false, true, N, K, M, a.data(), tensor_decode_scale(sdy, gdy), b.data(),
                        tensor_decode_scale(sx, gx), true, want.data(), scratch);
    } else {
      quantize_dequantize(dyt.data(), N, M, sdy, gdy, &kd, a.data());
      quantize_dequantize(xt.data(), K, M, sx, gx, nullptr, b.data());
      sgemm(false, true, N, K, M, 1.f, a.data(), M, b.data(), M, 1.f, want.data(), K);
    }
    const std::vector<float>& got = dW[T == 2048.f ? 1 : 0];
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
        << "T = " << T << ", " << at;
  }
}

TEST(RecipeOverride, LinearWgradUsesT2048ForDyAndLeavesDgradAlone) {
  // The recipe's own GEMM (auto: decoded-bf16) and the reference decoded one.
  for (GemmMode mode : {GemmMode::DecodedBf16, GemmMode::Decoded}) {
    Recipe r = load_recipe("ue5m3-b16-t2048", kDir);
    if (mode == GemmMode::DecodedBf16) {
      EXPECT_EQ(r.gemm, mode) << "auto resolves to decoded-bf16";
    }
    r.gemm = mode;
    linear_wgrad_uses_t2048(r);
  }
}

// Whole model: with the override, exactly the mlp.down weight gradients of the final four
// blocks change; every other gradient (dgrad runs upstream of them) is bit-identical.
TEST(RecipeOverride, ModelGradientsChangeOnlyInTheOverriddenWeights) {
  const RunConfig cfg = micro_run(6);
  const Recipe over = load_recipe("ue5m3-b16-t2048", kDir);
  const Recipe base = load_recipe("ue5m3-b16", kDir);
  std::vector<int32_t> in(32), tg(32);
  std::mt19937 g(9);
  for (auto& x : in) x = int32_t(g() % 64);
  for (auto& x : tg) x = int32_t(g() % 64);
  std::vector<float> grads[2];
  std::vector<nn::ParamInfo> infos;
  for (int v = 0; v < 2; ++v) {
    nn::Model model(cfg.model, v ? over : base, 2, 16);
    model.init(2);
    nn::StepContext ctx;
    ctx.seed = 4;
    model.zero_grad();
    model.forward(in.data(), tg.data(), 2, ctx);
    model.backward(ctx);
    grads[v] = model.grads();
    infos = model.param_infos();
  }
  std::set<std::string> changed;
  for (const auto& p : infos)
    if (std::memcmp(grads[0].data() + p.offset, grads[1].data() + p.offset, p.size * sizeof(float)))
      changed.insert(p.name);
  EXPECT_EQ(changed, (std::set<std::string>{
                         "layers.5.mixer.down_proj", "layers.7.mixer.down_proj",
                         "layers.9.mixer.down_proj", "layers.11.mixer.down_proj"}));
}

TEST(RecipeOverride, ModeAndRoundingOverridesAndTheirReport) {
  const fs::path p = write_tmp("modes.toml", std::string(kBase) +
                                                 "[[override]]\nlinears = [\"attn.q\", \"attn.k\"]\n"
                                                 "blocks = [0]\nmode = \"bf16\"\n"
                                                 "[[override]]\nlinears = [\"mlp.up\"]\n"
                                                 "gemm = \"dgrad\"\nrounding = \"rne\"\n"
                                                 "[[override]]\nlinears = [\"attn.v\"]\nrole = \"x\"\n"
                                                 "rounding = \"sr8\"\nscale_target = 1000\n");
  const Recipe r = load_recipe_file(p);
  const ResolvedLinears res = resolve_layers(r, 2);
  EXPECT_EQ(res.plans[0].mode, LinearMode::BF16);
  EXPECT_EQ(res.plans[1].mode, LinearMode::BF16);
  EXPECT_EQ(res.plans[2].mode, LinearMode::FP4);
  EXPECT_EQ(res.plans[6].mode, LinearMode::FP4);  // block 1 not selected
  EXPECT_EQ(res.override_hits[0], (std::vector<int>{0, 1}));
  // mlp.up: dgrad's dY and W rounded RNE, wgrad's dY still SR8.
  EXPECT_EQ(res.plans[4].spec(Gemm::Dgrad, Operand::DY).rounding, Rounding::RNE);
  EXPECT_EQ(res.plans[4].spec(Gemm::Wgrad, Operand::DY).rounding, Rounding::SR8);
  EXPECT_EQ(res.override_hits[1], (std::vector<int>{4, 10}));
  // attn.v: X in fprop and wgrad.
  EXPECT_EQ(res.plans[2].spec(Gemm::Fprop, Operand::X).target, 1000.f);
  EXPECT_EQ(res.plans[2].spec(Gemm::Wgrad, Operand::X).rounding, Rounding::SR8);
  EXPECT_EQ(res.plans[2].spec(Gemm::Fprop, Operand::W).target, 448.f);
  // Round trip keeps every override.
  const Recipe again = load_recipe_file(write_tmp("modes2.toml", recipe_to_toml(r)));
  EXPECT_EQ(recipe_to_toml(again), recipe_to_toml(r));
  ASSERT_EQ(again.overrides.size(), 3u);
  EXPECT_EQ(again.overrides[2].scale_target, 1000.f);
  // The start-of-run description lists every override and the linears it hit.
  RunConfig cfg = micro_run(2);
  nn::Model model(cfg.model, r, 1, 16);
  const std::string d = describe_linear_plans(r, model);
  EXPECT_NE(d.find("(bf16+fp4,fp4,fp4,fp4 per block; FP4 GEMM decoded-bf16)"), std::string::npos)
      << d;  // 4 hybrid blocks
  EXPECT_NE(d.find("override[0]"), std::string::npos) << d;
  EXPECT_NE(d.find("layers.0.mixer.q_proj layers.0.mixer.k_proj"), std::string::npos) << d;
  EXPECT_NE(d.find("override[1]"), std::string::npos) << d;
  EXPECT_NE(d.find("layers.1.mixer.up_proj layers.3.mixer.up_proj"), std::string::npos) << d;
  EXPECT_NE(d.find("override[2]"), std::string::npos) << d;
}

TEST(RecipeOverride, OverrideThatChangesNothingIsAnError) {
  // nvfp4-te-like: the final block is BF16, an scale_target override on it changes no FP4 linear.
  const Recipe r = load_recipe_file(write_tmp(
      "none.toml", std::string(kBase) +
                       "[high_precision]\nfinal_blocks = 1\n[[override]]\nlinears = [\"mlp.down\"]\n"
                       "final_blocks = 1\nscale_target = 2048\n"));
  const std::string e = error_of([&] { resolve_layers(r, 4); });
  EXPECT_NE(e.find("override[0]"), std::string::npos) << e;
  EXPECT_NE(e.find("changes no linear"), std::string::npos) << e;
  EXPECT_NE(e.find("none.toml"), std::string::npos) << e;
  const std::string e2 = error_of([&] { check_recipe_fits(r, micro_run(4)); });
  EXPECT_EQ(e, e2);
  Recipe r2 = r;
  r2.overrides[0].final_blocks = 0;
  r2.overrides[0].blocks = {9};
  const std::string e3 = error_of([&] { check_recipe_fits(r2, micro_run(4)); });
  EXPECT_NE(e3.find("override[0].blocks"), std::string::npos) << e3;
}

TEST(RecipeOverride, OverridesThatWouldDoNothingAreErrors) {
  // The same value as the recipe's, a mode the linears already have, and a scale target under
  // an MX scale rule (no tensor scale) change no linear.
  const char* bodies[] = {
      "[[override]]\nlinears = [\"mlp.down\"]\nscale_target = 448.0\n",
      "[[override]]\nlinears = [\"mlp.down\"]\nmode = \"fp4\"\n",
      "[[override]]\nlinears = [\"mlp.down\"]\nrounding = \"sr8\"\nrole = \"dy\"\n",
  };
  for (const char* body : bodies) {
    const Recipe r = load_recipe_file(write_tmp("noop.toml", std::string(kBase) + body));
    const std::string e = error_of([&] { resolve_layers(r, 2); });
    EXPECT_NE(e.find("changes no linear"), std::string::npos) << body << ": " << e;
  }
  std::string mx = kBase;
  const std::string ue5m3 = "scale_format = \"ue5m3\"";
  mx.replace(mx.find(ue5m3), ue5m3.size(), "scale_format = \"ue8m0\"\nscale_rule = \"mx-te\"");
  const Recipe r = load_recipe_file(
      write_tmp("mx.toml", mx + "[[override]]\nlinears = [\"mlp.down\"]\nscale_target = 2048.0\n"));
  const std::string e = error_of([&] { resolve_layers(r, 2); });
  EXPECT_NE(e.find("MX scale rule"), std::string::npos) << e;
  // A BF16 mode and a scale target in one override: the target could never apply.
  const std::string e2 = error_of([&] {
    load_recipe_file(write_tmp("bf.toml", std::string(kBase) +
                                              "[[override]]\nlinears = [\"mlp.down\"]\n"
                                              "mode = \"bf16\"\nscale_target = 2048.0\n"));
  });
  EXPECT_NE(e2.find("override[0].mode"), std::string::npos) << e2;
}

TEST(RecipeOverride, StrictParseErrorsNameTheFileAndKey) {
  struct Case {
    const char* body;
    const char* key;
  } cases[] = {
      {"[[override]]\nlinears = [\"mlp.gate\"]\nscale_target = 2.0\n", "override[0].linears"},
      {"[[override]]\nlinears = []\nscale_target = 2.0\n", "override[0].linears"},
      {"[[override]]\nscale_target = 2.0\n", "override[0].linears"},
      {"[[override]]\nlinears = [\"mlp.up\"]\ngemm = \"bprop\"\nscale_target = 2.0\n", "override[0].gemm"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nrole = \"y\"\nscale_target = 2.0\n", "override[0].role"},
      {"[[override]]\nlinears = [\"mlp.up\"]\ngemm = \"fprop\"\nrole = \"dy\"\nscale_target = 2.0\n",
       "override[0].role"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nscale_targt = 2.0\n", "override[0].scale_targt"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nscale_target = 2.0\n[[override]]\nlinears = [\"attn.o\"]\n"
       "amax_interval = 5\nrounding = \"rne\"\n",
       "override[1].amax_interval"},
      {"[[override]]\nlinears = [\"mlp.up\"]\n", "override[0]"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nmode = \"bf16\"\ngemm = \"wgrad\"\n", "override[0].mode"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nmode = \"fp8\"\n", "override[0].mode"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nrounding = \"sr24\"\n", "override[0].rounding"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nscale_target = -1.0\n", "override[0].scale_target"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nfinal_blocks = -2\nscale_target = 2.0\n",
       "override[0].final_blocks"},
      {"[[override]]\nlinears = [\"mlp.up\"]\nblocks = [-1]\nscale_target = 2.0\n", "override[0].blocks"},
      {"[override]\nlinears = [\"mlp.up\"]\nscale_target = 2.0\n", "override"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string name = "bad" + std::to_string(i++) + ".toml";
    const std::string e =
        error_of([&] { load_recipe_file(write_tmp(name, std::string(kBase) + c.body)); });
    EXPECT_NE(e.find(name), std::string::npos) << c.body << " -> " << e;
    EXPECT_NE(e.find(std::string("'") + c.key), std::string::npos) << c.body << " -> " << e;
  }
}

// Override blocks: final_blocks counts per kind; the Llama-only names keep counting layers
// in `blocks` (so a recipe file written for that version selects what it selected then).
TEST(RecipeOverride, FinalBlocksCountPerKindAndOldNamesCountLayers) {
  auto hits = [](const std::string& body, int layers) {
    const Recipe r = load_recipe_file(write_tmp("k.toml", std::string(kBase) + body));
    return resolve_layers(r, layers).override_hits[0];
  };
  const std::string tail = "gemm = \"wgrad\"\nrole = \"dy\"\nscale_target = 2048.0\n";
  // The final two of each kind: o_proj and down_proj of layers 2 and 3 (index 6·l + j).
  const std::vector<int> last2 = {2 * 6 + 3, 2 * 6 + 5, 3 * 6 + 3, 3 * 6 + 5};
  EXPECT_EQ(hits("[[override]]\nlinears = [\"mlp.down\", \"attn.o\"]\nfinal_blocks = 2\n" + tail, 4), last2);
  EXPECT_EQ(hits("[[override]]\nlinears = [\"down_proj\", \"o_proj\"]\nfinal_blocks = 2\n" + tail, 4), last2);
  // blocks: layer 1 with the old names; hybrid block 3 (layer 1's MLP) with the new ones.
  EXPECT_EQ(hits("[[override]]\nlinears = [\"attn.o\", \"mlp.down\"]\nblocks = [1]\n" + tail, 4),
            (std::vector<int>{1 * 6 + 3, 1 * 6 + 5}));
  EXPECT_EQ(hits("[[override]]\nlinears = [\"o_proj\", \"down_proj\"]\nblocks = [3]\n" + tail, 4),
            (std::vector<int>{1 * 6 + 5}));
  // The old names write back as they were (their blocks count layers on reload too).
  const Recipe old = load_recipe_file(write_tmp(
      "o.toml", std::string(kBase) + "[[override]]\nlinears = [\"mlp.down\"]\nblocks = [1]\n" + tail));
  EXPECT_TRUE(old.overrides[0].legacy_layers);
  const Recipe again = recipe_from_text(recipe_to_toml(old), "again");
  EXPECT_TRUE(again.overrides[0].legacy_layers);
  EXPECT_EQ(resolve_layers(again, 4).override_hits, resolve_layers(old, 4).override_hits);
  // Layers exist only in a Llama-style pattern; mixing the two schemes is a parse error.
  ModelConfig hy = micro_model(2);
  hy.pattern = "*-M";
  hy.mamba_num_heads = 2;
  hy.mamba_head_dim = 4;
  std::string e = error_of([&] {
    resolve_linear_plans(old, nn::Model::linear_sites(hy), hy.n_blocks());
  });
  EXPECT_NE(e.find("override[0].blocks"), std::string::npos) << e;
  e = error_of([] {
    load_recipe_file(write_tmp("mix.toml", std::string(kBase) +
                                               "[[override]]\nlinears = [\"mlp.down\", \"o_proj\"]\n"
                                               "scale_target = 2.0\n"));
  });
  EXPECT_NE(e.find("override[0].linears"), std::string::npos) << e;
}

TEST(RecipeOverride, ModelLinearNamesEndInTheRecipeKinds) {
  nn::Model model(micro_model(2), Recipe{}, 1, 8);
  ASSERT_EQ(model.linears().size(), 12u);
  for (size_t i = 0; i < model.linears().size(); ++i)
    EXPECT_EQ(model.linear_name(i), "layers." + std::to_string(model.linear_sites()[i].block) +
                                        ".mixer." + model.linear_sites()[i].kind);
  // Llama-style: layer l is attention block 2l (q, k, v, o_proj) and MLP block 2l + 1.
  const char* kinds[] = {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"};
  for (size_t i = 0; i < model.linears().size(); ++i) {
    EXPECT_EQ(model.linear_sites()[i].kind, kinds[i % 6]) << i;
    EXPECT_EQ(model.linear_sites()[i].block, int(i / 6) * 2 + (i % 6 >= 4)) << i;
  }
}

// An override of W in dgrad only (2-D tiles, otherwise shared with fprop): dX equals a
// hand-assembled dgrad with W re-quantized at T = 1000; fprop Y and wgrad dW are unchanged.
TEST(RecipeOverride, DgradWeightOverrideRequantizesTheTiles) {
  const Recipe auto_r = load_recipe_file(write_tmp(
      "dgw.toml", std::string(kBase) + "[[override]]\nlinears = [\"attn.o\"]\ngemm = \"dgrad\"\n"
                                       "role = \"w\"\nscale_target = 1000.0\n"));
  EXPECT_EQ(auto_r.gemm, GemmMode::DecodedBf16);  // auto
  for (GemmMode mode : {GemmMode::DecodedBf16, GemmMode::Decoded}) {
    Recipe r = auto_r;
    r.gemm = mode;
    const std::string at = gemm_mode_name(mode);
    const ResolvedLinears res = resolve_layers(r, 1);
    const int id = 3;  // layers.0.mixer.o_proj
    ASSERT_EQ(res.override_hits[0], std::vector<int>{id});
    const int64_t M = 32, K = 40, N = 24;
    const std::vector<float> X = randn(M * K, 21), W0 = randn(N * K, 22, 0.1f),
                             dY = randn(M * N, 23);
    nn::StepContext ctx;
    ctx.seed = 5;
    std::vector<float> Y[2], dW[2], dX[2];
    for (int v = 0; v < 2; ++v) {
      std::vector<float> W = W0;
      Y[v].assign(M * N, 0.f);
      dW[v].assign(N * K, 0.f);
      dX[v].assign(M * K, 0.f);
      nn::Linear lin(id, K, N, v ? res.plans[id] : LinearPlan::uniform(r, LinearMode::FP4));
      lin.bind(W.data(), dW[v].data());
      lin.forward(X.data(), Y[v].data(), M, ctx);
      lin.backward(dY.data(), dX[v].data(), M, ctx);
    }
    EXPECT_EQ(0, std::memcmp(Y[0].data(), Y[1].data(), Y[0].size() * sizeof(float))) << at;
    EXPECT_EQ(0, std::memcmp(dW[0].data(), dW[1].data(), dW[0].size() * sizeof(float))) << at;
    BlockQuantSpec sdy;
    sdy.rounding = Rounding::SR8;
    BlockQuantSpec sw;
    sw.two_d = true;
    sw.target = 1000.f;
    const SrKey kd{5, 1, uint32_t(id), 2, 1};  // operand dY, GEMM dgrad
    std::vector<float> a(M * N), b(N * K), want(M * K, 0.f);
    const float gdy = tensor_amax(dY.data(), dY.size()), gw = tensor_amax(W0.data(), W0.size());
    if (mode == GemmMode::DecodedBf16) {  // q·c_b operands (Ŵ transposed, as the Linear's dgrad)
      quantize_block_scaled(dY.data(), M, N, sdy, gdy, &kd, a.data());
      quantize_block_scaled(W0.data(), N, K, sw, gw, nullptr, b.data());
      std::vector<float> bt(K * N);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) bt[k * N + n] = b[n * K + k];
      BlockScaledGemmScratch scratch;
      gemm_block_scaled(false, true, M, K, N, a.data(), tensor_decode_scale(sdy, gdy), bt.data(),
                        tensor_decode_scale(sw, gw), true, want.data(), scratch);
    } else {
      quantize_dequantize(dY.data(), M, N, sdy, gdy, &kd, a.data());
      quantize_dequantize(W0.data(), N, K, sw, gw, nullptr, b.data());
      sgemm(false, false, M, K, N, 1.f, a.data(), N, b.data(), K, 1.f, want.data(), K);
    }
    EXPECT_EQ(0, std::memcmp(dX[1].data(), want.data(), want.size() * sizeof(float))) << at;
    EXPECT_NE(0, std::memcmp(dX[0].data(), dX[1].data(), dX[0].size() * sizeof(float))) << at;
  }
}

// The paper's primary run: every choice of docs/recipes.md "The paper's primary run".
TEST(RecipeFiles, PaperRecipeStatesThePapersInterface) {
  const Recipe r = load_recipe("ue5m3-b16-paper", kDir);
  EXPECT_EQ(r.mode, LinearMode::FP4);
  EXPECT_EQ(r.gemm, GemmMode::ProbeMatched);
  EXPECT_EQ(r.probe_snap, 1024);
  EXPECT_EQ(r.scale_format, ScaleFormat::UE5M3);
  EXPECT_EQ(r.block, 16);
  EXPECT_TRUE(r.weight_2d);
  EXPECT_EQ(r.scale_target, 448.f);
  EXPECT_EQ(r.amax_interval, 50);
  EXPECT_EQ(r.amax_ranks, AmaxRanks::Max);
  EXPECT_FALSE(r.rht_wgrad);
  EXPECT_TRUE(r.bf16_boundary);
  EXPECT_TRUE(r.bf16_outputs);
  EXPECT_EQ(r.round_dy, Rounding::SR8);
  EXPECT_EQ(r.round_x, Rounding::RNE);
  EXPECT_EQ(r.final_blocks, 0);
  EXPECT_EQ(r.final_blocks_fraction, 0.0);
  ASSERT_EQ(r.overrides.size(), 1u);
  EXPECT_EQ(r.overrides[0].scale_target, 2048.f);
  EXPECT_EQ(r.overrides[0].final_blocks, 4);
  EXPECT_EQ(r.overrides[0].gemm, Gemm::Wgrad);
  EXPECT_EQ(r.overrides[0].role, Operand::DY);
}

// ------------------------------------------ linear.probe_snap (docs/gemm.md "The accumulator")

TEST(RecipeProbeSnap, ParseValidateAndRoundTrip) {
  // Default 1024, absent from the resolved text of every shipped recipe (their recipe.toml in
  // earlier runs and checkpoints stays byte-identical); set, written and read back.
  for (const auto& e : fs::directory_iterator(kDir)) {
    const Recipe r = load_recipe_file(e.path());
    EXPECT_EQ(r.probe_snap, 1024) << e.path();
    EXPECT_EQ(recipe_to_toml(r).find("probe_snap"), std::string::npos) << e.path();
  }
  std::string body = std::string(kBase);
  body.replace(body.find("[linear]\n") + 9, 0, "gemm = \"probe-matched\"\n");
  for (int d : {0, 256, 4096}) {
    std::string text = body;
    text.replace(text.find("[linear]\n") + 9, 0, "probe_snap = " + std::to_string(d) + "\n");
    const Recipe r = recipe_from_text(text, "snap");
    EXPECT_EQ(r.probe_snap, d);
    EXPECT_EQ(LinearPlan::uniform(r, LinearMode::FP4).probe_snap, d);
    const std::string t = recipe_to_toml(r);
    EXPECT_NE(t.find("probe_snap = " + std::to_string(d)), std::string::npos) << t;
    EXPECT_EQ(recipe_from_text(t, "back").probe_snap, d);
  }
  for (const char* bad : {"3", "1000", "131072", "-1", "\"1024\""}) {
    std::string text = body;
    text.replace(text.find("[linear]\n") + 9, 0, std::string("probe_snap = ") + bad + "\n");
    const std::string e = error_of([&] { recipe_from_text(text, "bad.toml"); });
    EXPECT_NE(e.find("bad.toml"), std::string::npos) << bad << " -> " << e;
    EXPECT_NE(e.find("'linear.probe_snap'"), std::string::npos) << bad << " -> " << e;
  }
  // The decoded GEMM has no accumulator: a snap there is refused, not ignored.
  std::string decoded = std::string(kBase);
  decoded.replace(decoded.find("[linear]\n") + 9, 0, "probe_snap = 0\n");
  const std::string e = error_of([&] { recipe_from_text(decoded, "dec.toml"); });
  EXPECT_NE(e.find("'linear.probe_snap'"), std::string::npos) << e;
  EXPECT_NE(e.find("probe-matched"), std::string::npos) << e;
}

// ------------------------------- linear.probe_alpha (docs/gemm.md "α as the GPU computed it")

// The shipped recipes that state the paper's runs with its interface (docs/recipes.md "The
// paper's primary run"): ue5m3-b16-paper, ue5m3-b32-paper and their -last1 variants.
bool is_paper_run(const fs::path& p) {
  const std::string s = p.stem().string();
  return s == "ue5m3-b16-paper" || s == "ue5m3-b16-paper-last1" || s == "ue5m3-b32-paper" ||
         s == "ue5m3-b32-paper-last1";
}

TEST(RecipeProbeAlpha, ParseValidateAndRoundTrip) {
  // Quotient everywhere but the paper's runs (ue5m3-b16-paper, ue5m3-b32-paper and their -last1
  // variants: reciprocal), and absent from the resolved text of the others, so their
  // recipe.toml stays byte-identical.
  for (const auto& e : fs::directory_iterator(kDir)) {
    const Recipe r = load_recipe_file(e.path());
    const bool paper = is_paper_run(e.path());
    EXPECT_EQ(r.probe_alpha, paper ? AlphaRule::Reciprocal : AlphaRule::Quotient) << e.path();
    EXPECT_EQ(recipe_to_toml(r).find("probe_alpha") != std::string::npos, paper) << e.path();
    EXPECT_EQ(LinearPlan::uniform(r, LinearMode::FP4).probe_alpha, r.probe_alpha) << e.path();
  }
  std::string body = std::string(kBase);
  body.replace(body.find("[linear]\n") + 9, 0, "gemm = \"probe-matched\"\nprobe_alpha = \"reciprocal\"\n");
  const Recipe r = recipe_from_text(body, "alpha");
  EXPECT_EQ(r.probe_alpha, AlphaRule::Reciprocal);
  EXPECT_EQ(recipe_from_text(recipe_to_toml(r), "back").probe_alpha, AlphaRule::Reciprocal);
  std::string bad = body;
  bad.replace(bad.find("\"reciprocal\""), 12, "\"inverse\"");
  EXPECT_NE(error_of([&] { recipe_from_text(bad, "bad.toml"); }).find("'linear.probe_alpha'"),
            std::string::npos);
  // The decoded GEMM has no α: a rule there is refused, not ignored.
  std::string decoded = std::string(kBase);
  decoded.replace(decoded.find("[linear]\n") + 9, 0, "probe_alpha = \"reciprocal\"\n");
  const std::string e = error_of([&] { recipe_from_text(decoded, "dec.toml"); });
  EXPECT_NE(e.find("'linear.probe_alpha'"), std::string::npos) << e;
  EXPECT_NE(e.find("probe-matched"), std::string::npos) << e;
}

// --------------------------------------------- fidelity knobs (docs/recipes.md "Fidelity knobs")

#include "fp4/train/checkpoint.h"

TEST(RecipeFidelityKnobs, ParseValidateAndRoundTrip) {
  // Off by default, and then absent from the resolved recipe text, so every earlier run's
  // recipe.toml (and checkpoint copy) still matches byte for byte.
  const Recipe d = recipe_from_text(kBase, "base");
  EXPECT_FALSE(d.bf16_boundary);
  EXPECT_EQ(d.rht_precision, RhtPrecision::FP32);
  for (const auto& e : fs::directory_iterator(kDir)) {
    if (is_paper_run(e.path())) continue;  // the paper's interface: both on, by design
    const std::string t = recipe_to_toml(load_recipe_file(e.path()));
    EXPECT_EQ(t.find("bf16_boundary"), std::string::npos) << e.path();
    EXPECT_EQ(t.find("bf16_outputs"), std::string::npos) << e.path();
    EXPECT_EQ(t.find("rht_precision"), std::string::npos) << e.path();
  }
  // Set: parsed, written back, re-read to the same recipe.
  const Recipe r = recipe_from_text(
      std::string(kBase) + "rht_wgrad = true\nrht_precision = \"bf16\"\nbf16_boundary = true\nbf16_outputs = true\n", "on");
  EXPECT_TRUE(r.bf16_boundary);
  EXPECT_TRUE(r.bf16_outputs);
  EXPECT_TRUE(LinearPlan::uniform(r, LinearMode::FP4).bf16_outputs);
  EXPECT_FALSE(d.bf16_outputs);
  EXPECT_EQ(r.rht_precision, RhtPrecision::BF16);
  const std::string t = recipe_to_toml(r);
  EXPECT_NE(t.find("rht_precision = \"bf16\""), std::string::npos) << t;
  EXPECT_NE(t.find("bf16_boundary = true"), std::string::npos) << t;
  EXPECT_NE(t.find("bf16_outputs = true"), std::string::npos) << t;
  const Recipe back = recipe_from_text(t, "back");
  EXPECT_TRUE(back.bf16_boundary);
  EXPECT_TRUE(back.bf16_outputs);
  EXPECT_EQ(back.rht_precision, RhtPrecision::BF16);
  EXPECT_EQ(recipe_to_toml(back), t);
  const Recipe explicit_off = recipe_from_text(
      std::string(kBase) + "rht_precision = \"fp32\"\nbf16_boundary = false\n", "off");
  EXPECT_EQ(recipe_to_toml(explicit_off), recipe_to_toml(d));
  // Bad values name the key (and the value where there is one).
  struct Case {
    const char* body;
    const char* key;
    const char* detail;
  } cases[] = {
      {"rht_wgrad = true\nrht_precision = \"fp16\"\n", "'fp4.rht_precision'", "fp16"},
      {"rht_precision = \"bf16\"\n", "'fp4.rht_precision'", "rht_wgrad"},
      {"rht_wgrad = true\nrht_precision = 16\n", "'fp4.rht_precision'", ""},
      {"bf16_boundary = \"yes\"\n", "'fp4.bf16_boundary'", ""},
      {"bf16_boundry = true\n", "'fp4.bf16_boundry'", ""},
      {"bf16_outputs = 1\n", "'fp4.bf16_outputs'", ""},
  };
  for (const Case& c : cases) {
    const std::string e =
        error_of([&] { recipe_from_text(std::string(kBase) + c.body, "bad.toml"); });
    EXPECT_NE(e.find("bad.toml"), std::string::npos) << c.body << " -> " << e;
    EXPECT_NE(e.find(c.key), std::string::npos) << c.body << " -> " << e;
    EXPECT_NE(e.find(c.detail), std::string::npos) << c.body << " -> " << e;
  }
}

// The study's ablations (docs/recipes.md "Studies: claims as hypotheses") differ from their
// base recipe in exactly one knob: with that knob (and the name and description) set back, the
// resolved recipe text is the base's.
TEST(RecipeFiles, AblationsChangeOneKnobOfTheirBase) {
  auto text_as = [](Recipe r, const Recipe& base) {
    r.name = base.name;
    r.description = base.description;
    return recipe_to_toml(r);
  };
  const Recipe b16 = load_recipe("ue5m3-b16", kDir), all = load_recipe("nvfp4-all", kDir);
  Recipe d1 = load_recipe("ue5m3-d1", kDir);
  EXPECT_EQ(d1.amax_interval, 1);
  EXPECT_NE(text_as(d1, b16), recipe_to_toml(b16));
  d1.amax_interval = b16.amax_interval;
  EXPECT_EQ(text_as(d1, b16), recipe_to_toml(b16));
  Recipe d50 = load_recipe("nvfp4-d50", kDir);
  EXPECT_EQ(d50.amax_interval, 50);
  EXPECT_EQ(d50.scale_format, ScaleFormat::E4M3);
  EXPECT_FALSE(d50.rht_wgrad);
  d50.amax_interval = all.amax_interval;
  EXPECT_EQ(text_as(d50, all), recipe_to_toml(all));
  Recipe rne = load_recipe("ue5m3-b16-rne", kDir);
  EXPECT_EQ(rne.round_dy, Rounding::RNE);
  rne.round_dy = b16.round_dy;
  EXPECT_EQ(text_as(rne, b16), recipe_to_toml(b16));
}

// -------------------- fp4.weight_block (docs/recipes.md "Weight tiles apart from the blocks")

#include "fp4/config/settings.h"

TEST(RecipeWeightBlock, DefaultIsTheBlockAndShippedRecipesAreUnchanged) {
  // Absent from every shipped recipe: W's block is fp4.block, and the resolved text has no
  // weight_block line (the recipe.toml of earlier runs and checkpoints stays byte-identical).
  for (const auto& e : fs::directory_iterator(kDir)) {
    const Recipe r = load_recipe_file(e.path());
    EXPECT_EQ(r.weight_block, 0) << e.path();
    EXPECT_EQ(r.weight_block_size(), r.block) << e.path();
    EXPECT_EQ(r.spec_w().block, r.block) << e.path();
    EXPECT_EQ(recipe_to_toml(r).find("weight_block"), std::string::npos) << e.path();
  }
  // --set fp4.block moves the weights' block with it when weight_block is not set.
  const Recipe b32 = load_recipe("ue5m3-b16", kDir, parse_settings({"fp4.block=32"}).recipe);
  EXPECT_EQ(b32.weight_block_size(), 32);
  EXPECT_EQ(b32.spec_w().block, 32);
  // Set equal to block, it is the recipe without it: same value, same text.
  const Recipe plain = recipe_from_text(kBase, "t");
  const Recipe same = recipe_from_text(std::string(kBase) + "block = 16\nweight_block = 16\n", "t");
  EXPECT_TRUE(same == plain);
  EXPECT_EQ(recipe_to_toml(same), recipe_to_toml(plain));
}

TEST(RecipeWeightBlock, SetsEveryWeightSpecAndOnlyThose) {
  for (bool w2d : {true, false}) {
    const Recipe r = recipe_from_text(std::string(kBase) + "block = 16\nweight_block = 32\n" +
                                          (w2d ? "" : "weight_2d = false\n"),
                                      "wb.toml");
    EXPECT_EQ(r.block, 16);
    EXPECT_EQ(r.weight_block, 32);
    EXPECT_EQ(r.weight_block_size(), 32);
    const ResolvedLinears res = resolve_layers(r, 1);
    for (const LinearPlan& p : res.plans)
      for (int g = 0; g < 3; ++g)
        for (int o = 0; o < 3; ++o) {
          if (!gemm_uses(Gemm(g), Operand(o))) continue;
          const BlockQuantSpec& s = p.spec(Gemm(g), Operand(o));
          const bool w = Operand(o) == Operand::W;
          EXPECT_EQ(s.block, w ? 32 : 16) << gemm_name(Gemm(g)) << "." << operand_name(Operand(o));
          EXPECT_EQ(s.two_d, w && w2d) << gemm_name(Gemm(g)) << "." << operand_name(Operand(o));
        }
    // Written after block, re-read to the same recipe, written again to the same text.
    const std::string t = recipe_to_toml(r);
    EXPECT_NE(t.find("block = 16\nweight_block = 32\nweight_2d = "), std::string::npos) << t;
    const Recipe back = recipe_from_text(t, "wb.toml");  // the same source: == compares it
    EXPECT_TRUE(back == r) << t;
    EXPECT_EQ(recipe_to_toml(back), t);
  }
  // --set fp4.weight_block: the same parse, the name labelled; an explicit weight_block keeps
  // its value under --set fp4.block; with the RHT it need not be a multiple of 16 (the RHT
  // transforms the wgrad operands, which are dY and X).
  const Recipe s = load_recipe("ue5m3-b16", kDir, parse_settings({"fp4.weight_block=32"}).recipe);
  EXPECT_EQ(s.name, "ue5m3-b16+fp4.weight_block=32");
  EXPECT_EQ(s.spec_w().block, 32);
  EXPECT_EQ(s.spec_x().block, 16);
  EXPECT_EQ(s.spec_dy().block, 16);
  const Recipe both = load_recipe(
      "ue5m3-b16", kDir, parse_settings({"fp4.weight_block=16", "fp4.block=32"}).recipe);
  EXPECT_EQ(both.spec_w().block, 16);
  EXPECT_EQ(both.spec_x().block, 32);
  const Recipe te = load_recipe("nvfp4-te", kDir, parse_settings({"fp4.weight_block=24"}).recipe);
  EXPECT_EQ(te.spec_w().block, 24);
}

TEST(RecipeWeightBlock, BadValuesNameTheFileAndKey) {
  for (const char* bad : {"0", "-16", "257", "4096", "16.5", "\"32\"", "true", "[32]"}) {
    const std::string e = error_of(
        [&] { recipe_from_text(std::string(kBase) + "weight_block = " + bad + "\n", "bad.toml"); });
    EXPECT_NE(e.find("bad.toml"), std::string::npos) << bad << " -> " << e;
    EXPECT_NE(e.find("'fp4.weight_block'"), std::string::npos) << bad << " -> " << e;
  }
  // Out of range: the allowed sizes are named.
  const std::string e =
      error_of([&] { recipe_from_text(std::string(kBase) + "weight_block = 0\n", "bad.toml"); });
  EXPECT_NE(e.find("1..256"), std::string::npos) << e;
  EXPECT_NE(e.find("got 0"), std::string::npos) << e;
  // Through --set: the same check, naming the argument.
  const std::string s = error_of(
      [&] { load_recipe("ue5m3-b16", kDir, parse_settings({"fp4.weight_block=300"}).recipe); });
  EXPECT_NE(s.find("--set fp4.weight_block=300"), std::string::npos) << s;
  EXPECT_NE(s.find("'fp4.weight_block'"), std::string::npos) << s;
  // A misspelt key is unknown, not taken for weight_block.
  const std::string u =
      error_of([&] { recipe_from_text(std::string(kBase) + "weight_blocks = 32\n", "bad.toml"); });
  EXPECT_NE(u.find("'fp4.weight_blocks'"), std::string::npos) << u;
}

// -------------------- fp4.hadamard_size / hadamard_gemms / hadamard_signs (docs/recipes.md
// "Every knob", docs/numerics.md "Random Hadamard transform")

TEST(RecipeHadamard, DefaultsAreWhatRhtWgradMeantAndShippedRecipesAreUnchanged) {
  // Absent from every shipped recipe's resolved text but quartet2's (Quartet II's own 128-point
  // transform re-drawn per call: tests/nn/test_linear_quartet.cpp); rht_wgrad alone is 16
  // points, fixed signs, wgrad only.
  for (const auto& e : fs::directory_iterator(kDir)) {
    if (e.path().stem() == "quartet2") continue;
    const Recipe r = load_recipe_file(e.path());
    EXPECT_EQ(r.hadamard_size, 16) << e.path();
    EXPECT_FALSE(r.hadamard_dgrad) << e.path();
    EXPECT_EQ(r.hadamard_signs, HadamardSigns::Fixed) << e.path();
    EXPECT_EQ(recipe_to_toml(r).find("hadamard"), std::string::npos) << e.path();
  }
  // Spelled out at their defaults, the keys give the recipe without them: same value, same text.
  const Recipe te = load_recipe("nvfp4-te", kDir);
  const Recipe same = load_recipe("nvfp4-te", kDir,
                                  parse_settings({"fp4.hadamard_size=16", "fp4.hadamard_gemms=[\"wgrad\"]",
                                                  "fp4.hadamard_signs=fixed"}).recipe);
  Recipe renamed = same;
  renamed.name = te.name;  // --set labels the name (and the source)
  renamed.source = te.source;
  EXPECT_TRUE(renamed == te);
  EXPECT_EQ(recipe_to_toml(renamed), recipe_to_toml(te));
}

TEST(RecipeHadamard, ParseSerialiseAndPlans) {
  const Recipe r = recipe_from_text(std::string(kBase) +
                                        "hadamard_size = 128\nhadamard_gemms = [\"dgrad\", \"wgrad\"]\n"
                                        "hadamard_signs = \"per-step\"\n",
                                    "h.toml");
  EXPECT_TRUE(r.rht_wgrad) << "\"wgrad\" in hadamard_gemms is rht_wgrad";
  EXPECT_TRUE(r.hadamard_dgrad);
  EXPECT_EQ(r.hadamard_size, 128);
  EXPECT_EQ(r.hadamard_signs, HadamardSigns::PerStep);
  const LinearPlan p = LinearPlan::uniform(r, LinearMode::FP4);
  EXPECT_TRUE(p.rht() && p.dgrad_hadamard());
  EXPECT_EQ(p.hadamard_size, 128);
  EXPECT_EQ(p.hadamard_signs, HadamardSigns::PerStep);
  EXPECT_FALSE(LinearPlan::uniform(r, LinearMode::BF16).dgrad_hadamard());
  const HadamardTransform h = p.hadamard(5, 2, 9);
  float want[128];
  hadamard_signs(128, HadamardSigns::PerStep, 5, 2, 9, want);
  EXPECT_EQ(h.n, 128);
  EXPECT_TRUE(std::equal(want, want + 128, h.signs.begin()));
  const std::string t = recipe_to_toml(r);
  EXPECT_NE(t.find("rht_wgrad = true\nhadamard_size = 128\nhadamard_gemms = [\"dgrad\", \"wgrad\"]\n"
                   "hadamard_signs = \"per-step\"\n"),
            std::string::npos) << t;
  const Recipe back = recipe_from_text(t, "h.toml");
  EXPECT_TRUE(back == r) << t;
  EXPECT_EQ(recipe_to_toml(back), t);
  // dgrad only: rht_wgrad false, written as such.
  const Recipe d = recipe_from_text(std::string(kBase) + "hadamard_gemms = [\"dgrad\"]\n", "d.toml");
  EXPECT_FALSE(d.rht_wgrad);
  EXPECT_TRUE(d.hadamard_dgrad);
  EXPECT_NE(recipe_to_toml(d).find("rht_wgrad = false\nhadamard_gemms = [\"dgrad\"]\n"), std::string::npos);
  EXPECT_TRUE(recipe_from_text(recipe_to_toml(d), "d.toml") == d);
  // An empty list switches both off; --set takes every key and labels the name.
  EXPECT_FALSE(recipe_from_text(std::string(kBase) + "hadamard_gemms = []\n", "e").rht_wgrad);
  const Recipe s = load_recipe("nvfp4-te", kDir,
                               parse_settings({"fp4.hadamard_size=64", "fp4.hadamard_signs=per-layer"}).recipe);
  EXPECT_EQ(s.hadamard_size, 64);
  EXPECT_EQ(s.hadamard_signs, HadamardSigns::PerLayer);
  EXPECT_NE(s.name.find("fp4.hadamard_size=64"), std::string::npos) << s.name;
}

TEST(RecipeHadamard, BadValuesNameTheFileAndKey) {
  struct Case {
    const char* body;
    const char* key;
    const char* detail;
  } cases[] = {
      {"rht_wgrad = true\nhadamard_size = 48\n", "'fp4.hadamard_size'", "got 48"},
      {"rht_wgrad = true\nhadamard_size = 256\n", "'fp4.hadamard_size'", "16, 32, 64 or 128"},
      {"rht_wgrad = true\nhadamard_size = \"64\"\n", "'fp4.hadamard_size'", ""},
      {"hadamard_size = 64\n", "'fp4.hadamard_size'", "no GEMM has a Hadamard"},
      {"hadamard_signs = \"per-step\"\n", "'fp4.hadamard_signs'", "no GEMM has a Hadamard"},
      {"rht_wgrad = true\nhadamard_signs = \"random\"\n", "'fp4.hadamard_signs'", "random"},
      {"hadamard_gemms = [\"fprop\"]\n", "'fp4.hadamard_gemms'", "fprop"},
      {"hadamard_gemms = [\"dgrad\", \"dgrad\"]\n", "'fp4.hadamard_gemms'", "distinct"},
      {"hadamard_gemms = \"dgrad\"\n", "'fp4.hadamard_gemms'", ""},
      {"rht_wgrad = false\nhadamard_gemms = [\"wgrad\"]\n", "'fp4.hadamard_gemms'", "rht_wgrad = false"},
      {"hadamard_sizes = 64\n", "'fp4.hadamard_sizes'", ""},
  };
  for (const Case& c : cases) {
    const std::string e =
        error_of([&] { recipe_from_text(std::string(kBase) + c.body, "bad.toml"); });
    EXPECT_NE(e.find("bad.toml"), std::string::npos) << c.body << " -> " << e;
    EXPECT_NE(e.find(c.key), std::string::npos) << c.body << " -> " << e;
    EXPECT_NE(e.find(c.detail), std::string::npos) << c.body << " -> " << e;
  }
  const std::string p = error_of([&] {
    recipe_from_text("name = \"t\"\n[linear]\nmode = \"fp4\"\ngemm = \"probe-matched\"\n[fp4]\n"
                     "hadamard_gemms = [\"dgrad\"]\n", "bad.toml");
  });
  EXPECT_NE(p.find("probe-matched"), std::string::npos) << p;
  const std::string s = error_of(
      [&] { load_recipe("nvfp4-te", kDir, parse_settings({"fp4.hadamard_size=100"}).recipe); });
  EXPECT_NE(s.find("--set fp4.hadamard_size=100"), std::string::npos) << s;
}

// ------------------------------------------ linear.gemm = "decoded-bf16" (docs/gemm.md)

TEST(RecipeGemmMode, DecodedBf16ParsesRoundTripsAndRefusesWhatItCannotCarry) {
  const Recipe r = load_recipe("nvfp4-te", kDir, parse_settings({"linear.gemm=decoded-bf16"}).recipe);
  EXPECT_EQ(r.gemm, GemmMode::DecodedBf16);
  EXPECT_TRUE(LinearPlan::uniform(r, LinearMode::FP4).bf16_gemm());
  EXPECT_FALSE(LinearPlan::uniform(r, LinearMode::FP4).probe());
  EXPECT_NE(recipe_to_toml(r).find("gemm = \"decoded-bf16\""), std::string::npos);
  EXPECT_EQ(recipe_from_text(recipe_to_toml(r), "round.toml").gemm, GemmMode::DecodedBf16);
  {  // the run header names the FP4 GEMM of a recipe with FP4 linears, and only of one
    RunConfig cfg = micro_run(2);
    nn::Model model(cfg.model, r, 1, 16);
    EXPECT_NE(describe_linear_plans(r, model).find("per block; FP4 GEMM decoded-bf16)"), std::string::npos)
        << describe_linear_plans(r, model);
    const Recipe d = load_recipe("nvfp4-te", kDir, parse_settings({"linear.gemm=decoded"}).recipe);
    nn::Model dm(cfg.model, d, 1, 16);
    EXPECT_NE(describe_linear_plans(d, dm).find("per block; FP4 GEMM decoded)"), std::string::npos)
        << describe_linear_plans(d, dm);
    const Recipe f = load_recipe("fp32", kDir);
    nn::Model fm(cfg.model, f, 1, 16);
    EXPECT_EQ(describe_linear_plans(f, fm).find("FP4 GEMM"), std::string::npos)
        << describe_linear_plans(f, fm);
  }
  struct Case {
    std::vector<std::string> sets;
    std::string key, detail;
  };
  const Case cases[] = {
      {{"fp4.element_format=e2m3"}, "fp4.element_format", "decoded-bf16"},
      {{"fp4.scale_format=ue4m3"}, "fp4.scale_format", "decoded-bf16"},
      {{"fp4.row_scaled_activation=true", "fp4.amax_interval=1"}, "fp4.row_scaled_activation",
       "decoded-bf16"},
      {{"linear.probe_snap=256"}, "linear.probe_snap", "decoded-bf16"},
      {{"fp4.scale_format=ue8m0", "fp4.scale_target=1e20"}, "fp4.scale_target", "2^48"},
      {{"fp4.scale_format=ue8m0", "fp4.scale_target=1e-20"}, "fp4.scale_target", "2^-24"},
      {{"fp4.scale_format=ue8m0", "fp4.four_over_six=all", "fp4.four_over_six_scale_target=1e-20"},
       "fp4.four_over_six_scale_target", "2^-24"},
      {{"fp4.scale_format=ue8m0", "fp4.four_over_six=all", "fp4.four_over_six_scale_target=1e20"},
       "fp4.four_over_six_scale_target", "2^48"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> sets = c.sets;
    sets.push_back("linear.gemm=decoded-bf16");
    const std::string e =
        error_of([&] { load_recipe("nvfp4-te", kDir, parse_settings(sets).recipe); });
    EXPECT_NE(e.find(c.key), std::string::npos) << c.sets[0] << " -> " << e;
    EXPECT_NE(e.find(c.detail), std::string::npos) << c.sets[0] << " -> " << e;
  }
  const std::string ov = error_of([&] {  // an override's scale target is held to the band too
    load_recipe("ue5m3-b16-t2048", kDir,
                parse_settings({"linear.gemm=decoded-bf16", "fp4.scale_format=ue8m0",
                                "override[0].scale_target=1e30"}).recipe);
  });
  EXPECT_NE(ov.find("override[0].scale_target"), std::string::npos) << ov;
  EXPECT_NE(ov.find("2^48"), std::string::npos) << ov;
  // the band applies to UE8M0 under the tensor-scaled rule only: E4M3 with T = 1e20 is accepted,
  // and so is UE8M0 at T = 2^48 (the edge) and under the MX rules (mxfp4)
  EXPECT_NO_THROW(load_recipe("nvfp4-te", kDir,
                              parse_settings({"linear.gemm=decoded-bf16", "fp4.scale_target=1e20"}).recipe));
  EXPECT_NO_THROW(load_recipe("nvfp4-te", kDir,
                              parse_settings({"linear.gemm=decoded-bf16", "fp4.scale_format=ue8m0",
                                              "fp4.scale_target=281474976710656.0"}).recipe));
  EXPECT_NO_THROW(load_recipe("mxfp4", kDir, parse_settings({"linear.gemm=decoded-bf16"}).recipe));
  const std::string q = error_of(
      [&] { load_recipe("quartet2", kDir, parse_settings({"linear.gemm=decoded-bf16"}).recipe); });
  EXPECT_NE(q.find("linear.gemm = \"decoded\""), std::string::npos) << q;
  const std::string m = error_of(
      [&] { load_recipe("nvfp4-te", kDir, parse_settings({"linear.gemm=bf16"}).recipe); });
  EXPECT_NE(m.find("decoded-bf16"), std::string::npos) << m;  // the choices are listed
}

// linear.gemm = "auto", the key's default (docs/recipes.md "Every knob"): decoded-bf16 where the
// recipe has FP4 linears and that GEMM carries them, decoded wherever a spelled decoded-bf16 is
// refused; resolved once by the reader and written back resolved.
TEST(RecipeGemmMode, AutoResolvesToDecodedBf16WhereItCarriesTheRecipe) {
  EXPECT_EQ(load_recipe("nvfp4-te", kDir).gemm, GemmMode::DecodedBf16);
  const std::vector<std::vector<std::string>> refused = {
      {"fp4.element_format=e2m3"},
      {"fp4.scale_format=ue4m3"},
      {"fp4.row_scaled_activation=true", "fp4.amax_interval=1"},
      {"fp4.scale_format=ue8m0", "fp4.scale_target=1e20"},
      {"fp4.scale_format=ue8m0", "fp4.scale_target=1e-20"},
      {"fp4.scale_format=ue8m0", "fp4.four_over_six=all", "fp4.four_over_six_scale_target=1e-20"},
  };
  for (const auto& sets : refused) {
    const Recipe r = load_recipe("nvfp4-te", kDir, parse_settings(sets).recipe);
    EXPECT_EQ(r.gemm, GemmMode::Decoded) << sets[0];
    EXPECT_NE(recipe_to_toml(r).find("gemm = \"decoded\""), std::string::npos) << sets[0];
    EXPECT_EQ(recipe_from_text(recipe_to_toml(r), "round.toml").gemm, GemmMode::Decoded) << sets[0];
  }
  {  // an override's scale target counts too
    const Recipe r = load_recipe(
        "ue5m3-b16-t2048", kDir,
        parse_settings({"fp4.scale_format=ue8m0", "override[0].scale_target=1e30"}).recipe);
    EXPECT_EQ(r.gemm, GemmMode::Decoded);
  }
  EXPECT_EQ(load_recipe("quartet2", kDir, parse_settings({"linear.gemm=auto"}).recipe).gemm,
            GemmMode::Decoded);
  EXPECT_EQ(load_recipe("fp32", kDir).gemm, GemmMode::Decoded);  // no FP4 linear
  EXPECT_EQ(load_recipe("bf16", kDir, parse_settings({"linear.gemm=auto"}).recipe).gemm,
            GemmMode::Decoded);
  // a recipe without the key, and one whose only FP4 linears come from an override
  EXPECT_EQ(recipe_from_text("[linear]\nmode = \"fp4\"\n", "bare").gemm, GemmMode::DecodedBf16);
  const Recipe ov = recipe_from_text(
      "[linear]\nmode = \"fp32\"\n[[override]]\nlinears = [\"down_proj\"]\n"
      "mode = \"fp4\"\n",
      "override-only");
  EXPECT_EQ(ov.gemm, GemmMode::DecodedBf16);
  EXPECT_NE(recipe_to_toml(ov).find("gemm = \"decoded-bf16\""), std::string::npos);
  // the probe-matched keys are refused under auto as under the decoded modes, naming auto
  const std::string e = error_of(
      [&] { load_recipe("nvfp4-te", kDir, parse_settings({"linear.probe_snap=256"}).recipe); });
  EXPECT_NE(e.find("gemm = \"auto\""), std::string::npos) << e;
}

// ------------------------------------------ [rounding] "rna" (docs/numerics.md "Rounding a magnitude")

TEST(RecipeRounding, RnaParsesRoundTripsAndReachesTheSpecs) {
  // "rna" (ties away from zero, Quartet II's forward) in [rounding] and in an override; written
  // back as "rna"; the plan's specs carry it. A misspelling names the key and the choices.
  const std::string text = std::string(kBase) + "[rounding]\nx = \"rna\"\nw = \"rna\"\n";
  const Recipe r = recipe_from_text(text, "rna.toml");
  EXPECT_EQ(r.round_x, Rounding::RNA);
  EXPECT_EQ(r.round_w, Rounding::RNA);
  EXPECT_EQ(r.round_dy, Rounding::SR8);
  const std::string t = recipe_to_toml(r);
  EXPECT_NE(t.find("x = \"rna\"\nw = \"rna\"\ndy = \"sr8\""), std::string::npos) << t;
  EXPECT_EQ(recipe_from_text(t, "rna.toml"), r);  // same source name: Recipe== compares it
  const LinearPlan p = LinearPlan::uniform(r, LinearMode::FP4);
  EXPECT_EQ(p.spec(Gemm::Fprop, Operand::X).rounding, Rounding::RNA);
  EXPECT_EQ(p.spec(Gemm::Fprop, Operand::W).rounding, Rounding::RNA);
  const std::string e = error_of([&] {
    recipe_from_text(std::string(kBase) + "[rounding]\nx = \"rtn\"\n", "bad.toml");
  });
  EXPECT_NE(e.find("bad.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("rounding.x"), std::string::npos) << e;
  EXPECT_NE(e.find("rna"), std::string::npos) << e;
}
