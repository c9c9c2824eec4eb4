// Profiling (fp4/base/profile.h): exclusive scope accounting, the FLOP count of a model (by hand),
// the GEMM-rate cache, and a profiled training step whose components add up to its time.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <set>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "fp4/nn/model.h"
#include "fp4/base/profile.h"
#include "fp4/gemm/machine.h"
#include "fp4/recipe/recipe.h"
#include "fp4/train/train.h"
#include "support/step_test_setup.h"

using namespace fp4;
namespace fs = std::filesystem;
using prof::Cat;

namespace {
Recipe builtin_recipe(const std::string& name) { return fp4::testing::shipped_recipe(name); }

void busy_ms(double ms) {  // burn wall time on this thread (a sleep would do too)
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(int64_t(ms * 1e3));
  while (std::chrono::steady_clock::now() < end) {
  }
}

struct ProfOn {
  ProfOn() { prof::enable(true), prof::reset(); }
  ~ProfOn() { prof::enable(false); }
};
}  // namespace

TEST(Profile, ScopesAreExclusiveAndAddUp) {
  ProfOn on;
  const auto t0 = std::chrono::steady_clock::now();
  {
    prof::Scope a(Cat::kNorm);
    busy_ms(20);
    {
      prof::Scope b(Cat::kGemmFprop);  // nested: kNorm stops accruing meanwhile
      busy_ms(30);
    }
    busy_ms(10);
  }
  busy_ms(5);  // outside every scope: "other"
  const prof::Totals t = prof::totals();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Lower bounds only: a preempted thread (a loaded machine) makes any region longer. That
  // the nested time is not also charged to the outer region is the sum check below (an
  // inclusive kNorm would push the sum ≥ 30 ms past the wall time).
  EXPECT_GE(t.seconds[int(Cat::kNorm)], 0.030);
  EXPECT_GE(t.seconds[int(Cat::kGemmFprop)], 0.030);
  EXPECT_GE(t.seconds[int(Cat::kOther)], 0.005);
  EXPECT_EQ(t.calls[int(Cat::kNorm)], 1);
  EXPECT_EQ(t.calls[int(Cat::kGemmFprop)], 1);
  double sum = 0;
  for (double s : t.seconds) sum += s;
  EXPECT_LE(sum, wall + 1e-6);       // nothing counted twice
  EXPECT_GE(sum, wall - 0.002);      // nothing lost (reset() happened just before t0)
}

// Scopes opened by a team's threads inside a parallel region record nothing and leave the
// driving thread's accounting intact (they used to push onto one shared stack from every
// thread at once).
TEST(Profile, ScopesInsideParallelRegionsAreIgnored) {
  ProfOn on;
  {
    prof::Scope outer(Cat::kAttention);
    for (int rep = 0; rep < 200; ++rep) {
#pragma omp parallel num_threads(2)
      {
        prof::Scope inner(Cat::kLoss);
        prof::Scope inner2(Cat::kNorm);
        EXPECT_EQ(prof::detail::current(), omp_in_parallel() ? Cat::kAttention : Cat::kNorm);
      }
    }
    EXPECT_EQ(prof::detail::current(), Cat::kAttention);
  }
  const prof::Totals t = prof::totals();
  EXPECT_EQ(t.calls[int(Cat::kAttention)], 1);
  if (omp_get_max_threads() > 1) {
    EXPECT_EQ(t.calls[int(Cat::kLoss)], 0);
    EXPECT_EQ(t.calls[int(Cat::kNorm)], 0);
  }
  EXPECT_EQ(prof::detail::current(), Cat::kOther);
}

TEST(Profile, DisabledRecordsNothing) {
  prof::enable(false);
  prof::reset();
  {
    prof::Scope a(Cat::kLoss);
    prof::add_flops(Cat::kLoss, 1e9);
    busy_ms(2);
  }
  const prof::Totals t = prof::totals();
  EXPECT_EQ(t.calls[int(Cat::kLoss)], 0);
  EXPECT_EQ(t.seconds[int(Cat::kLoss)], 0.0);
  EXPECT_EQ(t.flops[int(Cat::kLoss)], 0.0);
}

