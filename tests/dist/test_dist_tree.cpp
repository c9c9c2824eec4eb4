// The fixed summation tree of the data-parallel gradient reduction (fp4/dist/dist.h): tree_nodes
// tiles every rank's share with tree nodes, tree_combine of any such tiling equals the full
// tree sum bit for bit (an independent recursive reference written here), and reduce_mean of
// one process is that sum divided by n. No MPI: this process is rank 0 of 1.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "fp4/dist/dist.h"
#include "fp4/base/error.h"

namespace {
using fp4::dist::TreeNode;
using Leaves = std::vector<std::vector<float>>;  // [n micro-batches][len]

// Adversarial leaf values: magnitudes 1e8, 1, 1e-3 and their negatives mixed, so that FP32
// sums lose different bits in different orders.
Leaves make_leaves(int n, int64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  const float mags[] = {1e8f, 1.0f, -1e8f, 1e-3f, -1.0f, 3.7e7f, -2.5e-3f, 12345.678f};
  std::uniform_int_distribution<int> pick(0, 7);
  std::uniform_real_distribution<float> jitter(0.5f, 1.5f);
  Leaves l(static_cast<size_t>(n), std::vector<float>(size_t(len)));
  for (auto& v : l)
    for (float& x : v) x = mags[pick(rng)] * jitter(rng);
  return l;
}

// The tree sum over [lo, hi) straight from the definition in fp4/dist/dist.h: a leaf, or the
// elementwise sum left + right with mid = lo + (hi - lo) / 2.
std::vector<float> ref_sum(const Leaves& l, int lo, int hi) {
  if (hi - lo == 1) return l[size_t(lo)];
  const int mid = lo + (hi - lo) / 2;
  const std::vector<float> a = ref_sum(l, lo, mid), b = ref_sum(l, mid, hi);
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

// Every node [lo, hi) of the tree over [0, n).
std::set<std::pair<int, int>> all_tree_nodes(int n) {
  std::set<std::pair<int, int>> s;
  std::function<void(int, int)> go = [&](int lo, int hi) {
    s.insert({lo, hi});
    if (hi - lo == 1) return;
    const int mid = lo + (hi - lo) / 2;
    go(lo, mid);
    go(mid, hi);
  };
  go(0, n);
  return s;
}

// The parent of a non-root tree node [lo, hi) (to check maximality); {-1, -1} if there is none.
std::pair<int, int> parent_of(int n, int lo, int hi) {
  int plo = 0, phi = n;
  while (phi - plo > 1) {
    const int mid = plo + (phi - plo) / 2;
    if (lo == plo && hi == mid) return {plo, phi};
    if (lo == mid && hi == phi) return {plo, phi};
    if (hi <= mid) phi = mid;
    else plo = mid;
  }
  return {-1, -1};
}

bool is_pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }

TEST(DistTree, SharesTileWithMaximalTreeNodes) {
  for (int n = 1; n <= 24; ++n) {
    const auto tree = all_tree_nodes(n);
    for (int p = 1; p <= n; ++p) {
      if (n % p) continue;
      int next = 0;
      for (int r = 0; r < p; ++r) {
        const int a = r * n / p, b = (r + 1) * n / p;
        const std::vector<TreeNode> nodes = fp4::dist::tree_nodes(n, a, b);
        ASSERT_FALSE(nodes.empty());
        for (const TreeNode& t : nodes) {
          EXPECT_EQ(t.lo, next) << "n=" << n << " P=" << p << " r=" << r;
          EXPECT_LT(t.lo, t.hi);
          EXPECT_GE(t.lo, a);
          EXPECT_LE(t.hi, b);
          EXPECT_TRUE(tree.count({t.lo, t.hi})) << "[" << t.lo << "," << t.hi << ") not a tree node, n=" << n;
          if (tree.count({t.lo, t.hi}) && t.hi - t.lo < n) {  // maximal: the parent is not inside
            const auto [plo, phi] = parent_of(n, t.lo, t.hi);
            EXPECT_GE(plo, 0);
            EXPECT_FALSE(a <= plo && phi <= b) << "n=" << n << " P=" << p << " r=" << r;
          }
          next = t.hi;
        }
        EXPECT_EQ(next, b);
        if (is_pow2(p)) {
          ASSERT_EQ(nodes.size(), 1u) << "n=" << n << " P=" << p << " r=" << r;
          EXPECT_EQ(nodes[0].lo, a);
          EXPECT_EQ(nodes[0].hi, b);
        }
      }
      EXPECT_EQ(next, n);
    }
  }
  // A non-power-of-two share needs several nodes: n = 12, P = 3, rank 1 holds [4, 8).
  const std::vector<TreeNode> r1 = fp4::dist::tree_nodes(12, 4, 8);
  ASSERT_EQ(r1.size(), 3u);
  EXPECT_EQ(r1[0].lo, 4); EXPECT_EQ(r1[0].hi, 6);
  EXPECT_EQ(r1[1].lo, 6); EXPECT_EQ(r1[1].hi, 7);
  EXPECT_EQ(r1[2].lo, 7); EXPECT_EQ(r1[2].hi, 8);
}

TEST(DistTree, BadRangesThrow) {
  EXPECT_THROW(fp4::dist::tree_nodes(0, 0, 1), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_nodes(8, -1, 4), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_nodes(8, 4, 4), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_nodes(8, 5, 3), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_nodes(8, 0, 9), std::invalid_argument);
  EXPECT_NO_THROW(fp4::dist::tree_nodes(8, 0, 8));
}

// tree_combine of every rank's nodes, for every n and P, equals the full tree sum bit for bit.
TEST(DistTree, CombineEqualsFullTreeSum) {
  const int64_t len = 37;
  for (int n = 1; n <= 24; ++n) {
    const Leaves l = make_leaves(n, len, 1000u + uint32_t(n));
    const std::vector<float> want = ref_sum(l, 0, n);
    for (int p = 1; p <= n; ++p) {
      if (n % p) continue;
      std::vector<TreeNode> nodes;
      std::vector<std::vector<float>> sums;
      for (int r = 0; r < p; ++r)
        for (const TreeNode& t : fp4::dist::tree_nodes(n, r * n / p, (r + 1) * n / p)) {
          nodes.push_back(t);
          sums.push_back(ref_sum(l, t.lo, t.hi));
        }
      std::vector<const float*> ptrs;
      for (const auto& s : sums) ptrs.push_back(s.data());
      std::vector<float> out(static_cast<size_t>(len), -7.0f);
      fp4::dist::tree_combine(n, nodes, ptrs, len, out.data());
      EXPECT_EQ(std::memcmp(out.data(), want.data(), size_t(len) * sizeof(float)), 0)
          << "n=" << n << " P=" << p;
      // out aliasing values[0]
      std::vector<float> first = sums[0];
      ptrs[0] = first.data();
      fp4::dist::tree_combine(n, nodes, ptrs, len, first.data());
      EXPECT_EQ(std::memcmp(first.data(), want.data(), size_t(len) * sizeof(float)), 0)
          << "aliased, n=" << n << " P=" << p;
    }
    // Every leaf as its own node (the finest tiling).
    std::vector<TreeNode> leaves;
    std::vector<const float*> ptrs;
    for (int i = 0; i < n; ++i) {
      leaves.push_back({i, i + 1});
      ptrs.push_back(l[size_t(i)].data());
    }
    std::vector<float> out(static_cast<size_t>(len));
    fp4::dist::tree_combine(n, leaves, ptrs, len, out.data());
    EXPECT_EQ(std::memcmp(out.data(), want.data(), size_t(len) * sizeof(float)), 0) << "leaves, n=" << n;
  }
}

// Long vectors (several chunks of parallel work) at 1, 2 and 3 OpenMP threads.
TEST(DistTree, CombineLongVectorsAnyThreadCount) {
  const int64_t len = 50000 + 3;
  for (int n : {5, 12, 24}) {
    const Leaves l = make_leaves(n, len, 77u + uint32_t(n));
    const std::vector<float> want = ref_sum(l, 0, n);
    std::vector<TreeNode> leaves;
    std::vector<const float*> ptrs;
    for (int i = 0; i < n; ++i) {
      leaves.push_back({i, i + 1});
      ptrs.push_back(l[size_t(i)].data());
    }
    const int saved = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> out(static_cast<size_t>(len));
      fp4::dist::tree_combine(n, leaves, ptrs, len, out.data());
      EXPECT_EQ(std::memcmp(out.data(), want.data(), size_t(len) * sizeof(float)), 0)
          << "n=" << n << " threads=" << threads;
    }
    omp_set_num_threads(saved);
  }
}

