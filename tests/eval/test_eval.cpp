// Quantized inference evaluation (include/fp4/eval/eval.h, docs/evaluation.md "Quantized
// inference evaluation"): each activation-reference policy against an independent computation
// in one Linear, the policies through the whole model, bits per byte, training untouched by
// evaluation, thread-count independence, sampling.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "fp4/numerics/q8_0.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/data/data.h"
#include "fp4/base/error.h"
#include "fp4/eval/eval.h"
#include "fp4/gemm/gemm.h"
#include "fp4/nn/linear.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"
#include "fp4/train/train.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
float amax(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}
Recipe recipe(const std::string& name) {
  return load_recipe(name, fs::path(FP4_SOURCE_DIR) / "configs/recipes");
}
// The fprop of docs/numerics.md computed without the Linear, from the scalar reference
// quantizers, for the recipe's GEMM mode (docs/gemm.md): decoded, Y [M,N] = qdq(X, g_x) ·
// qdq(W, g_w)ᵀ on the FP32 GEMM; decoded-bf16, the q·c_b operands on gemm_block_scaled with
// the two tensor decode scales.
std::vector<float> independent_fprop(const std::vector<float>& X, const std::vector<float>& W,
                                     int64_t M, int64_t K, int64_t N, const Recipe& r, float gx,
                                     float gw) {
  std::vector<float> xq(M * K), wq(N * K), Y(M * N);
  if (r.gemm == GemmMode::DecodedBf16) {
    quantize_block_scaled(X.data(), M, K, r.spec_x(), gx, nullptr, xq.data());
    quantize_block_scaled(W.data(), N, K, r.spec_w(), gw, nullptr, wq.data());
    BlockScaledGemmScratch scratch;
    gemm_block_scaled(false, true, M, N, K, xq.data(), tensor_decode_scale(r.spec_x(), gx),
                      wq.data(), tensor_decode_scale(r.spec_w(), gw), false, Y.data(), scratch);
    return Y;
  }
  EXPECT_EQ(r.gemm, GemmMode::Decoded);
  quantize_dequantize(X.data(), M, K, r.spec_x(), gx, nullptr, xq.data());
  quantize_dequantize(W.data(), N, K, r.spec_w(), gw, nullptr, wq.data());
  sgemm(false, true, M, N, K, 1.f, xq.data(), K, wq.data(), K, 0.f, Y.data(), N);
  return Y;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
nn::StepContext infer(nn::InferenceRef r, int64_t batch = 1) {
  nn::StepContext c;
  c.training = false;
  c.infer_ref = r;
  c.infer_batch = batch;
  return c;
}
bool training_caches_empty(const nn::Linear& lin) {
  for (int r = 0; r < 5; ++r)
    if (lin.reference(nn::Role(r)).has_value()) return false;
  return true;
}

constexpr int64_t M = 32, K = 48, N = 24;

// ------------------------------------------------------------------ one Linear

TEST(InferenceLinear, CurrentEqualsQuantizeWithTensorAmaxThenGemm) {
  for (GemmMode mode : {GemmMode::DecodedBf16, GemmMode::Decoded}) {  // ue5m3-b16's, the reference
    Recipe r = recipe("ue5m3-b16");
    r.gemm = mode;
    const std::string at = gemm_mode_name(mode);
    auto X = randn(M * K, 1, 3.f), W = randn(N * K, 2, 0.05f);
    std::vector<float> dW(N * K), Y(M * N);
    nn::Linear lin(0, K, N, LinearPlan::uniform(r, LinearMode::FP4));
    lin.bind(W.data(), dW.data());
    lin.forward(X.data(), Y.data(), M, infer(nn::InferenceRef::Current));
    EXPECT_EQ(lin.refs().g_x, amax(X)) << at;
    EXPECT_EQ(lin.refs().g_w, amax(W)) << at;
    EXPECT_TRUE(same_bits(Y, independent_fprop(X, W, M, K, N, r, amax(X), amax(W)))) << at;
    // A second batch: current amax again (not the first batch's).
    for (auto& x : X) x *= 4.f;
    lin.forward(X.data(), Y.data(), M, infer(nn::InferenceRef::Current, 2));
    EXPECT_EQ(lin.refs().g_x, amax(X)) << at;
    EXPECT_TRUE(same_bits(Y, independent_fprop(X, W, M, K, N, r, amax(X), amax(W)))) << at;
    EXPECT_TRUE(training_caches_empty(lin)) << at;
  }
}

// llama-q8_0 (docs/export.md "FP4 weights in GGUF"): an FP4 linear's X as llama.cpp's Q8_0
// (K = 64: two blocks of 32), W as the fprop quantizes it; BF16 (paper's interface, probe GEMM,
// BF16 boundary) all skipped; a BF16 linear in plain FP32.
TEST(InferenceLinear, LlamaQ8TakesQ80ActivationsAndTheTrainedWeights) {
  constexpr int64_t Kq = 64;
  const auto X = randn(M * Kq, 11, 3.f), W = randn(N * Kq, 12, 0.05f);
  std::vector<float> dW(N * Kq), Y(M * N), xq(M * Kq), wq(N * Kq), want(M * N);
  for (const char* name : {"ue5m3-b16", "mxfp4", "ue5m3-b16-paper"}) {
    const Recipe r = recipe(name);
    nn::Linear lin(0, Kq, N, LinearPlan::uniform(r, LinearMode::FP4));
    lin.bind(const_cast<float*>(W.data()), dW.data());
    lin.forward(X.data(), Y.data(), M, infer(nn::InferenceRef::LlamaQ8));
    q8_0_quantize_dequantize(X.data(), M, Kq, xq.data());
    quantize_dequantize(W.data(), N, Kq, r.spec_w(), amax(W), nullptr, wq.data());
    sgemm(false, true, M, N, Kq, 1.f, xq.data(), Kq, wq.data(), Kq, 0.f, want.data(), N);
    EXPECT_TRUE(same_bits(Y, want)) << name;
    EXPECT_TRUE(training_caches_empty(lin)) << name;
  }
  const Recipe r = recipe("nvfp4-te");
  nn::Linear bf16(0, Kq, N, LinearPlan::uniform(r, LinearMode::BF16));
  bf16.bind(const_cast<float*>(W.data()), dW.data());
  bf16.forward(X.data(), Y.data(), M, infer(nn::InferenceRef::LlamaQ8));
  sgemm(false, true, M, N, Kq, 1.f, X.data(), Kq, W.data(), Kq, 0.f, want.data(), N);
  EXPECT_TRUE(same_bits(Y, want)) << "a BF16 linear runs FP32 under llama-q8_0";
  EXPECT_EQ(parse_eval_policy("llama-q8_0").name(), "llama-q8_0");
}

TEST(InferenceLinear, ReplayHoldsBatchOneAndRefreshesAtBatch51WeightsFrozen) {
  const Recipe r = recipe("ue5m3-b16");
  const auto X0 = randn(M * K, 3), W0 = randn(N * K, 4, 0.05f);
  auto W = W0;
  std::vector<float> dW(N * K), Y(M * N);
  nn::Linear lin(0, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  lin.reset_inference(50);
  float g1 = 0;
  for (int b = 1; b <= 52; ++b) {
    std::vector<float> X = X0;
    for (auto& x : X) x *= 1.f + 0.05f * b;  // grows every batch
    lin.forward(X.data(), Y.data(), M, infer(nn::InferenceRef::Replay, b));
    if (b == 1) {
      g1 = amax(X);
      EXPECT_EQ(lin.refs().g_x, g1);
      for (auto& w : W) w *= 3.f;  // weights changed after batch 1: their amax stays frozen
    }
    if (b == 2) {
      EXPECT_EQ(lin.refs().g_x, g1) << "batch 2 must hold the batch-1 reference";
      EXPECT_LT(lin.refs().g_x, amax(X));
      EXPECT_TRUE(same_bits(Y, independent_fprop(X, W, M, K, N, r, g1, amax(W0))));
    }
    if (b == 50) { EXPECT_EQ(lin.refs().g_x, g1); }
    if (b == 51) {
      EXPECT_EQ(lin.refs().g_x, amax(X)) << "refresh at batch 51";
      EXPECT_TRUE(same_bits(Y, independent_fprop(X, W, M, K, N, r, amax(X), amax(W0))));
    }
    if (b == 52) { EXPECT_LT(lin.refs().g_x, amax(X)); }
    EXPECT_EQ(lin.refs().g_w, amax(W0));
  }
  EXPECT_EQ(lin.inference_state().x.last_refresh(), 51);
  EXPECT_TRUE(training_caches_empty(lin));
  // Cold: after a reset the next evaluation starts empty and measures again.
  lin.reset_inference(50);
  lin.forward(X0.data(), Y.data(), M, infer(nn::InferenceRef::Replay, 1));
  EXPECT_EQ(lin.refs().g_x, amax(X0));
  EXPECT_EQ(lin.refs().g_w, amax(W));
}

TEST(InferenceLinear, CalibratedUsesTheCalibrationMaxAndIgnoresTheEvaluatedAmax) {
  const Recipe r = recipe("ue5m3-b16");
  const auto Xa = randn(M * K, 5, 1.f), Xb = randn(M * K, 6, 2.f), Xe = randn(M * K, 7, 0.3f);
  auto W = randn(N * K, 8, 0.05f);
  std::vector<float> dW(N * K), Y(M * N);
  nn::Linear lin(0, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  EXPECT_THROW(lin.forward(Xe.data(), Y.data(), M, infer(nn::InferenceRef::Frozen)),
               std::logic_error);
  lin.reset_inference();
  lin.forward(Xa.data(), Y.data(), M, infer(nn::InferenceRef::Calibrate));
  EXPECT_EQ(lin.refs().g_x, amax(Xa));  // calibration batches run with current scaling
  lin.forward(Xb.data(), Y.data(), M, infer(nn::InferenceRef::Calibrate));
  const float gc = std::max(amax(Xa), amax(Xb));
  ASSERT_EQ(lin.inference_state().calibrated_x, gc);
  lin.forward(Xe.data(), Y.data(), M, infer(nn::InferenceRef::Frozen));
  EXPECT_EQ(lin.refs().g_x, gc);
  EXPECT_NE(gc, amax(Xe));
  EXPECT_TRUE(same_bits(Y, independent_fprop(Xe, W, M, K, N, r, gc, amax(W))));
  EXPECT_FALSE(same_bits(Y, independent_fprop(Xe, W, M, K, N, r, amax(Xe), amax(W))));
  EXPECT_TRUE(training_caches_empty(lin));
}

TEST(InferenceLinear, TrainingForwardForgetsInferenceState) {
  const Recipe r = recipe("ue5m3-b16");
  const auto X = randn(M * K, 9);
  auto W = randn(N * K, 10, 0.05f);
  std::vector<float> dW(N * K), Y(M * N);
  nn::Linear lin(0, K, N, LinearPlan::uniform(r, LinearMode::FP4));
  lin.bind(W.data(), dW.data());
  lin.forward(X.data(), Y.data(), M, infer(nn::InferenceRef::Calibrate));
  EXPECT_TRUE(lin.inference_state().has_w);
  nn::StepContext train;
  lin.forward(X.data(), Y.data(), M, train);
  EXPECT_FALSE(lin.inference_state().has_w);
  EXPECT_FALSE(lin.inference_state().has_calibrated);
}

// ------------------------------------------------------------------ policies by name

TEST(EvalPolicy, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_eval_policy("replay-d50").interval, 50);
  EXPECT_EQ(parse_eval_policy("replay-d7").name(), "replay-d7");
  EXPECT_EQ(parse_eval_policy("calibrated").kind, EvalPolicy::Kind::Calibrated);
  const auto all = default_eval_policies();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].name() + all[1].name() + all[2].name() + all[3].name(),
            "nonecurrentreplay-d50calibrated");
  EXPECT_EQ(parse_eval_policies("current,none,current").size(), 2u);
  for (const char* bad : {"", "curent", "replay-d0", "replay-d", "replay-dx", "replay-d5x", "none,"}) {
    try {
      parse_eval_policies(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UserError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("replay-d") != std::string::npos) << m;
    }
  }
}

