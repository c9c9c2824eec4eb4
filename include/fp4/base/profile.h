// Step-time profiling (docs/performance.md "Where the time goes: `fp4train profile`"):
// exclusive wall time per component of a training step, GEMM FLOPs per kind, peak resident
// memory, model FLOPs per token and the machine's measured FP32 GEMM rate for model FLOPs
// utilization (MFU; the rate itself: fp4/gemm/machine.h).
//
// Timing model. Code marks regions with `prof::Scope s(prof::Cat::X)`. Time is EXCLUSIVE: when
// a scope opens inside another, the outer one stops accruing until the inner one closes, so the
// components of a step add up to the step's wall time; time outside every scope is `other`
// (zero-fills, buffer copies, loop glue). Scopes belong on the thread that drives the step: a
// scope opened inside an active OpenMP parallel region (omp_in_parallel()) records nothing, on
// any of the team's threads, and touches no shared state. When profiling is disabled (the
// default) a scope costs one branch on a global flag.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <utility>

namespace fp4::prof {

/// Components of a training step, in report order.
enum class Cat : int {
  kOther = 0,    ///< not inside any scope: zero-fills, copies, glue
  kData,         ///< next batch from the sampler
  kEmbedding,    ///< token-embedding lookup and its gradient scatter
  kNorm,         ///< RMSNorm forward and backward
  kRope,         ///< rotary embedding forward and backward
  kAttention,    ///< causal attention forward and backward (QKᵀ, softmax, PV and gradients)
  kActivation,   ///< MLP activation (squared ReLU / SwiGLU) forward and backward
  kResidual,     ///< residual-stream adds
  kSsmConv,      ///< Mamba-2 causal depthwise conv1d + SiLU, forward and backward
  kSsmScan,      ///< Mamba-2 SSD scan forward (softplus Δ, decays, chunk states, readout)
  kSsmScanBwd,   ///< Mamba-2 SSD scan backward
  kSsmNorm,      ///< Mamba-2 gated RMSNorm (y·SiLU(z), grouped RMSNorm), forward and backward
  kGemmFprop,    ///< Y = X·Wᵀ GEMMs (every Linear and the LM head)
  kGemmDgrad,    ///< dX = dY·W GEMMs
  kGemmWgrad,    ///< dW = dYᵀ·X GEMMs
  kQuantAmax,    ///< tensor amax reductions for the scale reference g (skipped on held steps)
  kQuantRow,     ///< block quantizers along rows (fprop X, W, dgrad dY): block amax, scale,
                 ///< E2M1 rounding (RNE or SR) and decode, fused in one pass per block
  kQuantWgrad,   ///< quantize-transposes of the wgrad operands dYᵀ, Xᵀ (RHT fused when used)
  kQuantBf16,    ///< rounding operands to BF16 (BF16-mode linears)
  kTranspose,    ///< explicit transposes (1-D weight blocks in dgrad, probe-matched mode)
  kTelemetry,    ///< numerics telemetry statistics (telemetry steps only)
  kLoss,         ///< softmax cross-entropy forward and backward
  kGradClip,     ///< global gradient norm and clipping
  kOptimizer,    ///< AdamW update
  kComm,         ///< MPI communication: gradient reduction, amax broadcasts, evaluation sums
  kCount
};

/// Short stable name of a component ("gemm.fprop", "quant.amax", ...), as printed by
/// `fp4train profile` and used as a JSON key.
const char* name(Cat c);

/// Turn collection on or off (process-wide; off by default). Not thread-safe: call between
/// steps, from the driving thread.
void enable(bool on);
bool enabled();

/// Zero every accumulator (call after warm-up steps).
void reset();

/// Accumulated totals since the last reset().
struct Totals {
  double seconds[int(Cat::kCount)] = {};  ///< exclusive wall seconds per component
  double flops[int(Cat::kCount)] = {};    ///< FLOPs credited with add_flops (GEMMs)
  int64_t calls[int(Cat::kCount)] = {};   ///< scopes opened per component
};
Totals totals();

/// Credit `flops` floating-point operations (2·M·N·K for a GEMM) to component c; no-op when
/// disabled.
void add_flops(Cat c, double flops);

namespace detail {
extern bool g_enabled;
/// Opens a region of c; false (nothing recorded, nothing to leave) inside an active
/// parallel region.
bool enter(Cat c);
void leave();
/// The innermost open scope's component (kOther when disabled or none is open). For
/// diagnostics, e.g. attributing heap allocations to components (tests/nn/test_alloc.cpp).
Cat current();
}  // namespace detail

/// RAII region of component c (see the timing model above). Not copyable.
class Scope {
 public:
  explicit Scope(Cat c) : on_(detail::g_enabled && detail::enter(c)) {}
  ~Scope() {
    if (on_) detail::leave();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool on_;
};

/// Peak resident set size of this process so far (VmHWM of /proc/self/status), in bytes;
/// 0 if it cannot be read.
int64_t peak_rss_bytes();
/// Current resident set size (VmRSS), in bytes; 0 if it cannot be read.
int64_t rss_bytes();

}  // namespace fp4::prof
