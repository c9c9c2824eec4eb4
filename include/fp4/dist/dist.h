// Data parallelism over MPI (Open MPI): the process group of a run, the few collectives the
// trainer needs, and the fixed-order reduction of micro-batch gradients that makes a run
// bit-identical for any process count (docs/recipes.md "Micro-batches and data parallelism",
// the contract; running it: docs/parallel.md "More than one process: micro-batches and MPI").
//
// A program not launched by mpirun (no OMPI_COMM_WORLD_SIZE / PMIX_RANK / PMI_RANK in its
// environment) never initialises MPI: it is one process of rank 0, every collective is a
// no-op or a copy, and the binary need not be started through mpirun. Every collective must
// be called by all ranks in the same order (MPI's rule), from the thread that called init()
// (MPI_THREAD_FUNNELED), outside OpenMP parallel regions. Communication time is profiled as
// prof::Cat::kComm. Counts are MPI ints: a collective whose message would exceed INT_MAX
// elements throws std::invalid_argument (on every rank alike, before communicating). The
// library prints nothing except abort_all's message.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp4::dist {

/// Whether this binary was built with MPI (CMake found Open MPI).
bool built_with_mpi();
/// Whether the environment says this process was started by mpirun (or another MPI launcher):
/// OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK is set.
bool launched_by_mpi();

/// Initialise MPI (MPI_Init_thread, MPI_THREAD_FUNNELED) iff launched_by_mpi(), else nothing
/// (one process). Call first thing in main. Idempotent.
/// Throws fp4::UserError if launched by mpirun but built without MPI.
void init(int* argc, char*** argv);
/// MPI_Finalize if init() initialised MPI; idempotent.
void finalize();
/// Rank of this process in the run and the number of processes (0 and 1 without MPI).
int rank();
int size();
/// Flush stdout, print `msg` (prefixed "rank R: ") to stderr and end every process of the run
/// (MPI_Abort with `code`; std::exit(code) without MPI). For an error only some ranks see,
/// which would leave the others waiting in a collective.
[[noreturn]] void abort_all(const std::string& msg, int code = 1);

/// While a Solo lives, this process is a run of its own: rank() is 0, size() is 1 and every
/// collective below is the one-process no-op or copy, whatever mpirun started. For work that
/// each rank does alone and that calls code written for a data-parallel run (fp4train
/// rollout: each rank trains its own rollouts with train_step; docs/fidelity.md "Paired
/// rollouts"). Restores the rank and size it found when destroyed. Not thread-safe: create it
/// on the thread that called init(), outside OpenMP parallel regions. abort_all still ends
/// every process.
class Solo {
 public:
  Solo();
  ~Solo();
  Solo(const Solo&) = delete;
  Solo& operator=(const Solo&) = delete;

 private:
  int rank_, size_;
};

/// Rank 0's value of v, on every rank (MPI_Bcast).
float bcast_from_rank0(float v);
/// The maximum of v over ranks, on every rank (exact: max is order-independent). A NaN on any
/// rank gives NaN (the canonical quiet NaN) on every rank; +0 wins over −0.
float max_over_ranks(float v);
/// Elementwise maximum of v[0..n) over ranks, in place on every rank (NaN and ±0 as above).
/// Throws std::invalid_argument if n < 0.
void max_over_ranks(double* v, int64_t n);
/// all[r·n + i] = rank r's mine[i] for r < size(), i < n, on every rank (MPI_Allgather);
/// `all` holds size()·n doubles. Throws std::invalid_argument if n < 0.
void allgather(const double* mine, int64_t n, double* all);
/// Broadcast rank 0's bytes (any length; other ranks' `s` is replaced).
void bcast_string(std::string& s);
/// MPI_Barrier.
void barrier();

// ---------------------------------------------------------------- the gradient tree
/// The fixed summation tree over the n micro-batches of a step: node [lo, hi) is a leaf if
/// hi − lo == 1, else the FP32 elementwise sum node[lo, mid) + node[mid, hi) with
/// mid = lo + (hi − lo) / 2 (left operand first). The result depends only on n.
struct TreeNode {
  int lo = 0, hi = 0;
};
/// The maximal tree nodes of the tree over [0, n) that lie inside [a, b) (0 ≤ a < b ≤ n),
/// in ascending order: they tile [a, b). For P a power of two dividing n, each rank's
/// contiguous share [r·n/P, (r+1)·n/P) is one node. Throws std::invalid_argument on a bad
/// range.
std::vector<TreeNode> tree_nodes(int n, int a, int b);

