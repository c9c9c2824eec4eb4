// The CPU's vendor and feature flags as Linux reports them in /proc/cpuinfo (first processor):
// tests compare fp4train's CPUID and oneDNN queries against this independent reading.
#pragma once
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace fp4::test {

struct CpuInfo {
  std::string vendor;           // vendor_id, e.g. "GenuineIntel", "AuthenticAMD"
  std::set<std::string> flags;  // the "flags" line's words; empty where /proc/cpuinfo is absent
};

inline CpuInfo read_cpuinfo() {
  std::ifstream f("/proc/cpuinfo");
  CpuInfo info;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("vendor_id", 0) == 0) info.vendor = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0) {
      std::istringstream in(line.substr(line.find(':') + 1));
      for (std::string w; in >> w;) info.flags.insert(w);
      break;
    }
  }
  return info;
}

}  // namespace fp4::test
