// A two-layer model (and a small hybrid one) and random tokens for tests that run whole training steps
// (train_step) without the corpus: tests/nn/test_alloc.cpp, test_shared_input.cpp,
// test_profile.cpp.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "fp4/config/settings.h"
#include "fp4/data/data.h"
#include "fp4/nn/run_config.h"
#include "fp4/recipe/recipe.h"

namespace fp4::testing {

/// A recipe shipped in configs/recipes (by name); "<name>@<gemm>" loads it with linear.gemm =
/// "<gemm>" (e.g. "ue5m3-b16@decoded": the reference GEMM instead of auto's decoded-bf16).
inline Recipe shipped_recipe(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(FP4_SOURCE_DIR) / "configs/recipes";
  const size_t at = name.find('@');
  if (at == std::string::npos) return load_recipe(name, dir);
  return load_recipe(name.substr(0, at), dir,
                     parse_settings({"linear.gemm=" + name.substr(at + 1)}).recipe);
}

/// vocab 64, d_model 32, 2 layers of 2 heads, MLP 64, 2 sequences of 16 tokens per step,
/// 10 steps (the LR schedule), numerics telemetry every `telemetry_interval` steps (0: off).
inline RunConfig two_layer_config(int telemetry_interval) {
  RunConfig cfg;
  cfg.model.vocab_size = 64;
  cfg.model.d_model = 32;
  cfg.model.n_layers = 2;
  cfg.model.n_heads = 2;
  cfg.model.mlp_hidden = 64;
  cfg.train.seq_len = 16;
  cfg.train.batch_size = 2;
  cfg.train.steps = 10;
  cfg.telemetry_interval = telemetry_interval;
  return cfg;
}

/// two_layer_config with the block pattern of a small Nemotron-H ("M*-M-": Mamba-2 blocks of
/// 4 heads of 8, 2 groups, state 16, chunk 6 over seq_len 16; GQA attention 2 query heads on
/// 1 KV head without RoPE; squared-ReLU MLP).
inline RunConfig hybrid_config(int telemetry_interval) {
  RunConfig cfg = two_layer_config(telemetry_interval);
  cfg.model.pattern = "M*-M-";
  cfg.model.n_kv_heads = 1;
  cfg.model.rope = false;
  cfg.model.mamba_num_heads = 4;
  cfg.model.mamba_head_dim = 8;
  cfg.model.mamba_n_groups = 2;
  cfg.model.mamba_state_size = 16;
  cfg.model.mamba_chunk_size = 6;
  return cfg;
}

/// n token ids uniform in [0, vocab) from mt19937(seed), in a stream of
/// token_bytes_for_vocab(vocab) bytes per id.
inline TokenStream random_tokens(size_t n, int vocab, uint32_t seed) {
  std::vector<uint32_t> t(n);
  std::mt19937 g(seed);
  for (auto& x : t) x = g() % static_cast<uint32_t>(vocab);
  return TokenStream::from_ids(t, token_bytes_for_vocab(vocab));
}

}  // namespace fp4::testing