// The test can tell summation orders apart: a plain left-to-right sum differs from the tree.
TEST(DistTree, LeftToRightSumDiffers) {
  const int n = 8;
  const int64_t len = 64;
  const Leaves l = make_leaves(n, len, 4242u);
  const std::vector<float> tree = ref_sum(l, 0, n);
  std::vector<float> seq(static_cast<size_t>(len), 0.0f);
  for (int i = 0; i < n; ++i)
    for (int64_t j = 0; j < len; ++j) seq[size_t(j)] += l[size_t(i)][size_t(j)];
  EXPECT_NE(std::memcmp(seq.data(), tree.data(), size_t(len) * sizeof(float)), 0);
}

TEST(DistTree, CombineRejectsBadTilings) {
  const int n = 8;
  std::vector<float> v(4, 1.0f), out(4);
  const float* p = v.data();
  using V = std::vector<const float*>;
  // [0, 3) is not a node of the tree over 8 ([0, 4) splits into [0, 2), [2, 4)).
  EXPECT_THROW(fp4::dist::tree_combine(n, {{0, 3}, {3, 8}}, V{p, p}, 4, out.data()), std::invalid_argument);
  // A gap, an overlap, nodes past n, a missing tail, descending order.
  EXPECT_THROW(fp4::dist::tree_combine(n, {{0, 4}, {6, 8}}, V{p, p}, 4, out.data()), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_combine(n, {{0, 4}, {2, 4}, {4, 8}}, V{p, p, p}, 4, out.data()),
               std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_combine(n, {{0, 8}, {8, 9}}, V{p, p}, 4, out.data()), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_combine(n, {{0, 4}}, V{p}, 4, out.data()), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_combine(n, {{4, 8}, {0, 4}}, V{p, p}, 4, out.data()), std::invalid_argument);
  // values of the wrong count, n < 1, len < 0.
  EXPECT_THROW(fp4::dist::tree_combine(n, {{0, 4}, {4, 8}}, V{p}, 4, out.data()), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_combine(0, {}, V{}, 4, out.data()), std::invalid_argument);
  EXPECT_THROW(fp4::dist::tree_combine(n, {{0, 4}, {4, 8}}, V{p, p}, -1, out.data()), std::invalid_argument);
  EXPECT_NO_THROW(fp4::dist::tree_combine(n, {{0, 4}, {4, 8}}, V{p, p}, 4, out.data()));
  EXPECT_EQ(out[0], 2.0f);
}

