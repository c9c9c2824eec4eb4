// The FP32 GEMM backend: agrees with a double-precision naive reference and is bit-identical
// for 1 and 2 threads on shapes that exercise tiling and transposes. The BF16 GEMM backend
// (gemm_bf16): within the FP32-summation bound of the double reference on BF16 operands, all
// transposes, overwrite and accumulate, edge shapes; bit-identical for 1, 2 and 3 threads;
// the observed subnormal behaviour; argument errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <random>
#include <set>
#include <vector>

#include "fp4/numerics/bf16.h"
#include "fp4/base/cpu_isa.h"
#include "fp4/gemm/gemm.h"
#include "fp4/gemm/probe_gemm.h"
#include "fp4/numerics/quant_fast.h"
#include "support/cpuinfo.h"

namespace {
std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct Shape { int64_t M, N, K; bool ta, tb; };

TEST(Gemm, MatchesDoubleReferenceAllTransposes) {
  for (Shape s : {Shape{7, 5, 3, false, false}, Shape{130, 513, 33, false, true},
                  Shape{129, 70, 300, true, false}, Shape{33, 600, 17, true, true}}) {
    auto A = randn(s.M * s.K, 1), B = randn(s.K * s.N, 2), C0 = randn(s.M * s.N, 3);
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    auto C = C0, R = C0;
    fp4::sgemm(s.ta, s.tb, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), ldb, 2.f, C.data(), s.N);
    fp4::sgemm_ref(s.ta, s.tb, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), ldb, 2.f, R.data(),
                   s.N);
    for (size_t i = 0; i < C.size(); ++i)
      ASSERT_NEAR(C[i], R[i], 1e-4f * (1.f + std::sqrt(float(s.K))))
          << "M=" << s.M << " N=" << s.N << " K=" << s.K << " i=" << i;
  }
}

TEST(Gemm, HandComputed2x2) {
  const float A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8};
  float C[4] = {};
  fp4::sgemm(false, false, 2, 2, 2, 1.f, A, 2, B, 2, 0.f, C, 2);
  EXPECT_EQ(C[0], 19.f); EXPECT_EQ(C[1], 22.f); EXPECT_EQ(C[2], 43.f); EXPECT_EQ(C[3], 50.f);
}

TEST(Gemm, BitIdenticalForOneAndTwoThreads) {
  // wgrad-like shape: small output, long contraction over tokens.
  for (Shape s : {Shape{256, 256, 4096, true, false}, Shape{1000, 300, 256, false, true}}) {
    auto A = randn(s.M * s.K, 4), B = randn(s.K * s.N, 5);
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    std::vector<float> C1(s.M * s.N), C2(s.M * s.N);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    fp4::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C1.data(), s.N);
    omp_set_num_threads(2);
    fp4::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C2.data(), s.N);
    omp_set_num_threads(saved);
    ASSERT_EQ(0, std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(float)));
  }
}

// ---- BF16 GEMM -------------------------------------------------------------------------

// n random normal values rounded to BF16: bit patterns and their exact FP32 values.
struct Bf16Mat {
  std::vector<uint16_t> bits;
  std::vector<float> vals;
};
Bf16Mat randn_bf16(size_t n, uint32_t seed) {
  Bf16Mat m{std::vector<uint16_t>(n), randn(n, seed)};
  fp4::to_bf16_bits(m.vals.data(), int64_t(n), m.bits.data());
  for (size_t i = 0; i < n; ++i) m.vals[i] = fp4::bf16_value(m.bits[i]);
  return m;
}

struct Bf16Case {
  int64_t M, N, K;
  int64_t pad = 0;  // extra elements on every leading dimension (strided sub-matrices)
};

