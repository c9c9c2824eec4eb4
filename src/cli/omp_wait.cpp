// fp4train's default OpenMP wait policy (see omp_wait.h).
#include "omp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace fp4::cli {

void default_omp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr)
    return;
  // Set first, so the new image sees it (and does not come here again); if exec fails, this
  // process goes on with libgomp's own default.
  if (setenv("OMP_WAIT_POLICY", "passive", 0) != 0) return;
  execv("/proc/self/exe", argv);
}

}  // namespace fp4::cli
