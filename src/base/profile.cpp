// Step-time profiling: scopes by category, FLOP counts, peak RSS (see fp4/base/profile.h; the
// measured FP32 GEMM rate is gemm/machine.cpp's).
#include "fp4/base/profile.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>


namespace fp4::prof {
namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

namespace detail {
bool g_enabled = false;
}  // namespace detail

namespace {
Totals g_totals;
// Open scopes (innermost last); the bottom of the stack is the implicit kOther.
std::vector<Cat> g_stack;
clock::time_point g_last;  // when the innermost open scope last started accruing

void accrue(clock::time_point now) {
  const Cat c = g_stack.empty() ? Cat::kOther : g_stack.back();
  g_totals.seconds[int(c)] += std::chrono::duration<double>(now - g_last).count();
  g_last = now;
}
}  // namespace

const char* name(Cat c) {
  switch (c) {
    case Cat::kOther: return "other";
    case Cat::kData: return "data";
    case Cat::kEmbedding: return "embedding";
    case Cat::kNorm: return "rmsnorm";
    case Cat::kRope: return "rope";
    case Cat::kAttention: return "attention";
    case Cat::kActivation: return "activation";
    case Cat::kResidual: return "residual";
    case Cat::kSsmConv: return "ssm.conv";
    case Cat::kSsmScan: return "ssm.scan.fwd";
    case Cat::kSsmScanBwd: return "ssm.scan.bwd";
    case Cat::kSsmNorm: return "ssm.gated_norm";
    case Cat::kGemmFprop: return "gemm.fprop";
    case Cat::kGemmDgrad: return "gemm.dgrad";
    case Cat::kGemmWgrad: return "gemm.wgrad";
    case Cat::kQuantAmax: return "quant.amax";
    case Cat::kQuantRow: return "quant.rows";
    case Cat::kQuantWgrad: return "quant.wgrad-transpose";
    case Cat::kQuantBf16: return "quant.bf16";
    case Cat::kTranspose: return "transpose";
    case Cat::kTelemetry: return "telemetry";
    case Cat::kLoss: return "loss";
    case Cat::kGradClip: return "grad-clip";
    case Cat::kOptimizer: return "optimizer";
    case Cat::kComm: return "comm";
    case Cat::kCount: break;
  }
  return "?";
}

void enable(bool on) {
  if (on && !detail::g_enabled) g_last = clock::now();
  detail::g_enabled = on;
  g_stack.clear();
}

bool enabled() { return detail::g_enabled; }

void reset() {
  g_totals = Totals{};
  g_stack.clear();
  g_last = clock::now();
}

Totals totals() {
  if (detail::g_enabled && g_stack.empty()) accrue(clock::now());  // time since the last scope
  return g_totals;
}

void add_flops(Cat c, double flops) {
  if (detail::g_enabled) g_totals.flops[int(c)] += flops;
}

namespace detail {
bool enter(Cat c) {
  if (omp_in_parallel()) return false;  // a team's threads would race on the shared stack
  accrue(clock::now());
  g_stack.push_back(c);
  ++g_totals.calls[int(c)];
  return true;
}
void leave() {
  if (g_stack.empty()) return;
  accrue(clock::now());
  g_stack.pop_back();
}
Cat current() { return g_enabled && !g_stack.empty() ? g_stack.back() : Cat::kOther; }
}  // namespace detail

namespace {
int64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::atoll(line.c_str() + k.size());
  return 0;
}
}  // namespace

int64_t peak_rss_bytes() { return status_kib("VmHWM") * 1024; }
int64_t rss_bytes() { return status_kib("VmRSS") * 1024; }

}  // namespace fp4::prof