// Checks gemm_bf16 against sgemm_ref (double sums of the exact BF16 values, rounded once to
// FP32). Each product of two BF16 values is exact in FP32 (8 + 8 significant bits), so the only
// error of gemm_bf16 is its FP32 summation of K products (and the old C with accumulate): at
// most γ_n·S with n = K + 1 additions, γ_n = n·u/(1 − n·u), u = 2^-24, S = Σ_k |a_ik·b_kj|
// (+ |C_old|). The reference's own rounding adds u·|R|.
void check_bf16_against_reference(const Bf16Case& s, bool ta, bool tb, bool acc) {
  const int64_t lda = (ta ? s.M : s.K) + s.pad, ldb = (tb ? s.K : s.N) + s.pad,
                ldc = s.N + s.pad;
  const int64_t rows_a = ta ? s.K : s.M, rows_b = tb ? s.N : s.K;
  auto A = randn_bf16(size_t(rows_a * lda), 11), B = randn_bf16(size_t(rows_b * ldb), 12);
  auto C0 = randn(size_t(s.M * ldc), 13);
  auto C = C0, R = C0;
  fp4::gemm_bf16(ta, tb, s.M, s.N, s.K, A.bits.data(), lda, B.bits.data(), ldb, acc, C.data(),
                 ldc);
  fp4::sgemm_ref(ta, tb, s.M, s.N, s.K, 1.f, A.vals.data(), lda, B.vals.data(), ldb,
                 acc ? 1.f : 0.f, R.data(), ldc);
  const double u = std::ldexp(1.0, -24), n = double(s.K + 1), gamma = n * u / (1 - n * u);
  for (int64_t i = 0; i < s.M; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const int64_t at = i * ldc + j;
      if (j >= s.N) {  // padding columns of C are never written
        ASSERT_EQ(std::memcmp(&C[at], &C0[at], 4), 0) << "wrote C padding at " << i << "," << j;
        continue;
      }
      double S = acc ? std::fabs(double(C0[at])) : 0.0;
      for (int64_t k = 0; k < s.K; ++k) {
        const float a = ta ? A.vals[k * lda + i] : A.vals[i * lda + k];
        const float b = tb ? B.vals[j * ldb + k] : B.vals[k * ldb + j];
        S += std::fabs(double(a) * double(b));
      }
      const double bound = gamma * S + u * std::fabs(double(R[at]));
      ASSERT_LE(std::fabs(double(C[at]) - double(R[at])), bound)
          << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta << " tb=" << tb
          << " acc=" << acc << " pad=" << s.pad << " at (" << i << "," << j << ")";
    }
}

TEST(GemmInfo, DescriptionsNameTheImplementations) {
  EXPECT_NE(fp4::gemm_fp32_description().find("sgemm, ISA "), std::string::npos);
  const std::string d = fp4::gemm_bf16_description();
  if (fp4::gemm_bf16_path() == fp4::Bf16GemmPath::Native)
    EXPECT_EQ(d.rfind("native: ", 0), 0u) << d;
  else if (fp4::gemm_bf16_path() == fp4::Bf16GemmPath::Blocked)  // FP4_BF16_GEMM=blocked
    EXPECT_EQ(d.rfind("blocked: ", 0), 0u) << d;
  else
    EXPECT_EQ(d.rfind("widened: ", 0), 0u) << d;
  if (!fp4::gemm_bf16_native_available()) {
    EXPECT_EQ(fp4::gemm_bf16_path(), fp4::Bf16GemmPath::Widened);
    EXPECT_THROW(fp4::gemm_bf16_set_path(fp4::Bf16GemmPath::Native), std::runtime_error);
  }
}

// The default path follows the CPU (docs/gemm.md "Which path a CPU takes"): Native where oneDNN
// offers it and the CPU has AMX-BF16, or AVX512-BF16 and is AMD's; Widened elsewhere (Intel
// without AMX, where the BF16 matmul ran at 0.6 of sgemm; AVX2-only CPUs). The CPU's features are
// read here from /proc/cpuinfo, independently of gemm.cpp's CPUID and oneDNN queries.
TEST(GemmInfo, DefaultPathFollowsTheCpu) {
  if (const char* e = std::getenv("FP4_BF16_GEMM"); e && *e) GTEST_SKIP() << "FP4_BF16_GEMM set";
  const fp4::test::CpuInfo cpu = fp4::test::read_cpuinfo();
  const std::string& vendor = cpu.vendor;
  const std::set<std::string>& flags = cpu.flags;
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const bool native = fp4::gemm_bf16_native_available();
  // A oneDNN cap that leaves the native matmul but hides AMX or AVX512-BF16 from oneDNN changes
  // the answer in a way /proc/cpuinfo cannot see.
  if (const char* e = std::getenv("ONEDNN_MAX_CPU_ISA"); native && e && *e)
    GTEST_SKIP() << "ONEDNN_MAX_CPU_ISA=" << e;
  const bool fast_bf16 = flags.count("amx_bf16") ||
                         (vendor == "AuthenticAMD" && flags.count("avx512_bf16"));
  EXPECT_EQ(fp4::gemm_bf16_path(),
            native && fast_bf16 ? fp4::Bf16GemmPath::Native : fp4::Bf16GemmPath::Widened)
      << "vendor " << vendor << ", amx_bf16 " << flags.count("amx_bf16") << ", avx512_bf16 "
      << flags.count("avx512_bf16") << ", native available " << native;
  if (native && !fast_bf16) {  // the header says why the native matmul is not used
    EXPECT_NE(fp4::gemm_bf16_description().find("faster here than the native BF16 matmul"),
              std::string::npos)
        << fp4::gemm_bf16_description();
  }
}

