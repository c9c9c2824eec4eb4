// Whole-model checks: finite-difference gradients of the full decoder (fp32 recipe) for
// every parameter tensor, both MLP types; thread-count independence of a training step;
// config and recipe parsing with clear errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <unistd.h>

#include "fp4/nn/run_config.h"
#include "fp4/base/error.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"
#include "fp4/train/train.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
ModelConfig tiny_model(const std::string& mlp) {
  ModelConfig m;
  m.vocab_size = 37;
  m.d_model = 16;
  m.n_layers = 2;
  m.n_heads = 2;
  m.mlp = mlp;
  m.mlp_hidden = 24;
  m.init_std = 0.3f;  // large enough that gradients dominate FD noise
  return m;
}

void fill_tokens(std::vector<int32_t>& t, int V, uint32_t seed) {
  std::mt19937 g(seed);
  for (auto& x : t) x = static_cast<int32_t>(g() % V);
}

class ModelGrad : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGrad, WholeModelMatchesFiniteDifferences) {
  const ModelConfig mc = tiny_model(GetParam());
  Recipe fp32;
  const int B = 2, T = 6;
  nn::Model model(mc, fp32, B, T);
  model.init(3);
  std::vector<int32_t> in(B * T), tg(B * T);
  fill_tokens(in, mc.vocab_size, 1);
  fill_tokens(tg, mc.vocab_size, 2);
  nn::StepContext ctx;
  model.zero_grad();
  model.forward(in.data(), tg.data(), B, ctx);
  model.backward(ctx);
  const std::vector<float> g = model.grads();
  auto& p = model.params();
  // In each parameter tensor, check the 3 entries with the largest gradient.
  for (const auto& info : model.param_infos()) {
    std::vector<int64_t> idx(info.size);
    for (int64_t i = 0; i < info.size; ++i) idx[i] = info.offset + i;
    std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(),
                      [&](int64_t a, int64_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
    for (int k = 0; k < 3; ++k) {
      const int64_t i = idx[k];
      const float s = p[i], h = 1e-2f;
      p[i] = s + h;
      const double lp = model.forward(in.data(), tg.data(), B, ctx);
      p[i] = s - h;
      const double lm = model.forward(in.data(), tg.data(), B, ctx);
      p[i] = s;
      const double fd = (lp - lm) / (2.0 * h);
      EXPECT_NEAR(fd, g[i], 2e-2 * std::fabs(g[i]) + 2e-4)
          << info.name << " element " << (i - info.offset);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Mlp, ModelGrad, ::testing::Values("squared_relu", "swiglu"));

TEST(Model, ParameterCountOfTinyConfig) {
  // Hand count: V·C (wte) + V·C (head) + C (ln_f) + L·(2C + 4C² + 2·C·F).
  RunConfig cfg = load_run_config(fs::path(FP4_SOURCE_DIR) / "configs/tiny.toml");
  const auto& m = cfg.model;
  Recipe r;
  nn::Model model(m, r, 1, 8);
  const int64_t C = m.d_model, V = m.vocab_size, F = m.mlp_hidden, L = m.n_layers;
  EXPECT_EQ(model.num_params(), 2 * V * C + C + L * (2 * C + 4 * C * C + 2 * C * F));
  EXPECT_GE(model.num_body_params(), 3'000'000);
  EXPECT_LE(model.num_body_params(), 5'000'000);
}

TEST(Model, Fp4TrainingStepIsBitIdenticalForOneAndTwoThreads) {
  ModelConfig mc = tiny_model("squared_relu");
  mc.d_model = 32;
  const Recipe r = load_recipe("nvfp4-te", fs::path(FP4_SOURCE_DIR) / "configs/recipes");
  const int B = 2, T = 16;  // 32 tokens: multiple of 16 for the RHT
  std::vector<int32_t> in(B * T), tg(B * T);
  fill_tokens(in, mc.vocab_size, 5);
  fill_tokens(tg, mc.vocab_size, 6);
  std::vector<float> grads[2];
  double loss[2];
  const int saved = omp_get_max_threads();
  for (int t = 0; t < 2; ++t) {
    omp_set_num_threads(t + 1);
    nn::Model model(mc, r, B, T);
    model.init(4);
    nn::StepContext ctx;
    ctx.step = 1;
    ctx.seed = 8;
    model.zero_grad();
    loss[t] = model.forward(in.data(), tg.data(), B, ctx);
    model.backward(ctx);
    grads[t] = model.grads();
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(loss[0], loss[1]);
  ASSERT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * sizeof(float)));
}

TEST(Schedule, WarmupStableDecay) {
  TrainConfig c;
  c.lr = 1.0;
  c.steps = 100;
  c.warmup_steps = 10;
  c.decay_fraction = 0.15;
  c.min_lr_ratio = 0.01;
  EXPECT_DOUBLE_EQ(wsd_lr(c, 1), 0.1);
  EXPECT_DOUBLE_EQ(wsd_lr(c, 10), 1.0);
  EXPECT_DOUBLE_EQ(wsd_lr(c, 85), 1.0);  // decay covers steps 86..100
  EXPECT_NEAR(wsd_lr(c, 100), 0.01, 1e-12);
  EXPECT_LT(wsd_lr(c, 86), 1.0);
}

TEST(Optim, ClipGradNorm) {
  std::vector<float> g = {3.f, 4.f};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 2, 1.0), 5.0);
  EXPECT_FLOAT_EQ(g[0], 0.6f);
  EXPECT_FLOAT_EQ(g[1], 0.8f);
}

