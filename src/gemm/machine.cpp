// The machine's compute paths and measured FP32 GEMM rate (see fp4/gemm/machine.h).
#include "fp4/gemm/machine.h"

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
#include <stdexcept>
#include <string>

#include "fp4/gemm/gemm.h"
#include "fp4/gemm/probe_gemm.h"
#include "fp4/numerics/quant_fast.h"

namespace fp4::prof {
namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

double measure_fp32_gemm_gflops() {
  constexpr int64_t M = 2048, N = 2048, K = 1024;
  std::vector<float> a(M * K), b(N * K), c(M * N);
  for (int64_t i = 0; i < M * K; ++i) a[i] = float((i * 7919) % 1013) / 1013.f - 0.5f;
  for (int64_t i = 0; i < N * K; ++i) b[i] = float((i * 104729) % 1009) / 1009.f - 0.5f;
  double best = 1e30;
  for (int r = 0; r < 10; ++r) {
    const auto t0 = clock::now();
    sgemm(false, true, M, N, K, 1.f, a.data(), K, b.data(), K, 0.f, c.data(), N);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (r >= 2) best = std::min(best, s);  // two warm-up runs (JIT, page faults)
  }
  return std::round(2.0 * M * N * K / best / 1e8) / 10;  // 0.1 GFLOP/s, as cached
}

std::string cpu_model_name() {
  std::string model = "unknown cpu";
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t p = line.find(':');
      if (p != std::string::npos) model = line.substr(p + 1);
      model.erase(0, model.find_first_not_of(" \t"));
      break;
    }
  return model;
}

ComputePaths compute_paths() {
  ComputePaths c;
  c.cpu = cpu_model_name();
  c.gemm_fp32 = gemm_fp32_description();
  c.gemm_bf16 = gemm_bf16_description();
  c.simd = quant_fast_target();
  c.probe_gemm = probe_kernel_name(probe_gemm_auto_kernel());
  if (const char* e = std::getenv("FP4_MAX_CPU_ISA"); e && *e) c.max_isa_env = e;
  if (const char* e = std::getenv("ONEDNN_MAX_CPU_ISA"); e && *e) c.onednn_isa_env = e;
  return c;
}

std::string ComputePaths::line() const {
  std::string s = cpu + "; FP32 GEMM " + gemm_fp32 + "; BF16 GEMM " + gemm_bf16 + "; SIMD " + simd +
                  "; probe GEMM " + probe_gemm;
  if (!max_isa_env.empty()) s += "; FP4_MAX_CPU_ISA=" + max_isa_env;
  if (!onednn_isa_env.empty()) s += "; ONEDNN_MAX_CPU_ISA=" + onednn_isa_env;
  return s;
}

std::vector<std::pair<std::string, std::string>> ComputePaths::fields() const {
  std::vector<std::pair<std::string, std::string>> f = {{"cpu", cpu},
                                                        {"gemm_fp32", gemm_fp32},
                                                        {"gemm_bf16", gemm_bf16},
                                                        {"simd", simd},
                                                        {"probe_gemm", probe_gemm}};
  if (!max_isa_env.empty()) f.emplace_back("FP4_MAX_CPU_ISA", max_isa_env);
  if (!onednn_isa_env.empty()) f.emplace_back("ONEDNN_MAX_CPU_ISA", onednn_isa_env);
  return f;
}

std::string machine_key() {
  std::string model = cpu_model_name();
  for (char& ch : model)
    if (ch == '\t' || ch == '|') ch = ' ';
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return model + "|" + std::to_string(cpus) + " cpus|" + std::to_string(omp_get_max_threads()) +
         " threads";
}

namespace {
// Rates above this (1 PFLOP/s) are not a CPU's FP32 GEMM rate: a corrupted cache entry.
constexpr double kMaxGflops = 1e6;

fs::path cache_file() {
  if (const char* d = std::getenv("FP4_CACHE_DIR"); d && *d) return fs::path(d) / "gemm_peak.tsv";
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return fs::path(d) / "fp4train" / "gemm_peak.tsv";
  if (const char* h = std::getenv("HOME"); h && *h)
    return fs::path(h) / ".cache" / "fp4train" / "gemm_peak.tsv";
  return {};
}
}  // namespace

PeakRate fp32_peak_gflops(double override_gflops, bool remeasure) {
  if (std::isnan(override_gflops) || override_gflops < 0)
    throw std::invalid_argument("--peak-gflops must be a positive number of GFLOP/s, got " +
                                std::to_string(override_gflops));
  if (override_gflops > 0) return {override_gflops, "--peak-gflops"};
  const std::string key = machine_key();
  const fs::path file = cache_file();
  double cached = 0;
  if (!file.empty()) {
    std::ifstream f(file);
    std::string line;
    while (std::getline(f, line)) {  // key \t gflops \t date; the best entry of the key counts
      const size_t t1 = line.find('\t');
      if (t1 == std::string::npos || line.substr(0, t1) != key) continue;
      const double g = std::atof(line.c_str() + t1 + 1);
      if (g > 0 && g <= kMaxGflops) cached = std::max(cached, g);  // garbage is skipped
    }
  }
  if (cached > 0 && !remeasure) return {cached, "best measured on this machine, cached in " + file.string()};
  const double measured = measure_fp32_gemm_gflops();
  if (measured <= cached)
    return {cached, "best measured on this machine (now " + std::to_string(int(measured)) +
                        "), cached in " + file.string()};
  PeakRate r{measured, "measured now"};
  if (!file.empty()) {
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    bool newline_first = false;  // a last line without its newline (hand-edited file)
    if (std::ifstream in(file, std::ios::binary); in && in.seekg(-1, std::ios::end)) {
      char last = '\n';
      newline_first = in.get(last) && last != '\n';
    }
    std::ofstream o(file, std::ios::app);
    if (o && newline_first) o << '\n';
    char date[32] = "";
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.1f", measured);
    if (o) o << key << '\t' << rate << '\t' << date << '\n';
    if (!o)
      std::fprintf(stderr, "warning: cannot write the GEMM-rate cache %s; the rate will be "
                           "measured again next time (FP4_CACHE_DIR selects another "
                           "directory)\n", file.string().c_str());
    else
      r.source = "measured now, cached in " + file.string();
  }
  return r;
}

}  // namespace fp4::prof
