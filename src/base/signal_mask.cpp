// ComputeSignalMask (see include/fp4/base/signal_mask.h).
#include "fp4/base/signal_mask.h"

#include <omp.h>
#include <pthread.h>

namespace fp4 {

sigset_t asynchronous_signals() {
  sigset_t s;
  sigfillset(&s);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&s, sig);
  return s;
}

ComputeSignalMask::ComputeSignalMask() { block(asynchronous_signals()); }
ComputeSignalMask::ComputeSignalMask(const sigset_t& set) { block(set); }

void ComputeSignalMask::block(const sigset_t& set) {
  threads_ = omp_get_max_threads();
  old_.resize(size_t(threads_) + 1);
  pthread_sigmask(SIG_BLOCK, &set, &old_[0]);
#pragma omp parallel num_threads(threads_)
  {
    const int t = omp_get_thread_num();
    sigset_t prev;
    pthread_sigmask(SIG_BLOCK, &set, &prev);
    // Thread 0 is the caller, already blocked: its previous mask is old_[0].
    if (t > 0 && t < threads_) old_[size_t(t) + 1] = prev;
  }
}

ComputeSignalMask::~ComputeSignalMask() {
  // The workers get their previous masks back, then the caller: a signal that is pending is
  // delivered to whichever of them unblocks it first.
#pragma omp parallel num_threads(threads_)
  {
    const int t = omp_get_thread_num();
    if (t > 0 && t < threads_) pthread_sigmask(SIG_SETMASK, &old_[size_t(t) + 1], nullptr);
  }
  pthread_sigmask(SIG_SETMASK, &old_[0], nullptr);
}

}  // namespace fp4