TEST(Profile, NamesAreDistinct) {
  std::set<std::string> names;
  for (int c = 0; c < int(Cat::kCount); ++c) names.insert(prof::name(Cat(c)));
  EXPECT_EQ(names.size(), size_t(Cat::kCount));
  EXPECT_EQ(names.count("?"), 0u);
}

// 6N + 12·L·d·T with N counted by hand from the architecture (not from num_params()).
TEST(Profile, FlopsPerTokenByHand) {
  for (const std::string mlp : {"squared_relu", "swiglu"}) {
    ModelConfig m;
    m.vocab_size = 100;
    m.d_model = 32;
    m.n_layers = 3;
    m.n_heads = 4;
    m.mlp = mlp;
    m.mlp_hidden = 48;
    nn::Model model(m, builtin_recipe("fp32"), 1, 16);
    const double C = 32, F = 48, L = 3, V = 100, T = 16;
    const double up = mlp == "swiglu" ? 2 * F * C : F * C;
    // per block: q, k, v, o (C·C each), up, down (F·C), two norm weights (C each)
    const double per_block = 4 * C * C + up + F * C + 2 * C;
    const double N = L * per_block + C /* final norm */ + V * C /* LM head */;
    EXPECT_DOUBLE_EQ(model.flops_per_token(int64_t(T)), 6 * N + 12 * L * C * T) << mlp;
  }
}

class PeakCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fp4_peak_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const char* old = std::getenv("FP4_CACHE_DIR");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("FP4_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (had_)
      setenv("FP4_CACHE_DIR", old_.c_str(), 1);
    else
      unsetenv("FP4_CACHE_DIR");
    fs::remove_all(dir_);
  }
  fs::path dir_;
  bool had_ = false;
  std::string old_;
};

TEST_F(PeakCache, OverrideWinsAndBadValuesThrow) {
  EXPECT_EQ(prof::fp32_peak_gflops(123.5).gflops, 123.5);
  EXPECT_EQ(prof::fp32_peak_gflops(123.5).source, "--peak-gflops");
  EXPECT_THROW(prof::fp32_peak_gflops(-1), std::invalid_argument);
  EXPECT_THROW(prof::fp32_peak_gflops(std::nan("")), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir_ / "gemm_peak.tsv"));  // an override measures nothing
}

TEST_F(PeakCache, BestCachedEntryOfThisMachineIsUsed) {
  const std::string key = prof::machine_key();
  {
    std::ofstream f(dir_ / "gemm_peak.tsv");
    f << "some other machine|2 cpus|2 threads\t9999\t2026-01-01\n"
      << key << "\t1234.5\t2026-01-01\n"
      << "garbage line without tabs\n"
      << key << "\t1000\t2026-02-01\n";
  }
  const prof::PeakRate r = prof::fp32_peak_gflops();
  EXPECT_EQ(r.gflops, 1234.5);
  EXPECT_NE(r.source.find("cached"), std::string::npos) << r.source;
}

TEST_F(PeakCache, CorruptEntriesAreSkippedAndAppendsStartOnANewLine) {
  const std::string key = prof::machine_key();
  {
    std::ofstream f(dir_ / "gemm_peak.tsv");
    f << key << "\t1e9\t2026-01-01\n"          // not a CPU's rate: skipped
      << key << "\tnan\t2026-01-01\n"
      << "a hand-edited last line without its newline";
  }
  const prof::PeakRate r = prof::fp32_peak_gflops();  // nothing usable: measured, appended
  EXPECT_NE(r.source.find("measured"), std::string::npos) << r.source;
  EXPECT_LT(r.gflops, 1e6);
  std::ifstream f(dir_ / "gemm_peak.tsv");
  std::string line, last;
  int lines = 0;
  while (std::getline(f, line)) ++lines, last = line;
  EXPECT_EQ(lines, 4);
  EXPECT_EQ(last.rfind(key + "\t", 0), 0u) << last;  // the new entry is a line of its own
  EXPECT_EQ(prof::fp32_peak_gflops().gflops, r.gflops);  // and is found again
}

