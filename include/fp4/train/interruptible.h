// The interruptible run of the commands that train (the CLI's train, the study room's
// compare): SIGINT / SIGTERM / SIGUSR1 stop a run after its current step, with a checkpoint
// (docs/checkpoints.md "Checkpoints and resume").
#pragma once
#include <csignal>
#include <optional>
#include <string>
#include <thread>

#include "fp4/base/signal_mask.h"
#include "fp4/train/train.h"

namespace fp4 {

/// While alive, SIGINT, SIGTERM and SIGUSR1 (unless ignored when it was made, e.g. SIGINT of
/// a background job of a non-interactive shell) only set an async-signal-safe flag, which
/// train() reads between steps (TrainOptions::stop_signal): the step in progress finishes, a
/// checkpoint is written, train() returns with TrainSummary::stopped. A second signal
/// terminates the process at once (default action). The destructor restores the handlers.
/// SIGUSR1 is the one to send to `mpirun`, which forwards it to every process (it kills the
/// job on SIGINT and SIGTERM); ranks other than 0 print nothing. Not reentrant: one at a time.
/// Construct it on the thread that runs OpenMP regions (the main thread): it blocks the
/// three signals there and in every OpenMP worker, and a watcher thread of its own accepts
/// them (sigtimedwait), so no handler ever runs on a thread inside a GEMM kernel (oneDNN's
/// JIT GEMM moves rsp into the heap; a signal frame written there corrupts it: see
/// interruptible.cpp). The destructor unblocks them again.
class StopOnSignal {
 public:
  StopOnSignal();
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
  /// The flag for TrainOptions::stop_signal: 0, or the number of the first signal received.
  static const volatile std::sig_atomic_t* flag();
  /// Flush stdout and stderr, restore the default action of signal `sig` and raise it, so the
  /// process ends as killed by it (shell status 128 + sig: 130 for SIGINT, 143 for SIGTERM);
  /// exits with 128 + sig should it survive. Under mpirun with several processes: MPI is
  /// finalised and the process exits with status 128 + sig (a process killed by a signal
  /// makes mpirun abort the others). Does not return.
  [[noreturn]] static void exit_by(int sig);

 private:
  struct sigaction old_int_ {
  }, old_term_{}, old_usr1_{};
  bool int_installed_ = false, term_installed_ = false, usr1_installed_ = false;
  sigset_t set_{};                         ///< the installed ones: blocked in the compute threads
  std::thread watcher_;                    ///< accepts them (sigtimedwait) while the guard lives
  std::optional<ComputeSignalMask> mask_;  ///< blocks them on the compute threads
};

/// "SIGINT", "SIGTERM", "SIGUSR1" or "signal N".
std::string signal_name(int sig);

/// The one interruptible run of `train` and `compare`: fp4::train(run, data, opt) (a run
/// that validate_run has checked before the data was prepared) with opt.stop_signal set by a StopOnSignal guard that lives for the run. `summary` is what
/// train returned (summary.stop_signal != 0: stopped after a step, with a checkpoint);
/// `late_signal` is a signal that arrived during the last step, which completed (the last
/// step is never cut short), else 0. Throws what fp4::train throws.
struct InterruptibleRun {
  TrainSummary summary;
  int late_signal = 0;
};
InterruptibleRun train_interruptible(const ValidatedRun& run, const TokenData& data,
                                     TrainOptions opt);

/// Flush stdout, print `message` on stderr (rank 0 only under mpirun) and end the process as
/// killed by `sig` (StopOnSignal::exit_by). Does not return.
[[noreturn]] void end_by_signal(int sig, const std::string& message);

}  // namespace fp4