/// Sum of the nodes `nodes` (which tile [0, n), ascending; values[i] holds the sum of
/// nodes[i] over `len` floats) in tree order, into out[0..len). out may alias values[0].
/// Elementwise, threaded over chunks of the vector with OpenMP: the result does not depend on
/// the thread count. Throws std::invalid_argument if the nodes are not nodes of the tree over
/// [0, n) tiling it in ascending order, values.size() != nodes.size(), n < 1 or len < 0.
void tree_combine(int n, const std::vector<TreeNode>& nodes, const std::vector<const float*>& values,
                  int64_t len, float* out);

/// The step gradient on every rank: the tree sum over the step's n micro-batches, divided
/// by n (one FP32 division per element). Micro-batches are spread evenly and contiguously
/// over ranks: rank r holds [r·n/P, (r+1)·n/P), and `mine` holds the sums of
/// tree_nodes(n, r·n/P, (r+1)·n/P), in that order, `len` floats each. The parameter vector is
/// cut into P contiguous shards; each rank receives its shard of every node (MPI_Alltoallv),
/// combines it in tree order, and the shards are gathered back (MPI_Allgatherv): per rank
/// about (nodes + 1) · len floats move, len · 2 for P a power of two. The result is
/// bit-identical to P = 1. out may alias mine[0]. For P = 1, `mine` is the one sum of the
/// whole tree and the call only divides. Throws std::invalid_argument if n < 1,
/// n % size() != 0, `mine` has the wrong count, or a count exceeds INT_MAX (per rank, nodes ·
/// len floats are sent). Scratch kept between calls (per thread): the send buffer, nodes · len
/// floats, and the receive buffer, (all ranks' nodes) · len / P floats.
void reduce_mean(int n, const std::vector<const float*>& mine, int64_t len, float* out);

/// Streams one rank's micro-batch gradients into the sums of its tree nodes in tree order:
/// after the gradients of micro-batches a, a+1, ..., b−1 were add()ed (in that order),
/// node_sums() is the `mine` of reduce_mean for the share [a, b) (tree_nodes(n, a, b), each
/// node the tree sum of its leaves, bit-identical to tree_combine of its leaves). Keeps at most
/// about log2(b − a) + (number of nodes) buffers of `len` floats, allocated during the first
/// step and reused after reset(). A micro-batch that is a right child is added straight from
/// the caller's buffer; a left child is copied. Elementwise additions, threaded with OpenMP
/// (results independent of the thread count). Not thread-safe; no MPI.
class TreeAccumulator {
 public:
  /// Share [a, b) of the tree over [0, n) (as tree_nodes), vectors of `len` floats. Throws
  /// std::invalid_argument on a bad range or len < 0.
  TreeAccumulator(int n, int a, int b, int64_t len);
  /// Add the gradient of the next micro-batch (a + count()), len floats; `grad` need not
  /// outlive the call. Throws std::logic_error if all b − a were added already.
  void add(const float* grad);
  /// Micro-batches added since construction or reset().
  int count() const { return count_; }
  /// Whether all b − a micro-batches were added.
  bool complete() const { return count_ == b_ - a_; }
  /// tree_nodes(n, a, b).
  const std::vector<TreeNode>& nodes() const { return nodes_; }
  /// The node sums, in nodes() order, `len` floats each; valid until reset() or destruction.
  /// Throws std::logic_error if !complete().
  const std::vector<const float*>& node_sums() const;
  /// Start the next step (buffers kept).
  void reset();

 private:
  struct Part {
    int lo, hi;
    int buf;  // index into bufs_
  };
  int acquire();
  int n_, a_, b_, count_ = 0;
  int64_t len_;
  std::vector<TreeNode> nodes_;
  std::vector<std::vector<float>> bufs_;
  std::vector<int> free_;          // indices of unused bufs_
  std::vector<Part> stack_;        // partial sums of the node being accumulated
  std::vector<int> done_;          // buffers of the completed nodes
  std::vector<const float*> sums_;
};

}  // namespace fp4::dist