// Under the AVX2 variant of the suite (CMakeLists.txt: FP4_MAX_CPU_ISA=AVX2) this process must
// behave as an AVX2-only CPU does, whatever it runs on: oneDNN and fp4train's kernels capped.
TEST(GemmInfo, Avx2CapsAreHonoured) {
  const char* own = std::getenv("FP4_MAX_CPU_ISA");
  if (!own || std::string(own) != "AVX2") GTEST_SKIP() << "not the AVX2 variant";
  EXPECT_FALSE(fp4::gemm_bf16_native_available());
  EXPECT_EQ(fp4::gemm_bf16_path(), fp4::Bf16GemmPath::Widened);
  EXPECT_NE(fp4::gemm_fp32_description().find("ISA avx2"), std::string::npos)
      << fp4::gemm_fp32_description();
  EXPECT_EQ(fp4::max_cpu_isa(), fp4::CpuIsa::Avx2);
  for (const std::string& t : fp4::quant_fast_targets()) EXPECT_NE(t, "AVX3");
  EXPECT_NE(fp4::quant_fast_target(), "AVX3");
  EXPECT_FALSE(fp4::probe_gemm_avx512_available());
}

// Every GemmBf16 test runs on both paths of gemm_bf16 (fp4/gemm/gemm.h): Native where oneDNN offers
// a BF16 matmul on this CPU (skipped elsewhere, e.g. on AVX2-only CPUs), Widened everywhere.
class GemmBf16 : public ::testing::TestWithParam<fp4::Bf16GemmPath> {
 protected:
  void SetUp() override {
    saved_ = fp4::gemm_bf16_path();
    if (GetParam() == fp4::Bf16GemmPath::Native && !fp4::gemm_bf16_native_available())
      GTEST_SKIP() << "oneDNN offers no native BF16 matmul on this CPU: " << fp4::gemm_fp32_description();
    if (GetParam() == fp4::Bf16GemmPath::Blocked && !fp4::gemm_bf16_blocked_available())
      GTEST_SKIP() << "oneDNN offers no brgemm BF16 matmul on this CPU: "
                   << fp4::gemm_fp32_description();
    fp4::gemm_bf16_set_path(GetParam());
  }
  void TearDown() override { fp4::gemm_bf16_set_path(saved_); }
  fp4::Bf16GemmPath saved_ = fp4::Bf16GemmPath::Widened;
};
INSTANTIATE_TEST_SUITE_P(Paths, GemmBf16,
                         ::testing::Values(fp4::Bf16GemmPath::Native, fp4::Bf16GemmPath::Widened,
                                           fp4::Bf16GemmPath::Blocked),
                         [](const auto& info) {
                           return info.param == fp4::Bf16GemmPath::Native    ? "Native"
                                  : info.param == fp4::Bf16GemmPath::Blocked ? "Blocked"
                                                                             : "Widened";
                         });

TEST_P(GemmBf16, WithinSummationBoundOfDoubleReference) {
  // 1030 × 2050: 25 tiles of 256 × 512 (ragged both ways); the others are small outputs, cut
  // into 128 × 256 tiles on the native and blocked paths
  const Bf16Case cases[] = {{1, 1, 1},      {7, 5, 3},          {1, 600, 1},
                            {300, 1, 70},   {257, 513, 33},     {300, 70, 1},
                            {33, 29, 4099}, {130, 515, 257, 3}, {1030, 2050, 17}};
  for (const Bf16Case& s : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool acc : {false, true}) check_bf16_against_reference(s, ta, tb, acc);
}

TEST_P(GemmBf16, HandComputedExact) {
  // Small integers: every product and sum is exact, so the result is exact in any order.
  const float a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10, 11, 12};  // A [2,3], B [3,2]
  uint16_t A[6], B[6];
  fp4::to_bf16_bits(a, 6, A);
  fp4::to_bf16_bits(b, 6, B);
  float C[4] = {1, 1, 1, 1};
  fp4::gemm_bf16(false, false, 2, 2, 3, A, 3, B, 2, false, C, 2);
  EXPECT_EQ(C[0], 58.f); EXPECT_EQ(C[1], 64.f); EXPECT_EQ(C[2], 139.f); EXPECT_EQ(C[3], 154.f);
  fp4::gemm_bf16(false, false, 2, 2, 3, A, 3, B, 2, true, C, 2);  // accumulate: doubles
  EXPECT_EQ(C[0], 116.f); EXPECT_EQ(C[3], 308.f);
  // Aᵀ·Bᵀ of the same storage: A read as [3,2] transposed, B as [2,3] transposed.
  fp4::gemm_bf16(true, true, 2, 2, 3, A, 2, B, 3, false, C, 2);
  // op(A) = [[1,3,5],[2,4,6]], op(B) = [[7,10],[8,11],[9,12]]
  EXPECT_EQ(C[0], 76.f); EXPECT_EQ(C[1], 103.f); EXPECT_EQ(C[2], 100.f); EXPECT_EQ(C[3], 136.f);
}

