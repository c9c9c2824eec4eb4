// Gradient accumulation (train.micro_batch_size; docs/recipes.md "Micro-batches and data
// parallelism"): the step gradient is the mean of the micro-batch gradients summed in the fixed
// tree of fp4/dist/dist.h, the loss the mean of the micro-batch losses; held references are
// sampled on the first micro-batch, a per-call D = 1 amax on every one, and SR bits are keyed
// by the micro-batch index. Each expectation is rebuilt independently: the micro-batches run
// one by one through a second model with the same weights, and the tree is written out by hand.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/train/train.h"
#include "support/step_test_setup.h"

using namespace fp4;

namespace {

// A model of `micro` sequences per forward, initialised with seed 1.
struct AccumSetup {
  RunConfig cfg;
  Recipe recipe;
  TokenStream tokens = fp4::testing::random_tokens(5000, 64, 7);
  AccumSetup(const std::string& recipe_name, int batch, int micro)
      : cfg(fp4::testing::two_layer_config(0)), recipe(fp4::testing::shipped_recipe(recipe_name)) {
    cfg.train.batch_size = batch;
    cfg.train.micro_batch_size = micro;
    cfg.train.grad_clip = 0;  // model.grads() after the step is then the step's gradient
  }
};

// The step's global batch, as train_step draws it (BatchSampler of batch_size, seed 1).
void draw(const AccumSetup& s, std::vector<int32_t>& in, std::vector<int32_t>& tg) {
  BatchSampler sampler(s.tokens, s.cfg.train.seq_len, s.cfg.train.batch_size, 1);
  in.resize(size_t(s.cfg.train.batch_size) * s.cfg.train.seq_len);
  tg.resize(in.size());
  sampler.next(in.data(), tg.data());
}

// A fresh model with the weights `params` (its references empty, as at step 1) after the
// forward and backward of micro-batch m of step 1 alone.
std::unique_ptr<nn::Model> run_micro_alone(const AccumSetup& s, const std::vector<float>& params,
                                           int m) {
  auto model = std::make_unique<nn::Model>(s.cfg.model, s.recipe, s.cfg.train.micro(),
                                           s.cfg.train.seq_len);
  model->params() = params;
  std::vector<int32_t> in, tg;
  draw(s, in, tg);
  const int64_t rows = int64_t(s.cfg.train.micro()) * s.cfg.train.seq_len;
  nn::StepContext ctx;
  ctx.step = 1;
  ctx.seed = s.cfg.train.seed;
  ctx.micro = m;
  ctx.first_micro = m == 0;
  model->zero_grad();
  model->forward(in.data() + m * rows, tg.data() + m * rows, s.cfg.train.micro(), ctx);
  model->backward(ctx);
  return model;
}

// Gradients and losses of the n micro-batches of step 1 run one after the other through one
// model with the weights `params` (so that micro-batch m > 0 sees the references held from
// micro-batch 0, as in the step), each from zeroed gradients.
std::vector<std::vector<float>> micro_grads_in_turn(const AccumSetup& s, const std::vector<float>& params,
                                                    std::vector<double>& loss) {
  nn::Model model(s.cfg.model, s.recipe, s.cfg.train.micro(), s.cfg.train.seq_len);
  model.params() = params;
  std::vector<int32_t> in, tg;
  draw(s, in, tg);
  const int n = s.cfg.train.n_micro();
  const int64_t rows = int64_t(s.cfg.train.micro()) * s.cfg.train.seq_len;
  std::vector<std::vector<float>> g;
  loss.assign(size_t(n), 0);
  for (int m = 0; m < n; ++m) {
    nn::StepContext ctx;
    ctx.step = 1;
    ctx.seed = s.cfg.train.seed;
    ctx.micro = m;
    ctx.first_micro = m == 0;
    model.zero_grad();
    loss[size_t(m)] = model.forward(in.data() + m * rows, tg.data() + m * rows, s.cfg.train.micro(), ctx);
    model.backward(ctx);
    g.push_back(model.grads());
  }
  return g;
}

// One train_step (step 1) of `s`; returns the model (its grads() = the step gradient).
std::unique_ptr<nn::Model> run_step(const AccumSetup& s, StepResult* res, std::vector<float>* init) {
  auto model = std::make_unique<nn::Model>(s.cfg.model, s.recipe, s.cfg.train.micro(),
                                           s.cfg.train.seq_len);
  model->init(1);
  if (init) *init = model->params();
  AdamW opt(model->num_params(), s.cfg.train);
  BatchSampler sampler(s.tokens, s.cfg.train.seq_len, s.cfg.train.batch_size, 1);
  std::vector<int32_t> in(size_t(s.cfg.train.batch_size) * s.cfg.train.seq_len), tg(in.size());
  StepBuffers buf;
  *res = train_step(*model, opt, sampler, s.cfg, s.recipe, 1, in, tg, buf);
  return model;
}

class GradAccum : public ::testing::TestWithParam<const char*> {};

// n = 2, 3 and 4 micro-batches: the tree of fp4/dist/dist.h written out by hand, then one FP32
// division by n; the loss is the double mean of the micro-batch losses.
TEST_P(GradAccum, StepGradientIsTheTreeMeanOfTheMicroBatchGradients) {
  for (int n : {2, 3, 4}) {
    const AccumSetup s(GetParam(), n, 1);
    StepResult r;
    std::vector<float> p0;
    const auto model = run_step(s, &r, &p0);
    ASSERT_TRUE(r.diverged.empty()) << r.diverged;
    std::vector<double> loss;
    const std::vector<std::vector<float>> g = micro_grads_in_turn(s, p0, loss);
    const size_t len = p0.size();
    std::vector<float> want(len), sum_only(len);
    for (size_t i = 0; i < len; ++i) {
      float t;
      if (n == 2) t = g[0][i] + g[1][i];                              // [0,1) + [1,2)
      else if (n == 3) t = g[0][i] + (g[1][i] + g[2][i]);             // [0,1) + [1,3)
      else t = (g[0][i] + g[1][i]) + (g[2][i] + g[3][i]);             // [0,2) + [2,4)
      sum_only[i] = t;
      want[i] = t / float(n);
    }
    EXPECT_EQ(std::memcmp(want.data(), model->grads().data(), len * sizeof(float)), 0)
        << GetParam() << ": n = " << n;
    EXPECT_NE(std::memcmp(sum_only.data(), model->grads().data(), len * sizeof(float)), 0)
        << "the update must use the mean, not the sum";
    double ls = 0;
    for (double l : loss) ls += l;
    EXPECT_EQ(r.loss, ls / n);
  }
}

// Every shipped recipe but ue5m3-b16-t2048, whose override needs 4 MLP blocks (this model has 2),
// and two of them with the reference decoded GEMM ("@decoded"; gemm = "auto" runs decoded-bf16).
INSTANTIATE_TEST_SUITE_P(Recipes, GradAccum,
                         ::testing::Values("fp32", "bf16", "ue5m3-b16", "ue5m3-b32", "ue5m3-te",
                                           "ue5m3-b16-probe", "nvfp4-te", "nvfp4-all", "mxfp4",
                                           "ue5m3-b16@decoded", "nvfp4-te@decoded"),
                         [](const auto& i) {
                           std::string n = i.param;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// FP32: two micro-batches of B against one forward of 2B. Only the FP32 summation order
// differs (the wgrad GEMMs sum 2B·T token terms at once instead of B·T twice; the mean's
// 1/(2BT) and 1/(BT)·1/2 are the same powers of two). Standard bound for a sum of M terms in
// two orders: |Δ| ≤ 2·γ_M·Σ|terms| with γ_M = M·u/(1 − M·u), u = 2^-24; taken normwise and
// compounded over the backward's depth (2 blocks per layer + norm_f + head + embedding).
TEST(GradAccumFp32, AgreesWithOneForwardOfTheWholeBatch) {
  const AccumSetup s2("fp32", 4, 2), s1("fp32", 4, 4);
  StepResult r2, r1;
  const auto m2 = run_step(s2, &r2, nullptr);
  const auto m1 = run_step(s1, &r1, nullptr);
  double d2 = 0, g2 = 0;
  for (size_t i = 0; i < m1->grads().size(); ++i) {
    const double d = double(m2->grads()[i]) - double(m1->grads()[i]);
    d2 += d * d;
    g2 += double(m1->grads()[i]) * double(m1->grads()[i]);
  }
  const double M = 4.0 * s1.cfg.train.seq_len, u = std::ldexp(1.0, -24);
  const double depth = 2.0 * s1.cfg.model.n_layers + 3;
  const double tol = 2 * (M * u / (1 - M * u)) * depth;
  EXPECT_LE(std::sqrt(d2 / g2), tol);
  EXPECT_GT(g2, 0);
  EXPECT_NEAR(r2.loss, r1.loss, tol * r1.loss);
}

// D = 50: every reference (X, W, dY of every FP4 linear) is sampled on micro-batch 0 and held
// through micro-batch 1.
TEST(GradAccumReferences, HeldReferencesAreSampledOnTheFirstMicroBatch) {
  const AccumSetup s("ue5m3-b16", 4, 2);
  ASSERT_EQ(s.recipe.amax_interval, 50);
  StepResult r;
  std::vector<float> p0;
  const auto model = run_step(s, &r, &p0);
  const auto first = run_micro_alone(s, p0, 0), second = run_micro_alone(s, p0, 1);
  int differs = 0, checked = 0;
  for (size_t i = 0; i < model->linears().size(); ++i)
    for (nn::Role role : {nn::Role::X, nn::Role::W, nn::Role::DY}) {
      const TensorReference& got = model->linears()[i].reference(role);
      if (!got.has_value()) continue;
      ++checked;
      EXPECT_EQ(got.held(), first->linears()[i].reference(role).held()) << model->linear_name(i);
      EXPECT_EQ(got.last_refresh(), 1);
      differs += got.held() != second->linears()[i].reference(role).held();
    }
  EXPECT_GT(checked, 0);
  EXPECT_GT(differs, 0) << "micro-batch 1 alone should give other activation amaxes";
}

// D = 1: "per-call" measures at every micro-batch (the last one's amax is left), "per-step"
// samples once, on micro-batch 0.
TEST(GradAccumReferences, PerCallAndPerStepCurrentScaling) {
  for (AmaxSample how : {AmaxSample::PerCall, AmaxSample::PerStep}) {
    AccumSetup s("ue5m3-b16", 4, 2);
    s.recipe.amax_interval = 1;
    s.recipe.amax_sample = how;
    StepResult r;
    std::vector<float> p0;
    const auto model = run_step(s, &r, &p0);
    const auto first = run_micro_alone(s, p0, 0), second = run_micro_alone(s, p0, 1);
    const nn::Model* want = how == AmaxSample::PerCall ? second.get() : first.get();
    int differs = 0;
    for (size_t i = 0; i < model->linears().size(); ++i) {
      const float got = model->linears()[i].reference(nn::Role::X).held();
      EXPECT_EQ(got, want->linears()[i].reference(nn::Role::X).held()) << model->linear_name(i);
      differs += first->linears()[i].reference(nn::Role::X).held() !=
                 second->linears()[i].reference(nn::Role::X).held();
    }
    EXPECT_GT(differs, 0);
  }
}

// SR bits are keyed by the micro-batch: with RNE on dY (no other SR operand) micro-batch 1's
// gradient is the same whatever its key; with SR on dY it changes.
TEST(GradAccumSr, MicroBatchIndexKeysTheSrBits) {
  const AccumSetup s("ue5m3-b16", 4, 2);
  ASSERT_EQ(s.recipe.round_dy, Rounding::SR8);
  nn::Model model(s.cfg.model, s.recipe, 2, s.cfg.train.seq_len);
  model.init(1);
  std::vector<int32_t> in, tg;
  draw(s, in, tg);
  auto grad = [&](int micro) {
    nn::StepContext ctx;
    ctx.step = 1;
    ctx.seed = 1;
    ctx.micro = micro;
    model.zero_grad();
    model.forward(in.data(), tg.data(), 2, ctx);
    model.backward(ctx);
    return model.grads();
  };
  EXPECT_NE(grad(0), grad(1));
}

TEST(GradAccumConfig, BatchMustBeAMultipleOfTheMicroBatch) {
  RunConfig c = fp4::testing::two_layer_config(0);
  c.train.warmup_steps = 2;
  c.model.vocab_size = 256;  // the parser's minimum (run_config_from_text below)
  c.train.batch_size = 6;
  c.train.micro_batch_size = 4;
  try {
    validate(c, "cfg.toml");
    FAIL() << "6 sequences in micro-batches of 4 accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("train.micro_batch_size"), std::string::npos) << e.what();
  }
  c.train.micro_batch_size = 3;
  validate(c, "cfg.toml");
  EXPECT_EQ(c.train.n_micro(), 2);
  // Written only when it splits the batch, and read back.
  const std::string text = run_config_to_toml(c);
  EXPECT_NE(text.find("micro_batch_size = 3"), std::string::npos);
  EXPECT_EQ(run_config_from_text(text, "t").train.micro_batch_size, 3);
  c.train.micro_batch_size = 0;
  EXPECT_EQ(run_config_to_toml(c).find("micro_batch_size"), std::string::npos);
}

TEST(GradAccumConfig, RecipeKeysRoundTrip) {
  Recipe r = fp4::testing::shipped_recipe("nvfp4-te");
  r.amax_sample = AmaxSample::PerStep;
  r.amax_ranks = AmaxRanks::Max;
  const Recipe back = recipe_from_text(recipe_to_toml(r), "t");
  EXPECT_EQ(back.amax_sample, AmaxSample::PerStep);
  EXPECT_EQ(back.amax_ranks, AmaxRanks::Max);
  const std::string plain = recipe_to_toml(fp4::testing::shipped_recipe("nvfp4-te"));
  EXPECT_EQ(plain.find("amax_sample"), std::string::npos);  // defaults are not written
  try {
    (void)recipe_from_text("name = \"x\"\n[fp4]\namax_ranks = \"sum\"\n", "bad.toml");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("fp4.amax_ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