TEST(Optim, AdamWFirstStepMovesByLrTimesSign) {
  // Step 1 with bias correction: m̂ = g, v̂ = g², update = lr·(g/(|g|+eps) + wd·w).
  TrainConfig c;
  c.weight_decay = 0.1;
  std::vector<nn::ParamInfo> infos(2);
  infos[0] = {"w", 0, 2, 1, 2, true};
  infos[1] = {"norm", 2, 1, 1, 1, false};
  std::vector<float> p = {1.f, -2.f, 1.f}, g = {0.5f, -0.25f, 2.f};
  AdamW opt(3, c);
  opt.step(p.data(), g.data(), infos, 0.01, 1);
  EXPECT_NEAR(p[0], 1.f - 0.01f * (1.f + 0.1f * 1.f), 1e-6);
  EXPECT_NEAR(p[1], -2.f - 0.01f * (-1.f + 0.1f * -2.f), 1e-6);
  EXPECT_NEAR(p[2], 1.f - 0.01f * 1.f, 1e-6);  // no decay on norms
}

// ---- configs and recipes ----
// A per-process scratch directory, removed at exit.
struct ScratchDir {
  fs::path dir = fs::temp_directory_path() / ("fp4test_model_" + std::to_string(::getpid()));
  ScratchDir() { fs::create_directories(dir); }
  ~ScratchDir() { std::error_code ec; fs::remove_all(dir, ec); }
};
ScratchDir g_scratch;
fs::path write_tmp(const std::string& name, const std::string& text) {
  const fs::path p = g_scratch.dir / name;
  std::ofstream(p) << text;
  return p;
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Recipes, ShippedRecipesParseWithTheirTableValues) {
  const fs::path dir = fs::path(FP4_SOURCE_DIR) / "configs/recipes";
  const Recipe u = load_recipe("ue5m3-b16", dir);
  EXPECT_EQ(u.mode, LinearMode::FP4);
  EXPECT_EQ(u.scale_format, ScaleFormat::UE5M3);
  EXPECT_EQ(u.block, 16);
  EXPECT_EQ(u.amax_interval, 50);
  EXPECT_FALSE(u.rht_wgrad);
  EXPECT_TRUE(u.weight_2d);
  EXPECT_EQ(u.round_dy, Rounding::SR8);
  EXPECT_EQ(u.round_x, Rounding::RNE);
  EXPECT_EQ(u.scale_target, 448.f);
  EXPECT_EQ(u.round_w, Rounding::RNE);
  EXPECT_TRUE(u.element_format.is_e2m1());
  EXPECT_EQ(u.gemm, GemmMode::DecodedBf16);  // gemm = "auto": E2M1 with UE5M3 scales
  for (int b = 0; b < 4; ++b) EXPECT_EQ(u.block_mode(b, 4), LinearMode::FP4);
  // auto: decoded where the recipe is not FP4 or decoded-bf16 cannot carry it
  EXPECT_EQ(load_recipe("fp32", dir).gemm, GemmMode::Decoded);
  EXPECT_EQ(load_recipe("quartet2", dir).gemm, GemmMode::Decoded);
  EXPECT_EQ(load_recipe("ue5m3-b16-paper", dir).gemm, GemmMode::ProbeMatched);
  EXPECT_EQ(load_recipe("mxfp4", dir).gemm, GemmMode::DecodedBf16);
  const Recipe n = load_recipe("nvfp4-te", dir);
  EXPECT_EQ(n.scale_format, ScaleFormat::E4M3);
  EXPECT_EQ(n.amax_interval, 1);
  EXPECT_TRUE(n.rht_wgrad);
  EXPECT_TRUE(n.weight_2d);
  EXPECT_EQ(n.block, 16);
  EXPECT_EQ(n.scale_target, 448.f);
  EXPECT_EQ(n.round_x, Rounding::RNE);
  EXPECT_EQ(n.round_w, Rounding::RNE);
  EXPECT_EQ(n.round_dy, Rounding::SR8);
  EXPECT_EQ(n.high_precision_mode, LinearMode::BF16);
  EXPECT_EQ(n.block_mode(3, 4), LinearMode::BF16);  // final ~15% of 4 blocks = 1
  EXPECT_EQ(n.block_mode(2, 4), LinearMode::FP4);
  EXPECT_EQ(n.block_mode(30, 32), LinearMode::BF16);  // round(4.8) = 5 of 32
  EXPECT_EQ(n.block_mode(26, 32), LinearMode::FP4);
  EXPECT_EQ(load_recipe("fp32", dir).mode, LinearMode::FP32);
  EXPECT_EQ(load_recipe("bf16", dir).mode, LinearMode::BF16);
  // Round trip through the resolved-recipe writer.
  const auto p = write_tmp("rt.toml", recipe_to_toml(n));
  const Recipe n2 = load_recipe_file(p);
  EXPECT_EQ(n2.scale_format, n.scale_format);
  EXPECT_EQ(n2.final_blocks_fraction, n.final_blocks_fraction);
  EXPECT_EQ(n2.rht_wgrad, n.rht_wgrad);
  EXPECT_EQ(n2.description, n.description);
}