TEST_P(GemmBf16, ZeroKOverwritesOrKeeps) {
  float C[6] = {1, 2, 3, 4, 5, 6};
  fp4::gemm_bf16(false, false, 2, 2, 0, nullptr, 0, nullptr, 2, true, C, 3);
  EXPECT_EQ(C[0], 1.f); EXPECT_EQ(C[4], 5.f);
  fp4::gemm_bf16(false, false, 2, 2, 0, nullptr, 0, nullptr, 2, false, C, 3);
  EXPECT_EQ(C[0], 0.f); EXPECT_EQ(C[1], 0.f); EXPECT_EQ(C[2], 3.f); EXPECT_EQ(C[4], 0.f);
  fp4::gemm_bf16(false, false, 0, 5, 7, nullptr, 7, nullptr, 5, false, nullptr, 5);  // M = 0
}

TEST_P(GemmBf16, RejectsBadArguments) {
  uint16_t A[4] = {}, B[4] = {};
  float C[4] = {};
  EXPECT_THROW(fp4::gemm_bf16(false, false, 2, 2, -1, A, 2, B, 2, false, C, 2),
               std::invalid_argument);
  EXPECT_THROW(fp4::gemm_bf16(false, false, 2, 2, 2, A, 1, B, 2, false, C, 2),
               std::invalid_argument);  // lda < K
  EXPECT_THROW(fp4::gemm_bf16(true, false, 2, 2, 2, A, 2, B, 1, false, C, 2),
               std::invalid_argument);  // ldb < N
  EXPECT_THROW(fp4::gemm_bf16(false, false, 2, 2, 2, A, 2, B, 2, false, C, 1),
               std::invalid_argument);  // ldc < N
  EXPECT_THROW(fp4::gemm_bf16(false, false, 2, 2, 2, nullptr, 2, B, 2, false, C, 2),
               std::invalid_argument);
}

TEST_P(GemmBf16, BitIdenticalForOneTwoAndThreeThreads) {
  // Ragged in M and N against the 128 × 256 tiles of small outputs; large K (wgrad-like: long
  // contraction and a small output, where a multi-threaded GEMM would split K across threads);
  // 1100 × 2100 is cut into 256 × 512 tiles (25 of them, ragged both ways).
  const Bf16Case cases[] = {{600, 1100, 4096}, {200, 300, 8192}, {37, 45, 4096}, {1100, 2100, 300}};
  for (const Bf16Case& s : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        if (s.M >= 600 && ta != tb) continue;  // keep the run short: two layouts at big shapes
        const int64_t lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
        auto A = randn_bf16(size_t(s.M * s.K), 21), B = randn_bf16(size_t(s.K * s.N), 22);
        const auto C0 = randn(size_t(s.M * s.N), 23);
        std::vector<float> out[3];
        const int saved = omp_get_max_threads();
        for (int t = 1; t <= 3; ++t) {
          omp_set_num_threads(t);
          out[t - 1] = C0;
          fp4::gemm_bf16(ta, tb, s.M, s.N, s.K, A.bits.data(), lda, B.bits.data(), ldb, true,
                         out[t - 1].data(), s.N);
        }
        omp_set_num_threads(saved);
        for (int t = 2; t <= 3; ++t)
          ASSERT_EQ(0, std::memcmp(out[0].data(), out[t - 1].data(), out[0].size() * 4))
              << t << " threads, M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta
              << " tb=" << tb;
      }
}