TEST_F(PeakCache, MeasuresOnceThenReadsTheCache) {
  const prof::PeakRate first = prof::fp32_peak_gflops();
  EXPECT_GT(first.gflops, 0.5);  // any machine does more than 0.5 GFLOP/s in FP32
  EXPECT_NE(first.source.find("measured"), std::string::npos) << first.source;
  ASSERT_TRUE(fs::exists(dir_ / "gemm_peak.tsv"));
  const prof::PeakRate second = prof::fp32_peak_gflops();
  EXPECT_EQ(second.gflops, first.gflops);
  EXPECT_NE(second.source.find("cached"), std::string::npos) << second.source;
  // Remeasuring never lowers the rate: the best measurement counts.
  EXPECT_GE(prof::fp32_peak_gflops(0, true).gflops, first.gflops);
}

// A profiled training step: GEMM time and FLOPs land in the three GEMM kinds, the FLOPs of
// the three kinds add up to 6 × (the linears' and LM head's weights) per token, and the
// components add up to the step's wall time.
TEST(Profile, TrainingStepBreakdown) {
  const RunConfig cfg = fp4::testing::two_layer_config(0);
  const TokenStream tokens = fp4::testing::random_tokens(5000, 64, 7);
  for (const char* r : {"fp32", "ue5m3-b16", "bf16"}) {
    const Recipe recipe = builtin_recipe(r);
    nn::Model model(cfg.model, recipe, cfg.train.batch_size, cfg.train.seq_len);
    model.init(1);
    AdamW opt(model.num_params(), cfg.train);
    BatchSampler sampler(tokens, cfg.train.seq_len, cfg.train.batch_size, 1);
    std::vector<int32_t> in(32), tg(32);
    ProfOn on;
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult res = train_step(model, opt, sampler, cfg, recipe, 1, in, tg);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(res.diverged.empty()) << res.diverged;
    const prof::Totals t = prof::totals();
    double sum = 0;
    for (double s : t.seconds) sum += s;
    // Equal but for the moments between reset() and t0 and between the step and totals()
    // (a preemption there on a loaded machine); double counting would add whole components.
    EXPECT_GE(sum, 0.99 * wall) << r;
    EXPECT_LE(sum, 1.2 * wall + 0.005) << r;
    const double BT = 32, C = 32, F = 64, V = 64, L = 2;
    const double w = L * (4 * C * C + 2 * C * F) + V * C;  // weights of every GEMM
    for (Cat c : {Cat::kGemmFprop, Cat::kGemmDgrad, Cat::kGemmWgrad}) {
      EXPECT_DOUBLE_EQ(t.flops[int(c)], 2 * BT * w) << r << " " << prof::name(c);
      EXPECT_EQ(t.calls[int(c)], 6 * L + 1) << r << " " << prof::name(c);
    }
    for (Cat c : {Cat::kNorm, Cat::kAttention, Cat::kLoss, Cat::kOptimizer, Cat::kData})
      EXPECT_GT(t.calls[int(c)], 0) << r << " " << prof::name(c);
    const bool fp4 = std::string(r) == "ue5m3-b16", bf16 = std::string(r) == "bf16";
    EXPECT_EQ(t.calls[int(Cat::kQuantRow)] > 0, fp4) << r;
    EXPECT_EQ(t.calls[int(Cat::kQuantWgrad)] > 0, fp4) << r;
    EXPECT_EQ(t.calls[int(Cat::kQuantBf16)] > 0, bf16) << r;
  }
}