TEST(Recipes, BadRecipesNameTheProblem) {
  const fs::path dir = fs::path(FP4_SOURCE_DIR) / "configs/recipes";
  EXPECT_NE(error_of([&] { load_recipe("nope", dir); }).find("ue5m3-b16"), std::string::npos);
}
}  // namespace

namespace {
TEST(Recipes, MalformedUnknownAndOutOfRange) {
  std::string e = error_of([] { load_recipe_file(write_tmp("a.toml", "name = \"x\"\n[fp4\nblock=1")); });
  EXPECT_NE(e.find("malformed TOML"), std::string::npos) << e;
  e = error_of([] { load_recipe_file(write_tmp("b.toml", "[fp4]\nblok = 16\n")); });
  EXPECT_NE(e.find("unknown key 'fp4.blok'"), std::string::npos) << e;
  e = error_of([] { load_recipe_file(write_tmp("c.toml", "[fp4]\nblock = 0\n")); });
  EXPECT_NE(e.find("fp4.block"), std::string::npos) << e;
  e = error_of([] { load_recipe_file(write_tmp("d.toml", "[fp4]\nscale_format = \"e5m2\"\n")); });
  EXPECT_NE(e.find("e5m2"), std::string::npos) << e;
  e = error_of([] { load_recipe_file(write_tmp("e.toml", "[rounding]\ndy = 3\n")); });
  EXPECT_NE(e.find("rounding.dy"), std::string::npos) << e;
  e = error_of([] { load_recipe_file(write_tmp("f.toml", "[extra]\nx = 1\n")); });
  EXPECT_NE(e.find("unknown section [extra]"), std::string::npos) << e;
}

TEST(Config, TinyConfigAndErrors) {
  const RunConfig c = load_run_config(fs::path(FP4_SOURCE_DIR) / "configs/tiny.toml");
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.model.n_layers, 4);
  EXPECT_EQ(c.train.seq_len, 256);
  EXPECT_EQ(c.train.batch_size, 16);
  std::string e = error_of([] { load_run_config(write_tmp("g.toml", "[model]\nd_model = 30\nn_heads = 4\n")); });
  EXPECT_NE(e.find("divisible"), std::string::npos) << e;
  e = error_of([] { load_run_config(write_tmp("h.toml", "[train]\nlr = -1.0\n")); });
  EXPECT_NE(e.find("train.lr"), std::string::npos) << e;
  e = error_of([] { load_run_config(write_tmp("i.toml", "[train]\nstep = 5\n")); });
  EXPECT_NE(e.find("unknown key 'train.step'"), std::string::npos) << e;
  e = error_of([] { load_run_config("/nonexistent/x.toml"); });
  EXPECT_NE(e.find("not found"), std::string::npos) << e;
  // The resolved config round-trips.
  const RunConfig c2 = load_run_config(write_tmp("j.toml", run_config_to_toml(c)));
  EXPECT_EQ(c2.train.lr, c.train.lr);
  EXPECT_EQ(c2.model.norm_eps, c.model.norm_eps);
}