// One process (not under mpirun): reduce_mean is the tree sum (one node: the whole tree)
// divided by n in FP32.
TEST(DistTree, ReduceMeanOneProcess) {
  ASSERT_EQ(fp4::dist::size(), 1);
  ASSERT_EQ(fp4::dist::rank(), 0);
  const int64_t len = 301;
  for (int n = 1; n <= 12; ++n) {
    const Leaves l = make_leaves(n, len, 9000u + uint32_t(n));
    const std::vector<float> sum = ref_sum(l, 0, n);
    std::vector<float> want(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) want[size_t(i)] = sum[size_t(i)] / float(n);
    ASSERT_EQ(fp4::dist::tree_nodes(n, 0, n).size(), 1u);
    std::vector<float> out(static_cast<size_t>(len), 3.0f);
    fp4::dist::reduce_mean(n, {sum.data()}, len, out.data());
    EXPECT_EQ(std::memcmp(out.data(), want.data(), size_t(len) * sizeof(float)), 0) << "n=" << n;
    std::vector<float> inplace = sum;  // out aliasing mine[0]
    fp4::dist::reduce_mean(n, {inplace.data()}, len, inplace.data());
    EXPECT_EQ(std::memcmp(inplace.data(), want.data(), size_t(len) * sizeof(float)), 0) << "n=" << n;
  }
  std::vector<float> v(4, 1.0f), out(4);
  EXPECT_THROW(fp4::dist::reduce_mean(4, {v.data(), v.data()}, 4, out.data()), std::invalid_argument);
  EXPECT_THROW(fp4::dist::reduce_mean(4, {}, 4, out.data()), std::invalid_argument);
  EXPECT_THROW(fp4::dist::reduce_mean(0, {v.data()}, 4, out.data()), std::invalid_argument);
}

// Without mpirun every collective is the identity on one process.
TEST(DistTree, CollectivesOneProcess) {
  EXPECT_EQ(fp4::dist::bcast_from_rank0(2.5f), 2.5f);
  EXPECT_EQ(fp4::dist::max_over_ranks(-3.0f), -3.0f);
  double d[3] = {1, -2, 3};
  fp4::dist::max_over_ranks(d, 3);
  EXPECT_EQ(d[1], -2.0);
  double all[3] = {};
  fp4::dist::allgather(d, 3, all);
  EXPECT_EQ(all[0], 1.0);
  EXPECT_EQ(all[2], 3.0);
  std::string s("abc\0def", 7);
  fp4::dist::bcast_string(s);
  EXPECT_EQ(s, std::string("abc\0def", 7));
  EXPECT_NO_THROW(fp4::dist::barrier());
  EXPECT_THROW(fp4::dist::max_over_ranks(d, -1), std::invalid_argument);
}

