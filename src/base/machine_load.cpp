// The load of the machine: other processes' CPU use, read from /proc (fp4/base/machine_load.h).
#include "fp4/base/machine_load.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace fp4 {

std::string MachineLoad::describe() const {
  char b[64];
  if (load1 < 0) return "load unknown";
  std::snprintf(b, sizeof b, "load %.2f on %d core%s", load1, cores, cores == 1 ? "" : "s");
  return b;
}

MachineLoad machine_load() {
  MachineLoad m;
  double l[1];
  if (getloadavg(l, 1) == 1) m.load1 = l[0];
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n > 0) m.cores = int(n);
  return m;
}

}  // namespace fp4