// Observed on AVX512_BF16 / AMX hardware with oneDNN 2.6's "gemm:jit" BF16 GEMM (the
// implementation gemm_bf16 pins), and documented in docs/gemm.md: BF16 subnormal inputs are
// read as zero, and products or dot-product sums below 2^-126 are flushed to zero (the
// semantics of VDPBF16PS); the old C of an accumulating call is added with an ordinary FP32
// add, so a subnormal C survives. Other CPUs or oneDNN versions may differ: the expectations
// below are checked only where the pinned implementation is in use. The widened path is plain
// IEEE FP32 arithmetic on exact values, so there every result below is the exact one.
TEST_P(GemmBf16, SubnormalBehaviourAsDocumented) {
  const std::string impl = fp4::gemm_bf16_impl(false, false, 1, 1, 1, 1, 1, 1, false);
  auto one = [](float a, float b, float c0, bool acc) {
    const uint16_t A = fp4::bf16_bits(a), B = fp4::bf16_bits(b);
    EXPECT_EQ(fp4::bf16_value(A), a);  // the test values are exact in BF16
    EXPECT_EQ(fp4::bf16_value(B), b);
    float C = c0;
    fp4::gemm_bf16(false, false, 1, 1, 1, &A, 1, &B, 1, acc, &C, 1);
    return C;
  };
  if (GetParam() == fp4::Bf16GemmPath::Widened) {
    // IEEE FP32 arithmetic on the widened values: subnormal inputs, products and sums kept.
    EXPECT_EQ(impl, "widened:sgemm");
    EXPECT_EQ(one(0x1p-130f, 1.f, 0.f, false), 0x1p-130f);
    EXPECT_EQ(one(1.f, 0x1p-130f, 0.f, false), 0x1p-130f);
    EXPECT_EQ(one(0x1p-127f, 4.f, 0.f, false), 0x1p-125f);
    EXPECT_EQ(one(0x1p-64f, 0x1p-63f, 0.f, false), 0x1p-127f);
    EXPECT_EQ(one(0x1p-64f, 0x1p-63f, 0x1p-126f, true), 0x1p-126f + 0x1p-127f);
    EXPECT_EQ(one(0.f, 0.f, 0x1p-130f, true), 0x1p-130f);
    EXPECT_EQ(one(0x1p-60f, 0x1p-60f, 0.f, false), 0x1p-120f);
    return;
  }
  // brgemm without AMX (the blocked path on an AVX512_BF16 CPU) uses the same instruction and
  // was observed to behave the same; other implementations (AMX tiles) are not pinned
  if (impl != "gemm:jit" && impl != "brg:avx512_core_bf16")
    GTEST_SKIP() << "implementation " << impl << ", behaviour not pinned";
  EXPECT_EQ(one(0x1p-130f, 1.f, 0.f, false), 0.f);    // subnormal input (exact: 2^-130)
  EXPECT_EQ(one(1.f, 0x1p-130f, 0.f, false), 0.f);
  EXPECT_EQ(one(0x1p-127f, 4.f, 0.f, false), 0.f);    // subnormal input, normal product 2^-125
  EXPECT_EQ(one(0x1p-63f, 0x1p-63f, 0.f, false), 0x1p-126f);  // smallest normal: kept
  EXPECT_EQ(one(0x1p-64f, 0x1p-63f, 0.f, false), 0.f);        // subnormal product 2^-127
  EXPECT_EQ(one(0x1p-64f, 0x1p-63f, 0x1p-126f, true), 0x1p-126f);  // flushed before the add
  EXPECT_EQ(one(0.f, 0.f, 0x1p-130f, true), 0x1p-130f);       // subnormal old C kept
  // Normal-range inputs and results are not affected:
  EXPECT_EQ(one(0x1p-60f, 0x1p-60f, 0.f, false), 0x1p-120f);
}

}  // namespace

