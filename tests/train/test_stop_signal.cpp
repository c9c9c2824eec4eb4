// StopOnSignal (src/train/interruptible.cpp): the stop signals are kept off the compute threads.
//
// Why: oneDNN's JIT f32 GEMM kernels (2.x; 3.x before the fix of oneDNN issue #4845) point
// rsp into a heap workspace while they run. A signal handled on such a thread has its frame
// written into the heap. tests/cli/interrupt.sh met this in CI: SIGTERM during training,
// then "corrupted size vs. prev_size" / SIGSEGV in malloc.
#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "fp4/gemm/gemm.h"
#include "fp4/train/interruptible.h"

using fp4::StopOnSignal;

namespace {
// Whether every OpenMP thread of a team of `threads` (and the caller) blocks `sig`.
bool blocked_everywhere(int sig, int threads) {
  bool all = true;
  sigset_t cur;
  pthread_sigmask(SIG_BLOCK, nullptr, &cur);
  all &= sigismember(&cur, sig) == 1;
  std::vector<int> seen(static_cast<size_t>(threads), -1);
#pragma omp parallel num_threads(threads)
  {
    sigset_t m;
    pthread_sigmask(SIG_BLOCK, nullptr, &m);
    seen[static_cast<size_t>(omp_get_thread_num())] = sigismember(&m, sig);
  }
  for (int s : seen) all &= s == 1;
  return all;
}

// How many of the caller and the threads of a default-size OpenMP team block `sig`.
int blocked_count(int sig) {
  const int threads = omp_get_max_threads();
  std::vector<int> seen(static_cast<size_t>(threads), 0);
#pragma omp parallel num_threads(threads)
  {
    sigset_t m;
    pthread_sigmask(SIG_BLOCK, nullptr, &m);
    seen[static_cast<size_t>(omp_get_thread_num())] = sigismember(&m, sig) == 1;
  }
  int n = 0;
  for (int s : seen) n += s;
  return n;
}

bool wait_for_flag(int want) {
  for (int i = 0; i < 400; ++i) {
    if (*StopOnSignal::flag() == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(StopOnSignal, BlocksTheStopSignalsOnEveryComputeThreadWhileAlive) {
  // Workers that exist before the guard (a team of 3 made now) and ones made while it lives.
#pragma omp parallel num_threads(3)
  { (void)0; }
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) EXPECT_FALSE(blocked_everywhere(sig, 3)) << sig;
  {
    StopOnSignal guard;
    for (int sig : {SIGINT, SIGTERM, SIGUSR1}) {
      EXPECT_TRUE(blocked_everywhere(sig, 3)) << sig;
      EXPECT_TRUE(blocked_everywhere(sig, 5)) << sig << " (workers created under the guard)";
    }
    // Accepted by the watcher: the flag is set, and the process lives on.
    ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
    EXPECT_TRUE(wait_for_flag(SIGUSR1));
  }
  // Every thread of the default team (the caller is its thread 0) has its mask back.
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) EXPECT_EQ(blocked_count(sig), 0) << sig;
  struct sigaction now {};
  sigaction(SIGUSR1, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL) << "the handler is restored";
}

TEST(StopOnSignal, AStopSignalDuringGemmsLeavesTheHeapIntact) {
  // The failure mode itself: threads in oneDNN GEMMs, one stop signal at a random moment, many
  // times over. With StopOnSignal's ComputeSignalMask (mask_ in src/train/interruptible.cpp) made a no-op (the old guard: a
  // handler on whichever thread the kernel picks), this aborted with "corrupted size vs.
  // prev_size while consolidating" in 3 runs out of 3 (AMD EPYC, AVX2, libdnnl 2.6.3); glibc
  // aborts on a corrupted chunk, and the vector churn below makes it look at many.
  // The shapes and transpositions of a small model's fprop (X·Wᵀ), dgrad (dY·W) and wgrad
  // (dYᵀ·X), with beta 0 and 1: oneDNN picks different kernels for them.
  struct Shape {
    bool ta, tb;
    int64_t M, N, K;
    float beta;
  };
  const Shape shapes[] = {{false, true, 128, 512, 32, 0.f},  {false, false, 128, 32, 512, 0.f},
                          {true, false, 512, 32, 128, 1.f},  {false, true, 128, 64, 32, 0.f},
                          {false, false, 128, 32, 64, 1.f},  {true, false, 64, 32, 128, 1.f},
                          {false, true, 96, 96, 96, 0.f}};
  std::vector<float> a(512 * 512), b(512 * 512), c(512 * 512);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* v : {&a, &b})
    for (float& x : *v) x = u(rng);
  std::uniform_int_distribution<int> delay_us(0, 3000);
  for (int round = 0; round < 60; ++round) {
    StopOnSignal guard;
    std::thread sender([&, d = delay_us(rng)] {
      std::this_thread::sleep_for(std::chrono::microseconds(d));
      kill(getpid(), SIGTERM);
    });
    std::vector<std::vector<float>> churn;
    for (size_t i = 0; *StopOnSignal::flag() == 0; ++i) {
      const Shape& s = shapes[i % (sizeof shapes / sizeof shapes[0])];
      const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
      fp4::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, a.data(), lda, b.data(), ldb, s.beta, c.data(),
                 s.N);
      churn.emplace_back(static_cast<size_t>(1 + churn.size() % 97), 1.f);
      if (churn.size() > 64) churn.clear();
    }
    sender.join();
    ASSERT_EQ(*StopOnSignal::flag(), SIGTERM);
  }
  // Allocate and free across size classes: a corrupted free list aborts here at the latest.
  for (int i = 0; i < 20000; ++i) {
    std::vector<float> v(static_cast<size_t>(1 + i % 5000));
    v[0] = 1.f;
  }
}
}  // namespace