// ------------------------------------------------------------------ bits per byte

TEST(BitsPerByte, PieceLengths) {
  EXPECT_EQ(piece_utf8_bytes("\xE2\x96\x81the", false, false), 4);      // "▁the" = " the"
  EXPECT_EQ(piece_utf8_bytes("\xE2\x96\x81\xE2\x96\x81", false, false), 2);
  EXPECT_EQ(piece_utf8_bytes("caf\xC3\xA9", false, false), 5);          // "café"
  EXPECT_EQ(piece_utf8_bytes("<0xE2>", true, false), 1);                // byte fallback
  EXPECT_EQ(piece_utf8_bytes("</s>", false, true), 0);                  // EOS
}

ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 37;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 2;
  m.mlp_hidden = 48;
  m.init_std = 0.2f;
  return m;
}
TokenStream token_stream(size_t n, int V, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint32_t> t(n);
  for (auto& x : t) x = g() % static_cast<uint32_t>(V);
  return TokenStream::from_ids(t, 2);
}

constexpr int kT = 16, kB = 2;

TEST(BitsPerByte, HandComputedOnAKnownByteTable) {
  const ModelConfig mc = tiny_model();
  nn::Model model(mc, recipe("ue5m3-b16"), kB, kT);
  model.init(1);
  const auto stream = token_stream(200, mc.vocab_size, 2);
  const EvalWindows w{&stream, heldout_windows(int64_t(stream.size()), kT, 3)};  // 3 windows
  std::vector<int> len(mc.vocab_size);
  for (int i = 0; i < mc.vocab_size; ++i) len[i] = i % 4;  // 0..3 bytes
  int64_t bytes = 0;
  for (int64_t s : w.starts)
    for (int t = 1; t <= kT; ++t) bytes += stream[s + t] % 4;
  const NllResult r = evaluate_nll(model, w, kT, kB, parse_eval_policy("current"), nullptr, &len);
  EXPECT_EQ(r.tokens, 3 * kT);
  EXPECT_EQ(r.bytes, bytes);
  EXPECT_EQ(r.batches, 2);  // 2 + 1 windows
  EXPECT_DOUBLE_EQ(r.total_nats, r.nats_per_token * 3 * kT);
  EXPECT_DOUBLE_EQ(r.bits_per_byte, r.total_nats / std::log(2.0) / double(bytes));
  EXPECT_NEAR(r.nats_per_token, std::log(37.0), 1.0);
  // Without a byte table: NaN bits per byte.
  EXPECT_TRUE(std::isnan(evaluate_nll(model, w, kT, kB, parse_eval_policy("none")).bits_per_byte));
}

