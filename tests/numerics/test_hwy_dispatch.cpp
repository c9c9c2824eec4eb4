// The shared dispatch of the Highway kernels (include/fp4/numerics/hwy_dispatch.h): which
// targets a process may run, checked against the CPU flags of /proc/cpuinfo (an independent
// reading of the same features) and the FP4_MAX_CPU_ISA cap; the Table's order and lookup on
// hand-made entries; and quant_fast's target list, which is the Table's runnable list.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "fp4/base/cpu_isa.h"
#include "fp4/numerics/hwy_dispatch.h"
#include "fp4/numerics/quant_fast.h"
#include "support/cpuinfo.h"

namespace {
using fp4::hwy_dispatch::Target;

std::set<std::string> cpu_flags() { return fp4::test::read_cpuinfo().flags; }

bool has_all(const std::set<std::string>& f, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (!f.count(n)) return false;
  return true;
}

TEST(HwyDispatch, RunnableMatchesProcCpuinfoAndTheCap) {
  const std::set<std::string> f = cpu_flags();
  if (f.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  // Linux's flag names for the features of Highway's targets (pni = SSE3 is not needed).
  const bool ssse3 = has_all(f, {"ssse3"});
  const bool sse4 = ssse3 && has_all(f, {"sse4_1", "sse4_2", "pclmulqdq", "aes"});
  const bool avx2 = sse4 && has_all(f, {"avx2", "fma", "bmi1", "bmi2", "f16c"});
  const bool avx3 = avx2 && has_all(f, {"avx512f", "avx512vl", "avx512dq", "avx512bw"});
  using fp4::CpuIsa;
  EXPECT_EQ(fp4::hwy_dispatch::runnable(Target::Ssse3), ssse3 && fp4::cpu_isa_allowed(CpuIsa::Ssse3));
  EXPECT_EQ(fp4::hwy_dispatch::runnable(Target::Sse4), sse4 && fp4::cpu_isa_allowed(CpuIsa::Sse4));
  EXPECT_EQ(fp4::hwy_dispatch::runnable(Target::Avx2), avx2 && fp4::cpu_isa_allowed(CpuIsa::Avx2));
  EXPECT_EQ(fp4::hwy_dispatch::runnable(Target::Avx3), avx3 && fp4::cpu_isa_allowed(CpuIsa::Avx512));
  EXPECT_TRUE(fp4::hwy_dispatch::runnable(Target::Scalar));
  EXPECT_TRUE(fp4::hwy_dispatch::runnable(Target::Emu128));
}

TEST(HwyDispatch, TableKeepsOrderAndFindsByName) {
  using T = fp4::hwy_dispatch::Table<int>;
  const T t({{Target::Avx3, 1}, {Target::Avx2, 2}, {Target::Sse4, 3}, {Target::Scalar, 4}});
  std::vector<int> want;
  for (auto [tg, k] : std::vector<std::pair<Target, int>>{
           {Target::Avx3, 1}, {Target::Avx2, 2}, {Target::Sse4, 3}, {Target::Scalar, 4}})
    if (fp4::hwy_dispatch::runnable(tg)) want.push_back(k);
  EXPECT_EQ(t.runnable(), want);  // best first, SCALAR last
  ASSERT_FALSE(t.runnable().empty());
  EXPECT_EQ(t.runnable().back(), 4);
  ASSERT_NE(t.find("AVX2"), nullptr);
  EXPECT_EQ(*t.find("AVX2"), 2);  // compiled, whether or not this CPU runs it
  EXPECT_EQ(t.find("SSSE3"), nullptr);  // not in this table
  EXPECT_EQ(t.find("avx2"), nullptr);   // names are Highway's, exactly
  EXPECT_STREQ(fp4::hwy_dispatch::target_name(Target::Avx3), "AVX3");
  EXPECT_STREQ(fp4::hwy_dispatch::target_name(Target::Scalar), "SCALAR");
}

// quant_fast_targets() is the shared Table's runnable list: every name it gives is runnable
// here, best first in Highway's order, and ends with SCALAR.
TEST(HwyDispatch, QuantFastTargetsAreTheRunnableCompiledOnes) {
  const std::vector<std::string> names = fp4::quant_fast_targets();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.back(), "SCALAR");
  const std::vector<Target> order = {Target::Avx3, Target::Avx2, Target::Sse4,
                                     Target::Ssse3, Target::Emu128, Target::Scalar};
  size_t pos = 0;
  for (const std::string& n : names) {
    while (pos < order.size() && n != fp4::hwy_dispatch::target_name(order[pos])) ++pos;
    ASSERT_LT(pos, order.size()) << n << " out of Highway's order";
    EXPECT_TRUE(fp4::hwy_dispatch::runnable(order[pos])) << n;
  }
  EXPECT_EQ(fp4::quant_fast_target(), names.front());
}
}  // namespace