// detail::transpose_bf16 (SSE2 8 × 8 blocks) against the definition dst[j·ldd + i] = src[i·lds +
// j] and against its scalar twin, bit for bit: random 16-bit patterns (NaN and subnormal BF16
// patterns included: it copies bits), ragged shapes around the 8 × 8 kernel and the 16 × 16
// blocks, padded leading dimensions, strides of 4 KiB multiples, and an empty matrix. The
// destination's padding (columns ≥ rows of each row of dst) must keep its sentinel.
TEST(TransposeBf16, MatchesDefinitionAndScalarTwin) {
  struct Case {
    int64_t rows, cols, lds_pad, ldd_pad;
  };
  const Case cases[] = {{0, 0, 0, 0},
                        {1, 1, 0, 0},
                        {8, 8, 0, 0},
                        {7, 9, 3, 1},
                        {9, 7, 0, 5},
                        {16, 16, 0, 0},
                        {17, 33, 1, 2},
                        {33, 17, 7, 0},
                        {64, 24, 0, 0},
                        {4099, 131, 1027 - 131, 3},
                        {2048, 128, 256 - 128, 0},
                        {256, 64, 1984, 1792},
                        {5, 300, 0, 11}};
  std::mt19937 g(7);
  for (const Case& c : cases) {
    const int64_t lds = c.cols + c.lds_pad, ldd = c.rows + c.ldd_pad;
    std::vector<uint16_t> src(static_cast<size_t>(std::max<int64_t>(c.rows * lds, 1)));
    for (auto& v : src) v = static_cast<uint16_t>(g());
    const uint16_t kSentinel = 0xA5A5;
    const size_t n_dst = static_cast<size_t>(std::max<int64_t>(c.cols * ldd, 1));
    std::vector<uint16_t> fast(n_dst, kSentinel), ref(n_dst, kSentinel);
    fp4::detail::transpose_bf16(src.data(), lds, c.rows, c.cols, fast.data(), ldd);
    fp4::detail::transpose_bf16_ref(src.data(), lds, c.rows, c.cols, ref.data(), ldd);
    const std::string at = "rows " + std::to_string(c.rows) + ", cols " + std::to_string(c.cols) +
                           ", lds " + std::to_string(lds) + ", ldd " + std::to_string(ldd);
    int64_t bad = 0;
    for (int64_t j = 0; j < c.cols; ++j)
      for (int64_t i = 0; i < ldd; ++i) {
        const uint16_t want = i < c.rows ? src[static_cast<size_t>(i * lds + j)] : kSentinel;
        const size_t o = static_cast<size_t>(j * ldd + i);
        bad += fast[o] != want;
        bad += ref[o] != want;
      }
    EXPECT_EQ(bad, 0) << at;
    EXPECT_EQ(0, std::memcmp(fast.data(), ref.data(), n_dst * sizeof(uint16_t))) << at;
  }
}

// detail::pack_bf16_vnni (SSE2) against its scalar twin, bit for bit, and the twin against the
// layout's definition written out here (element (k, n) of op(B) at (n/nb)·Kpad·nb + (k/32)·32·nb +
// ((k%32)/2)·2·nb + (n%nb)·2 + k%2, zero outside [K, N]): plain and transposed op(B), K and N
// ragged against the 32-row blocks, the 8- and 4-column vectors and the column blocks, padded
// leading dimensions, each 32-row range packed on its own (as the blocked path's threads do) or
// all at once. The destination starts as a sentinel: every element of the padded panel must be
// written.
TEST(PackBf16Vnni, MatchesLayoutDefinitionAndScalarTwin) {
  struct Case {
    int64_t K, N, nblk, pad;
  };
  const Case cases[] = {
      {32, 64, 64, 0},  {64, 256, 64, 0}, {4096, 256, 64, 0}, {1000, 100, 64, 3}, {33, 9, 64, 0},
      {31, 7, 16, 1},   {96, 40, 32, 5},  {1, 1, 64, 0},      {4099, 45, 64, 2},  {256, 512, 64, 0},
      {70, 130, 16, 0}, {96, 100, 48, 1}, {4099, 45, 48, 2}};
  std::mt19937 g(11);
  for (const Case& c : cases)
    for (bool trans : {false, true})
      for (bool pieces : {false, true}) {
        const int64_t Kpad = (c.K + 31) / 32 * 32, Npad = (c.N + c.nblk - 1) / c.nblk * c.nblk;
        const int64_t rows = trans ? c.N : c.K, ldb = (trans ? c.K : c.N) + c.pad;
        std::vector<uint16_t> B(static_cast<size_t>(rows * ldb));
        for (auto& v : B) v = static_cast<uint16_t>(g());
        const size_t n_dst = static_cast<size_t>(Kpad * Npad);
        std::vector<uint16_t> fast(n_dst, 0xA5A5), ref(n_dst, 0xA5A5);
        if (pieces) {
          for (int64_t k0 = Kpad - 32; k0 >= 0; k0 -= 32)  // backwards: no piece relies on another
            fp4::detail::pack_bf16_vnni(B.data(), ldb, trans, c.K, c.N, c.nblk, k0, k0 + 32,
                                        fast.data());
        } else {
          fp4::detail::pack_bf16_vnni(B.data(), ldb, trans, c.K, c.N, c.nblk, 0, Kpad, fast.data());
        }
        fp4::detail::pack_bf16_vnni_ref(B.data(), ldb, trans, c.K, c.N, c.nblk, 0, Kpad,
                                        ref.data());
        int64_t bad = 0;
        for (int64_t k = 0; k < Kpad; ++k)
          for (int64_t n = 0; n < Npad; ++n) {
            const int64_t o = (n / c.nblk) * Kpad * c.nblk + (k / 32) * 32 * c.nblk +
                              (k % 32) / 2 * 2 * c.nblk + (n % c.nblk) * 2 + k % 2;
            const uint16_t want = k < c.K && n < c.N
                                      ? B[static_cast<size_t>(trans ? n * ldb + k : k * ldb + n)]
                                      : 0;
            bad += ref[static_cast<size_t>(o)] != want;
          }
        const std::string at = "K " + std::to_string(c.K) + ", N " + std::to_string(c.N) +
                               ", nblk " + std::to_string(c.nblk) + ", ldb " + std::to_string(ldb) +
                               (trans ? ", transposed" : "") + (pieces ? ", in pieces" : "");
        EXPECT_EQ(bad, 0) << at;
        EXPECT_EQ(0, std::memcmp(fast.data(), ref.data(), n_dst * sizeof(uint16_t))) << at;
      }
}