TEST(BitsPerByte, TokenLengthsOfARealTokenizerSumToTheDocumentBytes) {
  const fs::path root = fs::temp_directory_path() / ("fp4_test_eval_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "text");
  std::mt19937 g(3);
  const char* words[] = {"the", "of", "and", "model", "scale", "block", "café", "naïve",
                         "日本", "—", "tensor", "4-bit", "\n", "quantized", "E2M1"};
  for (int d = 0; d < 20; ++d) {
    std::string doc;
    for (int i = 0; i < 400; ++i) {
      std::string word = words[g() % 15];
      if (g() % 2)  // and pseudo-words, so BPE finds enough merges
        for (int n = 2 + g() % 5; n > 0; --n) word = char('a' + g() % 26) + word;
      doc += std::string(i ? " " : "") + word;
    }
    if (d == 9) doc += " 🎉 ✓";  // held out, never in training: byte fallback
    std::ofstream(root / "text" / ("d" + std::to_string(10 + d) + ".txt")) << doc;
  }
  const TokenData td = prepare_tokens(root / "text", 300, root / "cache");
  const auto len = token_byte_lengths(td.tokenizer_model);
  ASSERT_EQ(len.size(), 300u);
  EXPECT_EQ(len[kTokenEos], 0);
  const CorpusSplit split = split_corpus(root / "text");
  // Held-out stream: doc </s> doc </s>; each document's tokens sum to its bytes + 1 (the
  // dummy-prefix space).
  size_t i = 0;
  for (const auto& doc : split.heldout_docs) {
    int64_t sum = 0;
    while (td.heldout[i] != kTokenEos) sum += len[td.heldout[i++]];
    ++i;
    EXPECT_EQ(sum, int64_t(doc.size()) + 1);
  }
  EXPECT_EQ(i, td.heldout.size());
  fs::remove_all(root);
}

// ------------------------------------------------------------------ whole model

TEST(EvalModel, NoneIsTheFp32NllAndReplayD1IsCurrent) {
  const ModelConfig mc = tiny_model();
  nn::Model q(mc, recipe("ue5m3-b16"), kB, kT), f(mc, recipe("fp32"), kB, kT);
  q.init(4);
  f.params() = q.params();
  const auto stream = token_stream(300, mc.vocab_size, 5);
  const EvalWindows w{&stream, heldout_windows(int64_t(stream.size()), kT, 6)};
  const NllResult none = evaluate_nll(q, w, kT, kB, parse_eval_policy("none"));
  EXPECT_EQ(none.nats_per_token, evaluate_nll(f, w, kT, kB, parse_eval_policy("current")).nats_per_token);
  EXPECT_EQ(none.nats_per_token, heldout_nll(f, stream, w.starts, kT, kB, false));
  const NllResult cur = evaluate_nll(q, w, kT, kB, parse_eval_policy("current"));
  EXPECT_NE(cur.nats_per_token, none.nats_per_token);
  EXPECT_EQ(cur.nats_per_token, heldout_nll(q, stream, w.starts, kT, kB, true));
  EXPECT_EQ(evaluate_nll(q, w, kT, kB, parse_eval_policy("replay-d1")).nats_per_token,
            cur.nats_per_token);
  // D larger than the batch count: every batch uses batch 1's references.
  const NllResult held = evaluate_nll(q, w, kT, kB, parse_eval_policy("replay-d50"));
  EXPECT_EQ(held.batches, 3);
  EXPECT_NE(held.nats_per_token, cur.nats_per_token);
  // Calibrated needs calibration windows.
  EXPECT_THROW(evaluate_nll(q, w, kT, kB, parse_eval_policy("calibrated")), UserError);
  const auto train = token_stream(300, mc.vocab_size, 6);
  const EvalWindows calib = calibration_windows(train, kT, kB, 2);
  EXPECT_EQ(calib.starts.size(), 4u);
  const NllResult cal = evaluate_nll(q, w, kT, kB, parse_eval_policy("calibrated"), &calib);
  EXPECT_EQ(cal.calib_tokens, 4 * kT);
  EXPECT_TRUE(std::isfinite(cal.nats_per_token));
  EXPECT_NE(cal.nats_per_token, cur.nats_per_token);
  // Calibrating on the evaluated windows themselves, one batch: equals replay over one batch.
  const EvalWindows one{&stream, {0, kT}};
  EXPECT_EQ(evaluate_nll(q, one, kT, kB, parse_eval_policy("calibrated"), &one).nats_per_token,
            evaluate_nll(q, one, kT, kB, parse_eval_policy("current")).nats_per_token);
}

// Per-window NLL (the values the report's paired bootstrap resamples): one per window, in
// order; each equals that window evaluated alone (an independent forward of batch 1; the
// GEMM blocking may differ with the batch, hence the FP32-rounding tolerance), and their
// mean is the reported NLL up to the order of the FP64 sums.
TEST(EvalModel, WindowNllIsEachWindowsOwnMeanAndAveragesToTheNll) {
  const ModelConfig mc = tiny_model();
  nn::Model f(mc, recipe("fp32"), kB, kT);
  f.init(4);
  const auto stream = token_stream(300, mc.vocab_size, 5);
  const EvalWindows w{&stream, heldout_windows(int64_t(stream.size()), kT, 6)};
  ASSERT_GT(w.starts.size(), size_t(kB));  // several batches, the last one partial or full
  const NllResult r = evaluate_nll(f, w, kT, kB, parse_eval_policy("none"));
  ASSERT_EQ(r.window_nll.size(), w.starts.size());
  double sum = 0;
  for (size_t i = 0; i < w.starts.size(); ++i) {
    const EvalWindows alone{&stream, {w.starts[i]}};
    const double own = evaluate_nll(f, alone, kT, kB, parse_eval_policy("none")).nats_per_token;
    EXPECT_NEAR(r.window_nll[i], own, 1e-5 * own) << "window " << i;
    sum += r.window_nll[i];
  }
  EXPECT_NEAR(sum / double(w.starts.size()), r.nats_per_token, 1e-12 * r.nats_per_token);
  // Windows differ (different text), so the values are not one number repeated.
  EXPECT_NE(r.window_nll.front(), r.window_nll.back());
}

// evaluate_batches_nll (the fidelity panel's per-batch inference loss) against evaluate_nll on
// the same windows in full batches: the batches' mean, weighted as evaluate_nll weighs them, is
// its NLL bit for bit under every policy (the same forwards in the same order after the same
// calibration), and a policy's per-batch losses differ from another's.
TEST(EvalModel, BatchesNllMatchesEvaluateNllUnderEveryPolicy) {
  const ModelConfig mc = tiny_model();
  nn::Model q(mc, recipe("ue5m3-b16"), kB, kT);
  q.init(4);
  const auto stream = token_stream(400, mc.vocab_size, 5);
  EvalWindows w{&stream, heldout_windows(int64_t(stream.size()), kT, 6)};
  w.starts.resize(w.starts.size() / kB * kB);  // full batches only
  ASSERT_GE(w.starts.size(), size_t(2 * kB));
  std::vector<std::vector<int32_t>> in, tg;
  for (size_t w0 = 0; w0 < w.starts.size(); w0 += kB) {
    in.emplace_back(size_t(kB) * kT);
    tg.emplace_back(size_t(kB) * kT);
    for (int b = 0; b < kB; ++b)
      for (int t = 0; t < kT; ++t) {
        in.back()[size_t(b) * kT + t] = int32_t(stream[w.starts[w0 + b] + t]);
        tg.back()[size_t(b) * kT + t] = int32_t(stream[w.starts[w0 + b] + t + 1]);
      }
  }
  std::vector<std::pair<const int32_t*, const int32_t*>> batches;
  for (size_t i = 0; i < in.size(); ++i) batches.push_back({in[i].data(), tg[i].data()});
  const auto train = token_stream(300, mc.vocab_size, 6);
  const EvalWindows calib = calibration_windows(train, kT, kB, 2);
  std::vector<double> current;
  for (const char* name : {"none", "current", "replay-d50", "calibrated"}) {
    const EvalPolicy p = parse_eval_policy(name);
    const std::vector<double> per = evaluate_batches_nll(q, batches, kT, kB, p, &calib);
    ASSERT_EQ(per.size(), batches.size());
    double sum = 0;
    for (double v : per) sum += v * kB;
    EXPECT_EQ(sum / double(w.starts.size()), evaluate_nll(q, w, kT, kB, p, &calib).nats_per_token) << name;
    if (std::string(name) == "current") current = per;
    if (std::string(name) == "replay-d50") {
      EXPECT_NE(per.back(), current.back()) << "held from batch 1";
      EXPECT_EQ(per.front(), current.front()) << "batch 1 samples itself";
    }
  }
  EXPECT_THROW(evaluate_batches_nll(q, batches, kT, kB, parse_eval_policy("calibrated")), UserError);
}

// One AdamW training step at 1-based `step`; returns the loss.
double train_step(nn::Model& m, AdamW& opt, const TrainConfig& tc, int step, uint32_t seed) {
  const auto in = token_stream(kB * kT, m.config().vocab_size, seed).ids(),
             tg = token_stream(kB * kT, m.config().vocab_size, seed + 100).ids();
  std::vector<int32_t> i32(in.begin(), in.end()), t32(tg.begin(), tg.end());
  nn::StepContext ctx;
  ctx.step = step;
  ctx.seed = 3;
  m.zero_grad();
  const double loss = m.forward(i32.data(), t32.data(), kB, ctx);
  m.backward(ctx);
  clip_grad_norm(m.grads().data(), m.num_params(), tc.grad_clip);
  opt.step(m.params().data(), m.grads().data(), m.param_infos(), 1e-2, step);
  return loss;
}

TEST(EvalModel, EvaluatingDoesNotChangeSubsequentTrainingBits) {
  const ModelConfig mc = tiny_model();
  TrainConfig tc;
  const auto stream = token_stream(300, mc.vocab_size, 7);
  const EvalWindows w{&stream, heldout_windows(int64_t(stream.size()), kT, 4)};
  const EvalWindows calib{&stream, {100, 150}};
  std::vector<float> params[2];
  std::vector<double> losses[2];
  for (int variant = 0; variant < 2; ++variant) {
    nn::Model m(mc, recipe("ue5m3-b16"), kB, kT);  // D = 50: held training caches matter
    m.init(11);
    AdamW opt(m.num_params(), tc);
    for (int step = 1; step <= 4; ++step) {
      losses[variant].push_back(train_step(m, opt, tc, step, 20 + step));
      if (variant == 1 && step == 2)
        for (const auto& p : default_eval_policies()) evaluate_nll(m, w, kT, kB, p, &calib);
    }
    params[variant] = m.params();
    for (const auto& lin : m.linears()) EXPECT_EQ(lin.reference(nn::Role::X).last_refresh(), 1);
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_TRUE(same_bits(params[0], params[1]));
}

TEST(EvalModel, BitIdenticalForOneAndTwoThreads) {
  const ModelConfig mc = tiny_model();
  const auto stream = token_stream(300, mc.vocab_size, 8);
  const EvalWindows w{&stream, heldout_windows(int64_t(stream.size()), kT, 5)};
  const EvalWindows calib{&stream, {7, 40, 90}};
  const int saved = omp_get_max_threads();
  for (const char* rn : {"ue5m3-b16", "nvfp4-te"}) {
    std::vector<double> nll[2];
    std::vector<int> text[2];
    for (int t = 0; t < 2; ++t) {
      omp_set_num_threads(t + 1);
      nn::Model m(mc, recipe(rn), kB, kT);
      m.init(12);
      for (const auto& p : default_eval_policies())
        nll[t].push_back(evaluate_nll(m, w, kT, kB, p, &calib).nats_per_token);
      SampleOptions so;
      so.max_new_tokens = 20;
      so.stop_at_eos = false;
      so.policy = parse_eval_policy("replay-d3");
      text[t] = sample_tokens(m, {2, 5, 9}, so, kT, kB);
    }
    EXPECT_EQ(nll[0], nll[1]) << rn;
    EXPECT_EQ(text[0], text[1]) << rn;
  }
  omp_set_num_threads(saved);
}

// ------------------------------------------------------------------ sampling

TEST(Sample, SeededGreedyAndSlidingWindow) {
  const ModelConfig mc = tiny_model();
  nn::Model m(mc, recipe("ue5m3-b16"), 1, kT);
  m.init(13);
  SampleOptions so;
  so.max_new_tokens = 2 * kT;  // prompt + generated tokens run past seq_len: the window slides
  so.stop_at_eos = false;
  so.temperature = 1.0;
  so.top_k = 0;
  so.seed = 5;
  const std::vector<int> prompt = {2, 7, 8, 9};
  const auto a = sample_tokens(m, prompt, so, kT, 1), b = sample_tokens(m, prompt, so, kT, 1);
  EXPECT_EQ(a.size(), size_t(2 * kT));
  EXPECT_EQ(a, b);
  so.seed = 6;
  EXPECT_NE(sample_tokens(m, prompt, so, kT, 1), a);
  // Greedy: the first token is the argmax of the last prompt position's logits.
  so.temperature = 0;
  so.max_new_tokens = 1;
  so.policy = parse_eval_policy("none");
  const auto gtok = sample_tokens(m, prompt, so, kT, 1);
  std::vector<int32_t> p32(prompt.begin(), prompt.end());
  nn::StepContext ctx;
  ctx.training = false;
  ctx.quantize = false;
  m.forward(p32.data(), nullptr, 1, ctx, int(prompt.size()));
  const float* last = m.logits() + (prompt.size() - 1) * mc.vocab_size;
  EXPECT_EQ(gtok[0], std::max_element(last, last + mc.vocab_size) - last);
  // A short forward equals the first rows of a full-length one (causal attention).
  std::vector<float> short_logits(m.logits(), m.logits() + prompt.size() * mc.vocab_size);
  std::vector<int32_t> full(kT, 3);
  std::copy(p32.begin(), p32.end(), full.begin());
  m.forward(full.data(), nullptr, 1, ctx);
  for (size_t i = 0; i < short_logits.size(); ++i)
    ASSERT_NEAR(short_logits[i], m.logits()[i], 1e-5f) << i;
  EXPECT_THROW(sample_tokens(m, {}, so, kT, 1), std::invalid_argument);
  EXPECT_THROW(sample_tokens(m, {99}, so, kT, 1), std::invalid_argument);
}

}  // namespace
