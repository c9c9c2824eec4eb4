// Keeping asynchronous signals off the threads that run GEMM kernels.
//
// oneDNN's JIT f32 GEMM kernels (libdnnl 2.x, and 3.x before 3.11.2: oneDNN issue #4845,
// fixed by PR #4855) point rsp at a heap workspace while they run. A signal handled on such a
// thread has its frame written there by the kernel, which corrupts the heap ("corrupted size
// vs. prev_size", a SIGSEGV in malloc later). Any handler does it: Python's SIGINT handler
// (Ctrl-C during fp4train.gemm), a profiler's SIGPROF, fp4train's own stop signals.
#pragma once
#include <csignal>
#include <vector>

namespace fp4 {

/// While alive, the asynchronous signals (every signal but SIGSEGV, SIGBUS, SIGFPE, SIGILL,
/// SIGTRAP, SIGSYS and SIGABRT, which are raised by the faulting thread itself) are blocked
/// in the calling thread and in every thread of an OpenMP team of the default size; OpenMP
/// threads created meanwhile inherit the blocked mask. Signals sent meanwhile stay pending for
/// the process and are delivered when a thread unblocks them: at the latest when the object
/// is destroyed, which gives each of those threads its previous mask back. Costs two OpenMP
/// regions and a sigprocmask per thread (microseconds): wrap whole calls, not inner loops.
/// Construct and destroy it on the same thread. Not copyable.
class ComputeSignalMask {
 public:
  ComputeSignalMask();
  /// Block only `set` (e.g. the stop signals of fp4train's StopOnSignal).
  explicit ComputeSignalMask(const sigset_t& set);
  ~ComputeSignalMask();
  ComputeSignalMask(const ComputeSignalMask&) = delete;
  ComputeSignalMask& operator=(const ComputeSignalMask&) = delete;

 private:
  void block(const sigset_t& set);
  std::vector<sigset_t> old_;  ///< [0]: the caller's previous mask; [1 + t]: OpenMP thread t's
  int threads_ = 0;
};

/// The set ComputeSignalMask() blocks.
sigset_t asynchronous_signals();

}  // namespace fp4
