// MPI check of fp4/dist/dist.h, run by tests/cli/mpi_dist.sh under mpirun with P = 1, 2, 3, 4
// processes. Usage: dist_check OUT_FILE N1 [N2 ...]
//
// For each number of micro-batches n (those divisible by P) and a few vector lengths, every
// micro-batch's "gradient" comes from a generator seeded by the micro-batch index alone (so
// the data do not depend on P); each rank sums the leaves of its tree nodes with a recursive
// reference written here, reduce_mean combines them, and every rank compares the result bit
// for bit with the single-process tree sum / n it computes itself. Rank 0 writes one line per
// (n, len): "n len fnv1a-of-the-result-bytes", which the script compares across P. Also checks
// reduce_mean of node sums streamed through a TreeAccumulator, bcast_from_rank0,
// max_over_ranks (float, double arrays, NaN, ±0), allgather, bcast_string, barrier and
// reduce_mean's argument checks. Exit status 0 iff every check passed on every rank.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/dist/dist.h"

namespace dist = fp4::dist;

namespace {
int g_fail = 0;

void fail(const std::string& what) {
  std::fprintf(stderr, "dist_check: rank %d of %d: FAIL %s\n", dist::rank(), dist::size(), what.c_str());
  ++g_fail;
}

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Micro-batch j's gradient of length len: adversarial magnitudes (1e8, 1, 1e-3, signs mixed)
// so that the order of FP32 additions shows in the result.
std::vector<float> leaf(int j, int64_t len) {
  uint64_t s = 0xC0FFEEull * 1315423911ull + uint64_t(j) * 7919ull + uint64_t(len);
  const float mags[] = {1e8f, 1.0f, -1e8f, 1e-3f, -1.0f, 3.7e7f, -2.5e-3f, 12345.678f};
  std::vector<float> v(static_cast<size_t>(len));
  for (float& x : v) {
    const uint64_t r = splitmix64(s);
    x = mags[r & 7] * (0.5f + float((r >> 8) & 0xFFFF) / 65536.0f);
  }
  return v;
}

// Tree sum over micro-batches [lo, hi) from the definition (mid = lo + (hi - lo) / 2, left first).
std::vector<float> ref_sum(int lo, int hi, int64_t len) {
  if (hi - lo == 1) return leaf(lo, len);
  const int mid = lo + (hi - lo) / 2;
  const std::vector<float> a = ref_sum(lo, mid, len), b = ref_sum(mid, hi, len);
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

template <class F>
bool throws_invalid(F f) {
  try {
    f();
  } catch (const std::invalid_argument&) {
    return true;
  }
  return false;
}

void check_collectives() {
  const int P = dist::size(), r = dist::rank();
  if (float v = dist::bcast_from_rank0(float(r) + 0.5f); v != 0.5f) fail("bcast_from_rank0 " + std::to_string(v));
  const float want_max = float(P - 1) * 1.5f - 2.0f;
  if (float v = dist::max_over_ranks(float(r) * 1.5f - 2.0f); v != want_max) fail("max_over_ranks(float)");
  if (!std::isnan(dist::max_over_ranks(r == P - 1 ? NAN : 1.0f))) fail("max_over_ranks(float) with a NaN");
  // -0 on every rank but the last, +0 there: +0 everywhere, whatever the order.
  if (float z = dist::max_over_ranks(r == P - 1 ? 0.0f : -0.0f); std::signbit(z))
    fail("max_over_ranks(+-0)");

  const int64_t n = 1000;
  std::vector<double> v(static_cast<size_t>(n)), want(static_cast<size_t>(n), -INFINITY);
  for (int q = 0; q < P; ++q)
    for (int64_t i = 0; i < n; ++i) {
      const double x = std::sin(double(i) * double(q + 1)) * 1e3 + double(q);
      if (q == r) v[size_t(i)] = x;
      want[size_t(i)] = std::max(want[size_t(i)], x);
    }
  dist::max_over_ranks(v.data(), n);
  if (std::memcmp(v.data(), want.data(), size_t(n) * sizeof(double)) != 0) fail("max_over_ranks(double*)");

  const int64_t m = 5;
  std::vector<double> mine(static_cast<size_t>(m)), all(size_t(m * P), -1.0);
  for (int64_t i = 0; i < m; ++i) mine[size_t(i)] = r * 100.0 + double(i);
  dist::allgather(mine.data(), m, all.data());
  for (int q = 0; q < P; ++q)
    for (int64_t i = 0; i < m; ++i)
      if (all[size_t(q * m + i)] != q * 100.0 + double(i)) fail("allgather");

  std::string root(70001, '\0');
  for (size_t i = 0; i < root.size(); ++i) root[i] = char((i * 31) % 251);  // zero bytes included
  std::string s = r == 0 ? root : std::string("rank ") + std::to_string(r);
  dist::bcast_string(s);
  if (s != root) fail("bcast_string (length " + std::to_string(s.size()) + ")");
  std::string empty = r == 0 ? std::string() : std::string("xyz");
  dist::bcast_string(empty);
  if (!empty.empty()) fail("bcast_string of an empty string");
  dist::barrier();

  // Argument checks: the same on every rank, so every rank throws before communicating.
  std::vector<float> buf(8, 1.0f), out(8);
  if (P > 1 && !throws_invalid([&] { dist::reduce_mean(P + 1, {buf.data()}, 8, out.data()); }))
    fail("reduce_mean accepted n % size() != 0");
  if (!throws_invalid([&] {
        std::vector<const float*> too_many(8, buf.data());
        dist::reduce_mean(4 * P, too_many, 8, out.data());
      }))
    fail("reduce_mean accepted the wrong count of node sums");
}
}  // namespace

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: dist_check OUT_FILE N1 [N2 ...]\n");
    dist::finalize();
    return 2;
  }
  const int P = dist::size(), r = dist::rank();
  if (!dist::built_with_mpi()) fail("built_with_mpi() is false in the MPI check program");
  if (P > 1 && !dist::launched_by_mpi()) fail("launched_by_mpi() is false with several processes");
  check_collectives();

  std::string lines;
  for (int a = 2; a < argc; ++a) {
    const int n = std::atoi(argv[a]);
    if (n < 1 || n % P) continue;
    for (int64_t len : {int64_t(1), int64_t(3), int64_t(1003), int64_t(20000 + 7)}) {
      const std::vector<dist::TreeNode> nodes = dist::tree_nodes(n, r * (n / P), (r + 1) * (n / P));
      std::vector<std::vector<float>> sums;
      for (const auto& t : nodes) sums.push_back(ref_sum(t.lo, t.hi, len));
      std::vector<const float*> ptrs;
      for (const auto& s : sums) ptrs.push_back(s.data());
      std::vector<float> out(static_cast<size_t>(len), -1.0f);
      dist::reduce_mean(n, ptrs, len, out.data());
      const std::vector<float> sum = ref_sum(0, n, len);
      std::vector<float> want(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) want[size_t(i)] = sum[size_t(i)] / float(n);
      const std::string tag = "n=" + std::to_string(n) + " len=" + std::to_string(len);
      if (std::memcmp(out.data(), want.data(), size_t(len) * sizeof(float)) != 0)
        fail("reduce_mean differs from the single-process tree sum / n, " + tag);
      // out aliasing mine[0]: the same bytes.
      std::vector<float> alias = sums[0];
      ptrs[0] = alias.data();
      dist::reduce_mean(n, ptrs, len, alias.data());
      if (std::memcmp(alias.data(), want.data(), size_t(len) * sizeof(float)) != 0)
        fail("reduce_mean with out == mine[0], " + tag);
      // The trainer's way: stream the share's micro-batches through a TreeAccumulator.
      dist::TreeAccumulator acc(n, r * (n / P), (r + 1) * (n / P), len);
      for (int j = r * (n / P); j < (r + 1) * (n / P); ++j) acc.add(leaf(j, len).data());
      std::vector<float> via_acc(static_cast<size_t>(len), -2.0f);
      dist::reduce_mean(n, acc.node_sums(), len, via_acc.data());
      if (std::memcmp(via_acc.data(), want.data(), size_t(len) * sizeof(float)) != 0)
        fail("reduce_mean of TreeAccumulator sums differs, " + tag);
      char line[128];
      std::snprintf(line, sizeof line, "%d %lld %016llx\n", n, (long long)len,
                    (unsigned long long)fnv1a(out.data(), size_t(len) * sizeof(float)));
      lines += line;
    }
  }
  // Every rank's verdict on every rank.
  const float any_fail = dist::max_over_ranks(float(g_fail));
  if (r == 0) {
    FILE* f = std::fopen(argv[1], "w");
    if (!f || std::fputs(lines.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "dist_check: cannot write %s\n", argv[1]);
      dist::finalize();
      return 1;
    }
    std::printf("dist_check: P=%d %s\n", P, any_fail == 0 ? "ok" : "FAILED");
  }
  dist::finalize();
  return any_fail == 0 ? 0 : 1;
}