// Puts gemm_bf16 on the blocked path for a test's scope, and restores the path and the packer
// switch however the test leaves (an ASSERT returns early).
struct BlockedPathScope {
  fp4::Bf16GemmPath saved = fp4::gemm_bf16_path();
  BlockedPathScope() { fp4::gemm_bf16_set_path(fp4::Bf16GemmPath::Blocked); }
  ~BlockedPathScope() {
    fp4::detail::set_bf16_blocked_own_pack(true);
    fp4::detail::set_bf16_blocked_nblk(64);
    fp4::gemm_bf16_set_path(saved);
  }
};

// The blocked path's panels packed by pack_bf16_vnni give the same bits as the same GEMM with
// the panels reordered by oneDNN (an independent writer of its own layout): all four transposes,
// ragged K (not a multiple of 32) and N (not a multiple of the column block), several panels and
// rows of tiles, accumulate on. A case whose panels were not all packed by pack_bf16_vnni (where
// oneDNN's layout is not one it writes: bf16_blocked_reorders moved) compares nothing and is
// left out; the test skips if that leaves none (it leaves all of them on AVX512-BF16 CPUs).
TEST(GemmBf16Blocked, OwnPackingMatchesOneDnnReorder) {
  if (!fp4::gemm_bf16_blocked_available()) GTEST_SKIP() << "oneDNN offers no brgemm BF16 matmul";
  BlockedPathScope blocked;
  const Bf16Case cases[] = {{256, 256, 4096}, {300, 1100, 1000}, {37, 45, 4099}, {129, 600, 33}};
  int compared = 0;
  for (const Bf16Case& s : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
        auto A = randn_bf16(size_t(s.M * s.K), 31), B = randn_bf16(size_t(s.K * s.N), 32);
        const auto C0 = randn(size_t(s.M * s.N), 33);
        std::vector<float> own = C0, theirs = C0;
        const int64_t reorders = fp4::detail::bf16_blocked_reorders();
        fp4::gemm_bf16(ta, tb, s.M, s.N, s.K, A.bits.data(), lda, B.bits.data(), ldb, true,
                       own.data(), s.N);
        if (fp4::detail::bf16_blocked_reorders() != reorders) continue;  // not all packed by us
        ++compared;
        fp4::detail::set_bf16_blocked_own_pack(false);
        fp4::gemm_bf16(ta, tb, s.M, s.N, s.K, A.bits.data(), lda, B.bits.data(), ldb, true,
                       theirs.data(), s.N);
        fp4::detail::set_bf16_blocked_own_pack(true);
        EXPECT_GT(fp4::detail::bf16_blocked_reorders(), reorders);  // oneDNN wrote the panels
        ASSERT_EQ(0, std::memcmp(own.data(), theirs.data(), own.size() * sizeof(float)))
            << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta << " tb=" << tb;
      }
  if (compared == 0)
    GTEST_SKIP() << "oneDNN's weight layouts here are not ones pack_bf16_vnni writes";
}

