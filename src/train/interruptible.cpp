// The stop on SIGINT / SIGTERM / SIGUSR1 of the commands that train, and their one
// interruptible run (fp4/train/interruptible.h).
#include "fp4/train/interruptible.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

#include <cstdio>
#include <cstdlib>

#include "fp4/dist/dist.h"
#include "fp4/base/error.h"

namespace fp4 {

std::string signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  return "signal " + std::to_string(sig);
}

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_quiet = 0;  // an MPI rank other than 0: print nothing

// The first stop signal sets the flag and says so; a later one ends the process at once with
// that signal's default action. Called by the watcher thread (below) for a signal it
// accepted, or as the handler of a signal delivered to a thread that did not block it.
// Restore the default action of `sig`, unblock it on this thread (unless `unblock` is false:
// a handler's own signal stays blocked until the handler returns) and raise it.
void raise_with_default_action(int sig, bool unblock) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  if (unblock) pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
}

void note_stop_signal(int sig, bool in_handler) {
  if (g_stop_signal != 0) {
    // In the handler the signal is blocked until it returns; in the watcher it is blocked
    // all along: unblocked, the raised signal is delivered to this thread and kills.
    raise_with_default_action(sig, !in_handler);
    return;
  }
  g_stop_signal = sig;
  if (g_quiet) return;
  static const char msg[] =
      "\nfp4train: stopping after the current step (a checkpoint is written first); a second "
      "Ctrl-C or signal stops at once\n";
  ssize_t r = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)r;
}

extern "C" void on_stop_signal(int sig) { note_stop_signal(sig, true); }

bool install(int sig, struct sigaction& old) {
  if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) return false;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // file writes and reads in progress are not cut short
  return sigaction(sig, &sa, nullptr) == 0;
}

std::atomic<bool> g_watch_done{false};
}  // namespace

// Why a watcher thread: a signal handler runs on the stack of whichever thread the signal is
// delivered to, and the kernel writes the signal frame just below that thread's stack
// pointer. oneDNN's JIT f32 GEMM kernels (2.x, and 3.x before 3.11.2) point rsp into a heap
// workspace while they run (oneDNN issue #4845, fixed by PR #4855), so a stop signal landing
// on a compute thread inside a GEMM wrote its frame into the heap: the CI failure of
// tests/cli/interrupt.sh ("corrupted size vs. prev_size", SIGSEGV in malloc a step later).
// So the stop signals are blocked in every compute thread and accepted, synchronously, by a
// thread that never computes. The handler stays installed for a thread this misses (e.g. a
// library's own idle thread): it runs no JIT code.
StopOnSignal::StopOnSignal() {
  g_stop_signal = 0;
  g_quiet = dist::rank() > 0;
  int_installed_ = install(SIGINT, old_int_);
  term_installed_ = install(SIGTERM, old_term_);
  usr1_installed_ = install(SIGUSR1, old_usr1_);
  sigemptyset(&set_);
  if (int_installed_) sigaddset(&set_, SIGINT);
  if (term_installed_) sigaddset(&set_, SIGTERM);
  if (usr1_installed_) sigaddset(&set_, SIGUSR1);
  mask_.emplace(set_);  // the main thread and every OpenMP worker (fp4/base/signal_mask.h)
  g_watch_done = false;
  watcher_ = std::thread([set = set_] {
    // Inherits the blocked mask: sigtimedwait accepts the pending signals of the process.
    const timespec tick{0, 50 * 1000 * 1000};  // checks for the end of the guard 20× a second
    siginfo_t info;
    while (!g_watch_done.load()) {
      const int sig = sigtimedwait(&set, &info, &tick);
      if (sig > 0) note_stop_signal(sig, false);
    }
  });
}

StopOnSignal::~StopOnSignal() {
  g_watch_done = true;
  watcher_.join();
  if (int_installed_) sigaction(SIGINT, &old_int_, nullptr);
  if (term_installed_) sigaction(SIGTERM, &old_term_, nullptr);
  if (usr1_installed_) sigaction(SIGUSR1, &old_usr1_, nullptr);
  // A signal that arrived since the watcher's last wait is pending: unblocked, it takes the
  // restored action, as any signal after the guard does.
  mask_.reset();
}

const volatile std::sig_atomic_t* StopOnSignal::flag() { return &g_stop_signal; }

void StopOnSignal::exit_by(int sig) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (dist::size() > 1) {
    dist::finalize();
    std::exit(128 + sig);
  }
  raise_with_default_action(sig, /*unblock=*/true);
  std::_Exit(128 + sig);
}

InterruptibleRun train_interruptible(const ValidatedRun& run, const TokenData& data,
                                     TrainOptions opt) {
  InterruptibleRun r;
  StopOnSignal guard;
  opt.stop_signal = StopOnSignal::flag();
  r.summary = train(run, data, opt);
  if (r.summary.stop_signal == 0) r.late_signal = *StopOnSignal::flag();
  return r;
}

void end_by_signal(int sig, const std::string& message) {
  std::fflush(stdout);
  if (dist::rank() == 0) std::fprintf(stderr, "%s", message.c_str());
  StopOnSignal::exit_by(sig);
}

}  // namespace fp4
