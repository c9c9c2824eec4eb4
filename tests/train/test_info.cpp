// fp4::model_info (`fp4train info`): the Nemotron-H 8B parameter count against the arithmetic
// of its published shape, its 112 FP4-eligible linears and the linears each recipe changes;
// on the tiny hybrid config, the step memory against a built nn::Model.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fp4/nn/run_config.h"
#include "fp4/base/error.h"
#include "fp4/train/info.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"
#include "fp4/config/settings.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
const fs::path kSrc = FP4_SOURCE_DIR;

RunConfig config(const std::string& name) { return load_run_config(kSrc / "configs" / name); }
Recipe recipe(const std::string& name, const std::vector<std::string>& sets = {}) {
  return load_recipe(name, kSrc / "configs/recipes", parse_settings(sets).recipe);
}

// The linears of `in` of mode `m`, by name (lm_head excluded).
std::set<std::string> names_of_mode(const ModelInfo& in, LinearMode m) {
  std::set<std::string> s;
  for (const LinearInfo& l : in.linears)
    if (l.kind != "lm_head" && l.mode == m) s.insert(l.name);
  return s;
}
std::string L(int block, const char* kind) {
  return "layers." + std::to_string(block) + ".mixer." + kind;
}
}  // namespace

// Nemotron-H 8B (arXiv 2504.03624; HF nvidia/Nemotron-H-8B-Base-8K): the count from its shape.
TEST(ModelInfo, Nemotron8BParameterCountFromTheShape) {
  const ModelInfo in = model_info(config("nemotron-h-8b.toml"), recipe("ue5m3-b16"));
  const int64_t V = 131072, d = 4096;
  const int64_t H = 128, P = 64, di = H * P, G = 8, N = 128, W = 4;  // Mamba-2
  const int64_t Hq = 32, Hkv = 4, hd = 128;                          // attention
  const int64_t F = 21504;                                           // MLP
  const int64_t mamba = d                          // block norm
                        + d * (2 * di + 2 * G * N + H)  // in_proj
                        + (di + 2 * G * N) * W     // conv1d weight
                        + (di + 2 * G * N)         // conv1d bias
                        + H + H + H                // dt_bias, A_log, D
                        + di                       // gated norm weight
                        + di * d;                  // out_proj
  const int64_t attention = d + d * Hq * hd + 2 * d * Hkv * hd + Hq * hd * d;
  const int64_t mlp = d + d * F + F * d;
  const int64_t total = V * d + V * d + d + 24 * mamba + 4 * attention + 24 * mlp;
  EXPECT_EQ(total, int64_t{8084075520});  // the figure published with the config
  EXPECT_EQ(in.parameters, total);
  EXPECT_EQ(in.n_blocks, 52);
  EXPECT_EQ(in.kind('M').blocks, 24);
  EXPECT_EQ(in.kind('*').blocks, 4);
  EXPECT_EQ(in.kind('-').blocks, 24);
  EXPECT_EQ(in.kind('M').per_block, mamba);
  EXPECT_EQ(in.kind('*').per_block, attention);
  EXPECT_EQ(in.kind('-').per_block, mlp);
  EXPECT_EQ(in.embeddings, V * d);
  EXPECT_EQ(in.lm_head, V * d);
  EXPECT_EQ(in.norm_f, d);
  // FLOPs: 6·(N − V·d) + per attention block 12·Hq·hd·T + per Mamba block 12·d_inner·N.
  const double T = 8192;
  const double fpt = 6.0 * double(total - V * d) + 4 * 12.0 * double(Hq * hd) * T +
                     24 * 12.0 * double(di) * double(N);
  EXPECT_DOUBLE_EQ(in.flops_per_token, fpt);
  EXPECT_DOUBLE_EQ(in.flops_per_step, fpt * 768 * 8192);
  // Memory parts that need no mixer knowledge.
  const int64_t BT = int64_t(768) * 8192;
  EXPECT_EQ(in.memory.params, 4 * total);
  EXPECT_EQ(in.memory.grads, 4 * total);
  EXPECT_EQ(in.memory.adamw, 8 * total);
  EXPECT_EQ(in.memory.logits, 4 * BT * V);
  // Every FP4 linear keeps a weight copy [out·in] FP32: the block parameters' linear part.
  const int64_t linear_weights = 24 * (d * (2 * di + 2 * G * N + H) + di * d) +
                                 4 * (d * Hq * hd + 2 * d * Hkv * hd + Hq * hd * d) +
                                 24 * (2 * d * F);
  EXPECT_EQ(in.memory.linear_scratch, 4 * linear_weights);
}