// The launcher is recognised by its environment; without it init() leaves one process; an
// MPI-less build refuses to run under a launcher (fp4::UserError).
TEST(DistTree, InitFollowsTheLauncherEnvironment) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) GTEST_SKIP() << "running under an MPI launcher (" << v << " is set)";
  EXPECT_FALSE(fp4::dist::launched_by_mpi());
  int argc = 1;
  char name[] = "test_dist_tree";
  char* args[] = {name, nullptr};
  char** argv = args;
  fp4::dist::init(&argc, &argv);  // not launched: nothing happens
  EXPECT_EQ(fp4::dist::size(), 1);
  EXPECT_EQ(fp4::dist::rank(), 0);
  fp4::dist::finalize();
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    ::setenv(v, "0", 1);
    EXPECT_TRUE(fp4::dist::launched_by_mpi()) << v;
    if (!fp4::dist::built_with_mpi()) {
      EXPECT_THROW(fp4::dist::init(&argc, &argv), fp4::UserError) << v;
    }
    ::unsetenv(v);
  }
  EXPECT_FALSE(fp4::dist::launched_by_mpi());
  EXPECT_EQ(fp4::dist::size(), 1);
}

}  // namespace

namespace {
// TreeAccumulator streams every share's leaves into node sums equal, bit for bit, to the
// recursive reference of each node; over steps (reset) and with reduce_mean on one process.
TEST(DistTree, AccumulatorNodeSums) {
  const int64_t len = 29;
  for (int n = 1; n <= 24; ++n) {
    const Leaves l = make_leaves(n, len, 500u + uint32_t(n));
    for (int p = 1; p <= n; ++p) {
      if (n % p) continue;
      for (int r = 0; r < p; ++r) {
        const int a = r * n / p, b = (r + 1) * n / p;
        fp4::dist::TreeAccumulator acc(n, a, b, len);
        for (int step = 0; step < 2; ++step) {
          acc.reset();
          EXPECT_THROW(acc.node_sums(), std::logic_error);
          for (int j = a; j < b; ++j) {
            std::vector<float> g = l[size_t(j)];
            acc.add(g.data());
            g.assign(g.size(), 99.0f);  // the accumulator must not keep the caller's buffer
          }
          ASSERT_TRUE(acc.complete());
          EXPECT_THROW(acc.add(l[0].data()), std::logic_error);
          const auto& sums = acc.node_sums();
          const auto nodes = fp4::dist::tree_nodes(n, a, b);
          ASSERT_EQ(sums.size(), nodes.size());
          for (size_t k = 0; k < nodes.size(); ++k) {
            const std::vector<float> want = ref_sum(l, nodes[k].lo, nodes[k].hi);
            EXPECT_EQ(std::memcmp(sums[k], want.data(), size_t(len) * sizeof(float)), 0)
                << "n=" << n << " P=" << p << " r=" << r << " node " << k << " step " << step;
          }
        }
      }
    }
    // One process: accumulate the whole step, then reduce_mean.
    fp4::dist::TreeAccumulator acc(n, 0, n, len);
    for (int j = 0; j < n; ++j) acc.add(l[size_t(j)].data());
    std::vector<float> out(static_cast<size_t>(len));
    fp4::dist::reduce_mean(n, acc.node_sums(), len, out.data());
    const std::vector<float> sum = ref_sum(l, 0, n);
    for (int64_t i = 0; i < len; ++i) {
      const float want = sum[size_t(i)] / float(n);
      ASSERT_EQ(std::memcmp(&out[size_t(i)], &want, sizeof(float)), 0) << "n=" << n << " i=" << i;
    }
  }
  EXPECT_THROW(fp4::dist::TreeAccumulator(8, 0, 9, 4), std::invalid_argument);
  EXPECT_THROW(fp4::dist::TreeAccumulator(8, 0, 8, -1), std::invalid_argument);
}
}  // namespace

namespace {
// The accumulator's threaded additions at 1, 2 and 3 OpenMP threads (vectors long enough to
// be split).
TEST(DistTree, AccumulatorAnyThreadCount) {
  const int n = 6;
  const int64_t len = 70001;
  const Leaves l = make_leaves(n, len, 31337u);
  const std::vector<float> want = ref_sum(l, 0, n);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    fp4::dist::TreeAccumulator acc(n, 0, n, len);
    for (int j = 0; j < n; ++j) acc.add(l[size_t(j)].data());
    ASSERT_EQ(acc.node_sums().size(), 1u);
    EXPECT_EQ(std::memcmp(acc.node_sums()[0], want.data(), size_t(len) * sizeof(float)), 0)
        << "threads=" << threads;
  }
  omp_set_num_threads(saved);
}
}  // namespace
