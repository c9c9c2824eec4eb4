// No heap allocation per training step in the steady state: this binary replaces the global
// operator new / delete with counting versions and runs train_step (telemetry off) for the
// FP32, BF16 and FP4 recipes (each FP4 recipe with its own GEMM, decoded-bf16 through gemm =
// "auto", and with the reference decoded GEMM; with RHT, MX), and bf16 and ue5m3-b16 again on
// the BF16 GEMM's blocked path where the CPU has it. After two warm-up steps, steps 3 and 4 must
// not call operator new on any thread.
//
// When they do, a further step runs with the profiler on, and each allocation is attributed
// to the step component (prof::Cat) open at the time, so the failure says where it happened.
// The one exception: allocations made inside oneDNN's primitive execution of the BF16 GEMM
// (fp4::detail::in_onednn_execute(); oneDNN 2.6 builds its argument map on the heap) are
// counted apart and only reported. With FP4_ALLOC_BACKTRACE set, each attributed
// allocation's stack goes to stderr (resolve with addr2line -f -C -e test_alloc <offset>).
#include <gtest/gtest.h>
#include <execinfo.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "fp4/gemm/gemm.h"
#include "fp4/nn/model.h"
#include "fp4/base/profile.h"
#include "fp4/config/settings.h"
#include "fp4/recipe/recipe.h"
#include "fp4/train/train.h"
#include "support/step_test_setup.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_count{0};
std::atomic<int64_t> g_library{0};  // inside oneDNN's primitive execution
std::atomic<int64_t> g_by_cat[int(fp4::prof::Cat::kCount)];
std::atomic<bool> g_attribute{false};