TEST(ModelInfo, Nemotron8BLinears) {
  const ModelInfo in = model_info(config("nemotron-h-8b.toml"), recipe("ue5m3-b16"));
  ASSERT_EQ(in.linears.size(), 113u);  // 24·2 + 4·4 + 24·2 = 112, + lm_head
  EXPECT_EQ(in.eligible_linears(), 112);
  EXPECT_EQ(in.mode_counts[int(LinearMode::FP4)], 112);  // ue5m3-b16: all FP4
  EXPECT_EQ(names_of_mode(in, LinearMode::FP4).size(), 112u);
  EXPECT_EQ(in.linears[0].name, "layers.0.mixer.in_proj");
  EXPECT_EQ(in.linears[0].out, 2 * 8192 + 2 * 8 * 128 + 128);
  EXPECT_EQ(in.linears[0].in, 4096);
  EXPECT_EQ(in.linears[1].name, "layers.0.mixer.out_proj");
  EXPECT_EQ(in.linears[1].out, 4096);
  EXPECT_EQ(in.linears[1].in, 8192);
  EXPECT_EQ(in.linears[2].name, "layers.1.mixer.up_proj");
  EXPECT_EQ(in.linears[2].out, 21504);
  // Block 7 is the first attention block ("M-M-M-M*").
  EXPECT_EQ(in.linears[14].name, "layers.7.mixer.q_proj");
  EXPECT_EQ(in.linears[15].name, "layers.7.mixer.k_proj");
  EXPECT_EQ(in.linears[15].out, 4 * 128);
  EXPECT_EQ(in.linears[17].name, "layers.7.mixer.o_proj");
  EXPECT_EQ(in.linears[17].in, 32 * 128);
  const LinearInfo& head = in.linears.back();
  EXPECT_EQ(head.name, "lm_head");
  EXPECT_EQ(head.mode, LinearMode::FP32);
  EXPECT_EQ(head.out, 131072);
  EXPECT_EQ(head.in, 4096);
  for (const LinearInfo& l : in.linears) EXPECT_TRUE(l.overrides.empty()) << l.name;
}

// nvfp4-te keeps round(0.15·52) = 8 final blocks (44..51) in BF16: four Mamba-2 blocks (even)
// and four MLP blocks (odd).
TEST(ModelInfo, Nemotron8BNvfp4TeFinalBlocksBf16) {
  const ModelInfo in = model_info(config("nemotron-h-8b.toml"), recipe("nvfp4-te"));
  EXPECT_EQ(in.mode_counts[int(LinearMode::FP4)], 96);
  EXPECT_EQ(in.mode_counts[int(LinearMode::BF16)], 16);
  EXPECT_EQ(in.mode_counts[int(LinearMode::FP32)], 0);
  std::set<std::string> want;
  for (int b : {44, 46, 48, 50}) want.insert(L(b, "in_proj")), want.insert(L(b, "out_proj"));
  for (int b : {45, 47, 49, 51}) want.insert(L(b, "up_proj")), want.insert(L(b, "down_proj"));
  EXPECT_EQ(names_of_mode(in, LinearMode::BF16), want);
  EXPECT_EQ(in.linears.back().mode, LinearMode::FP32);
}

// ue5m3-b16-t2048's override (wgrad dY, T = 2048) selects the final four down_proj.
TEST(ModelInfo, Nemotron8BT2048OverrideSelectsFinalFourDownProj) {
  const ModelInfo in = model_info(config("nemotron-h-8b.toml"), recipe("ue5m3-b16-t2048"));
  EXPECT_EQ(in.mode_counts[int(LinearMode::FP4)], 112);
  ASSERT_EQ(in.override_hits.size(), 1u);
  std::set<std::string> got, marked;
  for (int i : in.override_hits[0]) got.insert(in.linears[size_t(i)].name);
  for (const LinearInfo& l : in.linears)
    if (!l.overrides.empty()) marked.insert(l.name);
  const std::set<std::string> want = {L(45, "down_proj"), L(47, "down_proj"), L(49, "down_proj"),
                                      L(51, "down_proj")};
  EXPECT_EQ(got, want);
  EXPECT_EQ(marked, want);
  EXPECT_NE(in.override_descriptions[0].find("2048"), std::string::npos)
      << in.override_descriptions[0];
}