// The paper's schedule (arXiv 2609.02846, Table 8) as configs/nemotron-h-8b.toml states it:
// peak 8e-4, no warmup, constant through 85% of 30,000 steps, then linear decay to 1% of
// peak over the last 4,500 (steps 25,501..30,000).
TEST(Schedule, Nemotron8BConfigHasThePaperTable8Schedule) {
  const RunConfig c = load_run_config(fs::path(FP4_SOURCE_DIR) / "configs/nemotron-h-8b.toml");
  const TrainConfig& t = c.train;
  EXPECT_EQ(t.steps, 30000);
  EXPECT_EQ(t.warmup_steps, 0);
  EXPECT_EQ(t.beta1, 0.9);
  EXPECT_EQ(t.beta2, 0.95);
  EXPECT_EQ(t.eps, 1e-8);
  EXPECT_EQ(t.weight_decay, 0.1);
  EXPECT_EQ(t.grad_clip, 1.0);
  EXPECT_EQ(t.batch_size, 768);
  EXPECT_EQ(t.seq_len, 8192);
  EXPECT_EQ(c.model.mamba_chunk_size, 256);
  EXPECT_DOUBLE_EQ(wsd_lr(t, 1), 8e-4);       // no warmup: the peak from step 1
  EXPECT_DOUBLE_EQ(wsd_lr(t, 25500), 8e-4);   // the last constant step (85% of 30,000)
  EXPECT_LT(wsd_lr(t, 25501), 8e-4);          // the first decay step
  // Midpoint of the decay, step 25,500 + 4,500/2: 8e-4·(1 − 0.5·(1 − 0.01)) = 4.04e-4.
  EXPECT_NEAR(wsd_lr(t, 27750), 4.04e-4, 1e-15);
  EXPECT_NEAR(wsd_lr(t, 30000), 8e-6, 1e-15);  // the last step: 1% of peak
  // The paper's final window: the last 250 steps.
  EXPECT_EQ(t.final_window_steps(), 250);
}