// Whatever column block the blocked path asks oneDNN for (detail::set_bf16_blocked_nblk: 16, 32
// or 48, as oneDNN 2.6's AMX heuristic may pick for a small tile, or 0, oneDNN's own choice), the
// GEMM gives the bits of the default 64: brgemm sums each element over K in one order whatever
// the column block, every panel is packed by pack_bf16_vnni in that layout (no oneDNN reorder),
// and the ragged last row of tiles takes the first row's layout (were the rows' layouts to
// differ, the path would throw). Last rows of tiles of 44, 1, 64 and 92 rows, panels of 200, 64,
// 48, 600 and 1100 columns, all four transposes, accumulate on.
TEST(GemmBf16Blocked, EveryColumnBlockGivesTheSameBits) {
  if (!fp4::gemm_bf16_blocked_available()) GTEST_SKIP() << "oneDNN offers no brgemm BF16 matmul";
  BlockedPathScope blocked;
  const Bf16Case cases[] = {
      {300, 200, 1000}, {257, 64, 100}, {320, 48, 77}, {37, 600, 130}, {428, 1100, 64}};
  for (const Bf16Case& s : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
        auto A = randn_bf16(size_t(s.M * s.K), 51), B = randn_bf16(size_t(s.K * s.N), 52);
        const auto C0 = randn(size_t(s.M * s.N), 53);
        std::vector<float> want = C0;
        fp4::detail::set_bf16_blocked_nblk(64);
        fp4::gemm_bf16(ta, tb, s.M, s.N, s.K, A.bits.data(), lda, B.bits.data(), ldb, true,
                       want.data(), s.N);
        for (int64_t nblk : {0, 16, 32, 48}) {
          fp4::detail::set_bf16_blocked_nblk(nblk);
          std::vector<float> got = C0;
          const int64_t reorders = fp4::detail::bf16_blocked_reorders();
          fp4::gemm_bf16(ta, tb, s.M, s.N, s.K, A.bits.data(), lda, B.bits.data(), ldb, true,
                         got.data(), s.N);
          const std::string at = "M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                                 " K=" + std::to_string(s.K) + " ta=" + std::to_string(ta) +
                                 " tb=" + std::to_string(tb) + " nblk=" + std::to_string(nblk);
          if (nblk > 0) {
            EXPECT_EQ(fp4::detail::bf16_blocked_reorders(), reorders) << at;
          }
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float))) << at;
        }
      }
  EXPECT_THROW(fp4::detail::set_bf16_blocked_nblk(40), std::invalid_argument);
}

// On the blocked path, accumulating adds the product to the old C with one FP32 addition per
// element: C_old + P gives the bits of gemm_bf16(accumulate), where P is the same call's product
// written with accumulate off. This covers the tiles written in place by brgemm's sum post-op
// (outputs one tile wide with ldc == N: 256 × 256, 300 × 200; 4096 × 768 and 4096 × 1100, cut
// into whole-row tiles) and those added from a per-thread copy (ldc > N: 4096 × 256 with
// padding; several columns of tiles: 300 × 1100 and 600 × 4200, too wide for whole-row tiles
// of at least 32 rows within the caller's tile area).
// (The native and widened paths do not promise this: oneDNN's gemm:jit and sgemm fold C_old in
// once per block of K, so for K beyond a block their sums differ from C_old + P, within the
// summation bound.)
TEST(GemmBf16Blocked, AccumulateIsOneAdditionOfTheProduct) {
  if (!fp4::gemm_bf16_blocked_available()) GTEST_SKIP() << "oneDNN offers no brgemm BF16 matmul";
  BlockedPathScope blocked;
  const Bf16Case cases[] = {{256, 256, 4096},     {300, 200, 1000},  {4096, 768, 256},
                            {4096, 256, 1024, 3}, {300, 1100, 1000}, {4096, 1100, 64},
                            {600, 4200, 40},      {37, 45, 99}};
  for (const Bf16Case& s : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t lda = (ta ? s.M : s.K) + s.pad, ldb = (tb ? s.K : s.N) + s.pad,
                      ldc = s.N + s.pad;
        auto A = randn_bf16(size_t((ta ? s.K : s.M) * lda), 41);
        auto B = randn_bf16(size_t((tb ? s.N : s.K) * ldb), 42);
        const auto C0 = randn(size_t(s.M * ldc), 43);
        std::vector<float> acc = C0, P(C0.size(), 0.f);
        fp4::gemm_bf16(ta, tb, s.M, s.N, s.K, A.bits.data(), lda, B.bits.data(), ldb, true,
                       acc.data(), ldc);
        fp4::gemm_bf16(ta, tb, s.M, s.N, s.K, A.bits.data(), lda, B.bits.data(), ldb, false,
                       P.data(), ldc);
        int64_t bad = 0;
        for (int64_t i = 0; i < s.M; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const size_t o = size_t(i * ldc + j);
            const float want = j < s.N ? C0[o] + P[o] : C0[o];  // padding untouched
            bad += std::memcmp(&want, &acc[o], sizeof(float)) != 0;
          }
        EXPECT_EQ(bad, 0) << "M=" << s.M << " N=" << s.N << " K=" << s.K << " pad=" << s.pad
                          << " ta=" << ta << " tb=" << tb;
      }
}