// ue5m3-b16-t2048-last1 (the study's H7) fits the 2-block study model and selects its last
// down_proj only, where ue5m3-b16-t2048's final four are refused.
TEST(ModelInfo, StudyLast1OverrideSelectsTheFinalDownProj) {
  const ModelInfo in = model_info(config("study.toml"), recipe("ue5m3-b16-t2048-last1"));
  ASSERT_EQ(in.override_hits.size(), 1u);
  ASSERT_EQ(in.override_hits[0].size(), 1u);
  EXPECT_EQ(in.linears[size_t(in.override_hits[0][0])].name, "layers.3.mixer.down_proj");
  EXPECT_THROW(model_info(config("study.toml"), recipe("ue5m3-b16-t2048")), UserError);
}

TEST(ModelInfo, BadPatternCharacterThrows) {
  RunConfig c = config("nemotron-h-tiny.toml");
  c.model.pattern = "M-X";
  EXPECT_THROW(model_info(c, recipe("ue5m3-b16")), UserError);
}

// The figures of a built model (nn::Model::memory_use, num_params, flops_per_token) at the
// config's batch × seq_len, exactly.
TEST(ModelInfo, TinyHybridMatchesBuiltModel) {
  const RunConfig c = config("nemotron-h-tiny.toml");
  for (const char* r : {"ue5m3-b16", "nvfp4-te", "bf16", "fp32"}) {
    SCOPED_TRACE(r);
    const Recipe rc = recipe(r);
    const ModelInfo in = model_info(c, rc);
    const nn::Model model(c.model, rc, c.train.batch_size, c.train.seq_len);
    const nn::Model::MemoryUse mu = model.memory_use();
    EXPECT_EQ(in.parameters, model.num_params());
    EXPECT_EQ(in.memory.params, mu.params);
    EXPECT_EQ(in.memory.grads, mu.grads);
    EXPECT_EQ(in.memory.activations, mu.activations);
    EXPECT_EQ(in.memory.logits, mu.logits);
    EXPECT_EQ(in.memory.backward_scratch, mu.backward_scratch);
    EXPECT_EQ(in.memory.linear_workspace, mu.linear_workspace);  // reserved at construction
    EXPECT_EQ(in.memory.adamw, 2 * mu.params);
    EXPECT_DOUBLE_EQ(in.flops_per_token, model.flops_per_token(c.train.seq_len));
    ASSERT_EQ(in.linears.size(), model.linears().size() + 1);
    for (size_t i = 0; i < model.linears().size(); ++i)
      EXPECT_EQ(in.linears[i].name, model.linear_name(i));
  }
}

// The per-linear copies estimate equals what a built model holds after a training step.
TEST(ModelInfo, TinyLinearScratchEstimateAfterOneStep) {
  RunConfig c = config("nemotron-h-tiny.toml");
  c.train.batch_size = 2;
  c.train.seq_len = 32;
  const std::vector<std::vector<std::string>> cases = {
      {"ue5m3-b16"}, {"bf16"}, {"nvfp4-te"}, {"ue5m3-b16", "fp4.bf16_boundary=true"},
      {"ue5m3-b16", "linear.gemm=decoded"}, {"nvfp4-te", "linear.gemm=decoded"}};  // (auto: decoded-bf16)
  for (const auto& cs : cases) {
    const std::vector<std::string> sets(cs.begin() + 1, cs.end());
    const Recipe rc = recipe(cs[0], sets);
    SCOPED_TRACE(rc.name);
    const ModelInfo in = model_info(c, rc);
    nn::Model model(c.model, rc, c.train.batch_size, c.train.seq_len);
    model.init(1);
    const int BT = c.train.batch_size * c.train.seq_len;
    std::vector<int32_t> tok(BT), tgt(BT);
    std::mt19937 g(7);
    for (int i = 0; i < BT; ++i) tok[i] = int(g() % 4096), tgt[i] = int(g() % 4096);
    nn::StepContext ctx;
    model.zero_grad();
    model.forward(tok.data(), tgt.data(), c.train.batch_size, ctx);
    model.backward(ctx);
    const nn::Model::MemoryUse mu = model.memory_use();
    EXPECT_EQ(in.memory.linear_scratch, mu.linear_scratch);
    EXPECT_EQ(in.memory.linear_workspace, mu.linear_workspace);
  }
}
