// fp4train's default OpenMP wait policy.
//
// GNU OpenMP (libgomp) threads that reach a barrier or wait for work spin for GOMP_SPINCOUNT
// iterations (300,000 unless set: about a millisecond) before they sleep. On a machine where
// another process uses a core, that collapses: the spinning thread holds its core while the
// thread it waits for has been descheduled from the busy one, so every barrier costs a
// scheduler time slice. fp4train therefore runs with OMP_WAIT_POLICY=passive unless the
// user has set OMP_WAIT_POLICY or GOMP_SPINCOUNT (then their choice stands). Measurements:
// docs/performance.md, "A shared machine". The wait policy decides only when a waiting
// thread sleeps, never what a thread computes: results are the same bits under every policy
// (tests/cli/omp_wait.sh).
#pragma once

namespace fp4::cli {

/// Call first in main(), before any OpenMP or oneDNN call. If neither OMP_WAIT_POLICY nor
/// GOMP_SPINCOUNT is set, sets OMP_WAIT_POLICY=passive and re-executes this program
/// (/proc/self/exe) with the same arguments: libgomp reads its settings once, while the
/// program loads, before main() runs, so a setenv() alone would come too late. Returns (doing
/// nothing more) if either variable was set, or if the exec fails. Never throws.
void default_omp_wait_policy(char** argv);

}  // namespace fp4::cli
