// How busy the machine is, for the timings fp4train reports (step times, tokens/s, profile
// shares): a timing taken while more threads want to run than there are cores measures the
// scheduler as much as fp4train.
#pragma once
#include <string>

namespace fp4 {

/// The machine's load when it was sampled.
struct MachineLoad {
  double load1 = -1;  ///< 1-minute load average (/proc/loadavg via getloadavg); −1 if unknown
  int cores = 0;      ///< online CPUs (sysconf(_SC_NPROCESSORS_ONLN))
  /// True if more threads were runnable, on average over the last minute, than there are
  /// cores: load1 > cores + 0.5. fp4train's own compute threads count in load1, so a run at
  /// one thread per core on an otherwise quiet machine stays just under the bound, and one
  /// other busy process is enough to cross it. False when load1 is unknown.
  bool busy() const { return load1 >= 0 && cores > 0 && load1 > cores + 0.5; }
  /// "load 3.10 on 2 cores".
  std::string describe() const;
};

/// Samples the load now. Never throws; fields stay at their "unknown" values where the
/// system does not say.
MachineLoad machine_load();

}  // namespace fp4
