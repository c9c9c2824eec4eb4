// The machine fp4train computes on: the FP32 and BF16 GEMM implementations and SIMD targets in
// use (ComputePaths), and the measured FP32 GEMM rate that model FLOPs utilization is measured
// against (docs/performance.md "Where the time goes: `fp4train profile`"). In the gemm room
// because it asks oneDNN, the probe GEMM and the quantizers which paths they took; the
// step-time scopes are in fp4/base/profile.h.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace fp4::prof {

/// Measured FP32 GEMM rate of this machine in GFLOP/s (rounded to 0.1): the best of several timed runs of
/// fp4::sgemm (oneDNN, the backend every FP32 product of the model uses) on M = N = 2048,
/// K = 1024 with the current OpenMP thread count, after two warm-up runs. Takes about 0.3 s.
/// The best run, not the median: it is the attainable rate, and a busy machine only slows
/// runs down.
double measure_fp32_gemm_gflops();

/// Where a peak rate came from.
struct PeakRate {
  double gflops = 0;
  std::string source;  ///< "--peak-gflops", "measured", or "cached in <file>"
};

/// The FP32 GEMM rate MFU is measured against. override_gflops > 0 wins ("--peak-gflops").
/// Otherwise the best rate measured on this machine so far, from the cache file
/// $FP4_CACHE_DIR/gemm_peak.tsv, else $XDG_CACHE_HOME/fp4train/gemm_peak.tsv, else
/// ~/.cache/fp4train/gemm_peak.tsv (lines "<machine key> TAB <GFLOP/s> TAB <date>"; the
/// largest rate of the key counts; lines that do not parse or exceed 1e6 GFLOP/s are
/// skipped). With no entry, or with `remeasure`,
/// measure_fp32_gemm_gflops() runs and a new best is appended, so a measurement slowed down
/// by a busy machine is replaced by the next better one (`fp4train profile` remeasures every
/// time; `train` measures only when nothing is cached). A cache that cannot be written is
/// skipped with a warning on stderr. Throws std::invalid_argument if override_gflops is
/// negative or NaN.
PeakRate fp32_peak_gflops(double override_gflops = 0, bool remeasure = false);

/// What this process computes with: the CPU, the FP32 and BF16 GEMM implementations
/// (fp4::gemm_fp32_description, fp4::gemm_bf16_description) and the SIMD target of
/// fp4train's own kernels (fp4::quant_fast_target), plus FP4_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA
/// when set. Printed in run headers, stored in summary.json ("compute") and profile --json.
struct ComputePaths {
  std::string cpu, gemm_fp32, gemm_bf16, simd;
  std::string probe_gemm;  ///< kernel of the probe-matched GEMM (probe_kernel_name)
  std::string max_isa_env, onednn_isa_env;  ///< "" when unset
  /// "AMD EPYC; FP32 GEMM oneDNN 2.6 sgemm, ISA avx2; BF16 GEMM widened: ...; SIMD AVX2;
  /// probe GEMM avx2"
  std::string line() const;
  /// (key, value) pairs for JSON: cpu, gemm_fp32, gemm_bf16, simd, probe_gemm, and
  /// FP4_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA when set.
  std::vector<std::pair<std::string, std::string>> fields() const;
};
/// Queries the above (may create a small oneDNN primitive on the first call).
ComputePaths compute_paths();

/// The CPU's model name from /proc/cpuinfo (e.g. "AMD EPYC 7B13"), or "unknown cpu".
std::string cpu_model_name();

/// The machine key of the cache: "<cpu model name>|<logical cpus> cpus|<threads> threads".
std::string machine_key();

}  // namespace fp4::prof