void note_alloc() {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  if (fp4::detail::in_onednn_execute()) {
    g_library.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  g_count.fetch_add(1, std::memory_order_relaxed);
  if (g_attribute.load(std::memory_order_relaxed)) {
    g_by_cat[int(fp4::prof::detail::current())].fetch_add(1, std::memory_order_relaxed);
    if (std::getenv("FP4_ALLOC_BACKTRACE")) {  // raw stacks to stderr (addr2line -f -C)
      void* frames[32];
      backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
      if (write(2, "----\n", 5) < 0) {
      }
    }
  }
}
void* alloc(size_t n) {
  note_alloc();
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
void* alloc_aligned(size_t n, std::align_val_t a) {
  note_alloc();
  const size_t al = static_cast<size_t>(a);
  void* p = std::aligned_alloc(al, (n + al - 1) / al * al + (n ? 0 : al));
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(size_t n) { return alloc(n); }
void* operator new[](size_t n) { return alloc(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try { return alloc(n); } catch (...) { return nullptr; }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try { return alloc(n); } catch (...) { return nullptr; }
}
void* operator new(size_t n, std::align_val_t a) { return alloc_aligned(n, a); }
void* operator new[](size_t n, std::align_val_t a) { return alloc_aligned(n, a); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try { return alloc_aligned(n, a); } catch (...) { return nullptr; }
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try { return alloc_aligned(n, a); } catch (...) { return nullptr; }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace fp4;
namespace fs = std::filesystem;
using prof::Cat;

namespace {

// (recipe, OpenMP team size, model: the two-layer Llama-style one or the hybrid "M*-M-" of
// Mamba-2, attention and MLP blocks, support/step_test_setup.h). A team larger than the tile count of some GEMMs (4 threads on
// the tiny shapes) lets a thread run its first tile of a kind only in a later step, which is
// where per-thread buffers grown lazily would allocate mid-training.
class SteadyStateAlloc : public ::testing::TestWithParam<std::tuple<const char*, int, bool>> {};

// Sets the OpenMP team size for the scope.
struct TeamSize {
  int saved = omp_get_max_threads();
  explicit TeamSize(int n) { omp_set_num_threads(n); }
  ~TeamSize() { omp_set_num_threads(saved); }
};

// Sets the BF16 GEMM's path for the scope (gemm_bf16_set_path), restoring the one before.
struct Bf16PathScope {
  Bf16GemmPath saved = gemm_bf16_path();
  explicit Bf16PathScope(Bf16GemmPath p) { gemm_bf16_set_path(p); }
  ~Bf16PathScope() { gemm_bf16_set_path(saved); }
};

TEST_P(SteadyStateAlloc, TrainStepsThreeAndFourAllocateNothing) {
  std::string name = std::get<0>(GetParam());
  const TeamSize team(std::get<1>(GetParam()));
  // "<recipe>+blocked": with the BF16 GEMM's blocked path (docs/gemm.md "The blocked path
  // (`FP4_BF16_GEMM=blocked`)"), where oneDNN offers it.
  const std::string suffix = "+blocked";
  const bool blocked = name.size() > suffix.size() && name.ends_with(suffix);
  if (blocked) {
    if (!gemm_bf16_blocked_available()) GTEST_SKIP() << "oneDNN offers no brgemm BF16 matmul";
    name.resize(name.size() - suffix.size());
  }
  const Bf16PathScope path(blocked ? Bf16GemmPath::Blocked : gemm_bf16_path());
  const Recipe recipe = fp4::testing::shipped_recipe(name);  // "<recipe>@<gemm>": with that GEMM
  // Telemetry off: telemetry steps may allocate (quant_stats); the others may not.
  const RunConfig cfg = std::get<2>(GetParam()) ? fp4::testing::hybrid_config(0)
                                                : fp4::testing::two_layer_config(0);
  const TokenStream tokens = fp4::testing::random_tokens(5000, 64, 7);
  nn::Model model(cfg.model, recipe, cfg.train.batch_size, cfg.train.seq_len);
  model.init(1);
  AdamW opt(model.num_params(), cfg.train);
  BatchSampler sampler(tokens, cfg.train.seq_len, cfg.train.batch_size, 1);
  const int64_t BT = int64_t(cfg.train.batch_size) * cfg.train.seq_len;
  std::vector<int32_t> in(BT), tg(BT);
  for (int step = 1; step <= 2; ++step) {  // warm-up: buffers, thread pools, JIT kernels
    const StepResult r = train_step(model, opt, sampler, cfg, recipe, step, in, tg);
    ASSERT_TRUE(r.diverged.empty()) << r.diverged;
  }
  g_count = 0;
  g_library = 0;
  g_counting = true;
  for (int step = 3; step <= 4; ++step) {
    const StepResult r = train_step(model, opt, sampler, cfg, recipe, step, in, tg);
    if (!r.diverged.empty()) {
      g_counting = false;
      FAIL() << r.diverged;
    }
  }
  g_counting = false;
  const int64_t n = g_count.load();
  if (g_library.load() > 0)
    std::printf("%s: %lld allocations inside oneDNN's BF16 matmul execution in steps 3-4 "
                "(library internals, not counted)\n",
                name.c_str(), static_cast<long long>(g_library.load()));
  if (n == 0) return;

  // Attribute: one step with the profiler on (a first one warms its scope stack).
  prof::enable(true);
  (void)train_step(model, opt, sampler, cfg, recipe, 5, in, tg);
  for (auto& c : g_by_cat) c = 0;
  g_count = 0;
  g_attribute = true;
  g_counting = true;
  (void)train_step(model, opt, sampler, cfg, recipe, 6, in, tg);
  g_counting = false;
  g_attribute = false;
  prof::enable(false);
  std::string where;
  for (int c = 0; c < int(Cat::kCount); ++c) {
    const int64_t k = g_by_cat[c].load();
    if (k == 0) continue;
    where += std::string(where.empty() ? "" : ", ") + prof::name(Cat(c)) + ": " +
             std::to_string(k);
  }
  FAIL() << name << ": " << n << " operator new calls in steps 3-4; per component in step 6 ("
         << where << ")";
}

INSTANTIATE_TEST_SUITE_P(Recipes, SteadyStateAlloc,
                         ::testing::Combine(::testing::Values("fp32", "bf16", "ue5m3-b16",
                                                              "nvfp4-te", "mxfp4",
                                                              "ue5m3-b16@decoded",
                                                              "nvfp4-te@decoded", "bf16+blocked",
                                                              "ue5m3-b16+blocked"),
                                            ::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param);
                           for (char& c : s)
                             if (c == '-' || c == '@' || c == '+') c = '_';
                           return s + "_threads" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_hybrid" : "");
                         });

// The counter itself works (so a zero above means something).
TEST(SteadyStateAlloc, CounterSeesAllocations) {
  g_count = 0;
  g_counting = true;
  auto* v = new std::vector<int>(100);
  g_counting = false;
  delete v;
  EXPECT_GE(g_count.load(), 2);
}
}  // namespace