// train.final_window: a fraction (float in (0, 1)) or a step count (integer >= 1).
TEST(Config, FinalWindowStepsOrFraction) {
  // The default is the window of every earlier run: max(1, steps / 10), for every steps.
  TrainConfig d;
  EXPECT_EQ(d.final_window, 0.1);
  for (int n = 1; n <= 300000; ++n) {
    d.steps = n;
    ASSERT_EQ(d.final_window_steps(), std::max(1, n / 10)) << n;
  }
  for (int n : {1 << 29, (1 << 30) - 1, 1 << 30}) {
    d.steps = n;
    EXPECT_EQ(d.final_window_steps(), n / 10) << n;
  }
  auto window = [](const std::string& value, int steps) {
    const RunConfig c = load_run_config(write_tmp(
        "fw.toml", "[train]\nsteps = " + std::to_string(steps) + "\nwarmup_steps = 0\n" +
                       "final_window = " + value + "\n"));
    return c.train.final_window_steps();
  };
  EXPECT_EQ(window("250", 30000), 250);   // the paper's window
  EXPECT_EQ(window("250", 250), 250);     // the whole run
  EXPECT_EQ(window("1", 10), 1);          // an integer 1 is one step
  EXPECT_EQ(window("0.3", 10), 3);        // 0.3·10 = 3 (not 2 from 0.3's binary rounding)
  EXPECT_EQ(window("0.25", 30), 7);       // floor(7.5)
  EXPECT_EQ(window("0.01", 50), 1);       // floor(0.5) = 0: at least one step
  EXPECT_EQ(window("0.5", 1), 1);
  EXPECT_EQ(window("0.1", 200), 20);      // the default, written out
  // Refused, with the key named: zero, negative, a float of 1 or more (a step count is an
  // integer), a step count above train.steps, a non-number.
  auto error = [](const std::string& value) {
    return error_of([&] {
      load_run_config(write_tmp("fwe.toml", "[train]\nsteps = 100\nwarmup_steps = 0\n"
                                            "final_window = " + value + "\n"));
    });
  };
  for (const char* bad : {"0", "-3", "0.0", "-0.5", "1.0", "1.5", "250.0", "nan", "inf", "\"10%\""}) {
    const std::string e = error(bad);
    EXPECT_NE(e.find("train.final_window"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_NE(error("250.0").find("written as an integer: 250"), std::string::npos) << error("250.0");
  EXPECT_NE(error("0").find("a fraction of train.steps in (0, 1)"), std::string::npos) << error("0");
  EXPECT_NE(error("\"10%\"").find("a number"), std::string::npos) << error("\"10%\"");
  const std::string over = error("101");
  EXPECT_NE(over.find("train.final_window (101 steps) must not exceed train.steps (100)"),
            std::string::npos) << over;
  // With --set the error names the argument.
  const fs::path f = write_tmp("fws.toml", "[train]\nsteps = 100\nwarmup_steps = 0\n");
  const std::string se = error_of([&] { load_run_config(f, parse_settings({"train.final_window=2.5"}).config); });
  EXPECT_NE(se.find("--set train.final_window=2.5"), std::string::npos) << se;
  EXPECT_NE(se.find("train.final_window"), std::string::npos) << se;
  EXPECT_EQ(load_run_config(f, parse_settings({"train.final_window=40"}).config).train.final_window_steps(), 40);

  // The resolved config: absent at the default (earlier texts unchanged), else as written.
  RunConfig c;
  EXPECT_EQ(run_config_to_toml(c).find("final_window"), std::string::npos);
  c.train.final_window = 250;
  std::string toml = run_config_to_toml(c);
  EXPECT_NE(toml.find("\nfinal_window = 250\n"), std::string::npos) << toml;
  EXPECT_EQ(run_config_from_text(toml, "x").train.final_window, 250.0);
  c.train.final_window = 0.3;
  toml = run_config_to_toml(c);
  EXPECT_NE(toml.find("\nfinal_window = 0.3\n"), std::string::npos) << toml;
  EXPECT_EQ(run_config_from_text(toml, "x").train, c.train);
}
}  // namespace

namespace {
TEST(Model, NanReachingAQuantizerIsANonFiniteError) {
  // The trainer turns this typed error into "the run diverged at step N".
  const Recipe r = load_recipe("ue5m3-b16", fs::path(FP4_SOURCE_DIR) / "configs/recipes");
  const ModelConfig mc = tiny_model("squared_relu");
  nn::Model model(mc, r, 1, 4);
  model.init(1);
  std::vector<int32_t> in = {1, 2, 3, 4}, tg = {2, 3, 4, 5};
  for (const auto& p : model.param_infos())
    if (p.name == "layers.0.mixer.q_proj") model.params()[p.offset] = std::nanf("");
  nn::StepContext ctx;
  EXPECT_THROW(model.forward(in.data(), tg.data(), 1, ctx), NonFiniteError);
}
}  // namespace
