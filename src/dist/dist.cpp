// The process group of a run and its collectives over MPI (fp4/dist/dist.h). Built with
// FP4_HAVE_MPI=1 when CMake found Open MPI (option FP4_MPI); otherwise, or when the program
// was not started by mpirun, one process: rank 0 of 1, collectives copy or do nothing.
#include "fp4/dist/dist.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/base/profile.h"
#include "tree_internal.h"

#if FP4_HAVE_MPI
#include <mpi.h>
#endif

namespace fp4::dist {
namespace {

bool g_initialised = false;  // init() called MPI_Init_thread (and finalize() not yet run)
int g_rank = 0, g_size = 1;

using prof::Cat;

// Throws if an element count does not fit MPI's int counts.
int mpi_count(int64_t n, const char* what) {
  if (n < 0 || n > int64_t(INT_MAX))
    throw std::invalid_argument(std::string("dist: ") + what + " = " + std::to_string(n) +
                                " elements does not fit an MPI count (0 .. INT_MAX)");
  return int(n);
}

// Order-independent maximum: NaN if either is NaN (as the canonical quiet NaN), +0 over -0;
// commutative and associative, so any reduction order gives the same bits.
template <class T>
T exact_max(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

#if FP4_HAVE_MPI
MPI_Op g_max_op = MPI_OP_NULL;

void max_op_fn(void* in, void* inout, int* len, MPI_Datatype* type) {
  if (*type == MPI_FLOAT) {
    const float* a = static_cast<const float*>(in);
    float* b = static_cast<float*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = exact_max(a[i], b[i]);
  } else {
    const double* a = static_cast<const double*>(in);
    double* b = static_cast<double*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = exact_max(a[i], b[i]);
  }
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, msg, &n);
  abort_all(std::string(call) + " failed: " + std::string(msg, size_t(n)), 1);
}
#endif

// The tree nodes of every rank's share for (n, P), cached: counts per rank and the concatenation
// (ascending over [0, n), since the shares are ascending).
struct Layout {
  int n = 0, p = 0;
  std::vector<int> count;       // nodes of rank q
  std::vector<TreeNode> all;    // every rank's nodes, rank 0's first
};
const Layout& layout(int n, int p) {
  thread_local Layout l;
  if (l.n == n && l.p == p) return l;
  l.n = n;
  l.p = p;
  l.count.assign(size_t(p), 0);
  l.all.clear();
  for (int q = 0; q < p; ++q) {
    const std::vector<TreeNode> nodes = tree_nodes(n, q * (n / p), (q + 1) * (n / p));
    l.count[size_t(q)] = int(nodes.size());
    l.all.insert(l.all.end(), nodes.begin(), nodes.end());
  }
  return l;
}

}  // namespace

bool built_with_mpi() {
#if FP4_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

void init(int* argc, char*** argv) {
  if (g_initialised || !launched_by_mpi()) return;
#if FP4_HAVE_MPI
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    // Collectives run on the main thread while OpenMP teams exist: FUNNELED is required.
    if (provided < MPI_THREAD_FUNNELED)
      throw UserError("this MPI library provides thread support level " +
                      std::to_string(provided) + ", below MPI_THREAD_FUNNELED, which fp4train "
                      "needs (collectives on the main thread of an OpenMP program)");
  }
  g_initialised = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &g_size), "MPI_Comm_size");
  check(MPI_Op_create(&max_op_fn, 1, &g_max_op), "MPI_Op_create");
#else
  (void)argc;
  (void)argv;
  throw UserError(
      "this fp4train was built without MPI but was started by mpirun (OMPI_COMM_WORLD_SIZE, "
      "PMIX_RANK or PMI_RANK is set): install openmpi-bin libopenmpi-dev and rebuild "
      "(CMake option FP4_MPI), or run it without mpirun");
#endif
}

void finalize() {
  if (!g_initialised) return;
#if FP4_HAVE_MPI
  int done = 0;
  MPI_Finalized(&done);
  if (!done) {
    if (g_max_op != MPI_OP_NULL) MPI_Op_free(&g_max_op);
    MPI_Finalize();
  }
#endif
  g_initialised = false;
  g_rank = 0;
  g_size = 1;
}

int rank() { return g_rank; }
int size() { return g_size; }

Solo::Solo() : rank_(g_rank), size_(g_size) { g_rank = 0, g_size = 1; }
Solo::~Solo() { g_rank = rank_, g_size = size_; }

void abort_all(const std::string& msg, int code) {
  std::fflush(stdout);
  int shown = g_rank;  // the run's rank, also inside a Solo
#if FP4_HAVE_MPI
  if (g_initialised) MPI_Comm_rank(MPI_COMM_WORLD, &shown);
#endif
  std::fprintf(stderr, "rank %d: %s\n", shown, msg.c_str());
  std::fflush(stderr);
#if FP4_HAVE_MPI
  if (g_initialised) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Abort(MPI_COMM_WORLD, code);
  }
#endif
  std::exit(code);
}

float bcast_from_rank0(float v) {
  prof::Scope s(Cat::kComm);
#if FP4_HAVE_MPI
  if (g_size > 1) check(MPI_Bcast(&v, 1, MPI_FLOAT, 0, MPI_COMM_WORLD), "MPI_Bcast");
#endif
  return v;
}

float max_over_ranks(float v) {
  prof::Scope s(Cat::kComm);
#if FP4_HAVE_MPI
  if (g_size > 1)
    check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_FLOAT, g_max_op, MPI_COMM_WORLD), "MPI_Allreduce");
#endif
  return v;
}

void max_over_ranks(double* v, int64_t n) {
  prof::Scope s(Cat::kComm);
  const int cnt = mpi_count(n, "max_over_ranks n");
  if (cnt > 0 && !v) throw std::invalid_argument("max_over_ranks: v is null");
#if FP4_HAVE_MPI
  if (g_size > 1 && cnt > 0)
    check(MPI_Allreduce(MPI_IN_PLACE, v, cnt, MPI_DOUBLE, g_max_op, MPI_COMM_WORLD), "MPI_Allreduce");
#endif
}

void allgather(const double* mine, int64_t n, double* all) {
  prof::Scope s(Cat::kComm);
  const int cnt = mpi_count(n, "allgather n");
  mpi_count(n * g_size, "allgather n * size()");
  if (cnt > 0 && (!mine || !all)) throw std::invalid_argument("allgather: mine or all is null");
  if (cnt == 0) return;
#if FP4_HAVE_MPI
  if (g_size > 1) {
    check(MPI_Allgather(mine, cnt, MPI_DOUBLE, all, cnt, MPI_DOUBLE, MPI_COMM_WORLD), "MPI_Allgather");
    return;
  }
#endif
  if (all != mine) std::copy_n(mine, cnt, all);
}

void bcast_string(std::string& str) {
  prof::Scope s(Cat::kComm);
#if FP4_HAVE_MPI
  if (g_size <= 1) return;
  int64_t n = int64_t(str.size());
  check(MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
  const int cnt = mpi_count(n, "bcast_string length");  // same n on every rank: all throw
  if (g_rank != 0) str.assign(size_t(n), '\0');
  if (cnt > 0) check(MPI_Bcast(str.data(), cnt, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
#else
  (void)str;
#endif
}

void barrier() {
  prof::Scope s(Cat::kComm);
#if FP4_HAVE_MPI
  if (g_size > 1) check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

void reduce_mean(int n, const std::vector<const float*>& mine, int64_t len, float* out) {
  // One process: the tree's last additions and the division, no communication ("other");
  // several: the packing, the exchange and the shard's combine count as communication.
  prof::Scope s(g_size == 1 ? Cat::kOther : Cat::kComm);
  const int p = g_size, r = g_rank;
  if (n < 1 || n % p != 0)
    throw std::invalid_argument("reduce_mean: n (micro-batches per step) = " + std::to_string(n) +
                                " must be a positive multiple of the process count " +
                                std::to_string(p));
  if (len < 0) throw std::invalid_argument("reduce_mean: len must be >= 0, got " + std::to_string(len));
  const Layout& lay = layout(n, p);
  const int mine_count = lay.count[size_t(r)];
  if (int64_t(mine.size()) != mine_count)
    throw std::invalid_argument("reduce_mean: mine holds " + std::to_string(mine.size()) +
                                " node sums; rank " + std::to_string(r) + "'s share of " +
                                std::to_string(n) + " micro-batches over " + std::to_string(p) +
                                " processes is " + std::to_string(mine_count) +
                                " nodes (tree_nodes)");
  if (len > 0 && !out) throw std::invalid_argument("reduce_mean: out is null");
  if (len == 0) return;  // the same len on every rank: nobody communicates
  if (p == 1) {  // the whole tree is here: combine (a copy for one node) and divide
    detail::tree_combine_div(n, lay.all, mine, len, out, float(n));
    return;
  }
#if FP4_HAVE_MPI
  // Shard q of the vector: [q·len/P, (q+1)·len/P). Every count is checked against INT_MAX on
  // every rank before any communication (the inputs are the same everywhere, so all ranks
  // throw together).
  const int total_nodes = int(lay.all.size());
  auto shard_lo = [&](int q) { return int64_t(q) * len / p; };
  mpi_count(len, "reduce_mean len");
  int max_count = 0;
  for (int c : lay.count) max_count = std::max(max_count, c);
  mpi_count(int64_t(max_count) * len, "reduce_mean nodes of a rank * len");
  mpi_count(int64_t(total_nodes) * (len / p + 1), "reduce_mean nodes * shard length");
  for (const float* v : mine)
    if (!v) throw std::invalid_argument("reduce_mean: a pointer of mine is null");

  thread_local std::vector<int> send_count, send_displ, recv_count, recv_displ, shard_count,
      shard_displ;
  thread_local std::vector<float> send_buf, recv_buf;
  thread_local std::vector<const float*> recv_ptr;
  send_count.assign(size_t(p), 0);
  send_displ.assign(size_t(p), 0);
  recv_count.assign(size_t(p), 0);
  recv_displ.assign(size_t(p), 0);
  shard_count.assign(size_t(p), 0);
  shard_displ.assign(size_t(p), 0);
  for (int q = 0; q < p; ++q) {
    shard_displ[size_t(q)] = int(shard_lo(q));
    shard_count[size_t(q)] = int(shard_lo(q + 1) - shard_lo(q));
  }
  const int my_len = shard_count[size_t(r)];
  // Send: to rank q, this rank's nodes' slices of shard q, node after node.
  int64_t off = 0;
  for (int q = 0; q < p; ++q) {
    send_displ[size_t(q)] = int(off);
    send_count[size_t(q)] = mine_count * shard_count[size_t(q)];
    off += send_count[size_t(q)];
  }
  if (send_buf.size() < size_t(std::max<int64_t>(off, 1))) send_buf.resize(size_t(std::max<int64_t>(off, 1)));
  for (int q = 0; q < p; ++q) {
    float* dst = send_buf.data() + send_displ[size_t(q)];
    const int64_t lo = shard_displ[size_t(q)], m = shard_count[size_t(q)];
    for (int k = 0; k < mine_count && m > 0; ++k)
      std::memcpy(dst + k * m, mine[size_t(k)] + lo, size_t(m) * sizeof(float));
  }
  // Receive: from rank q, its nodes' slices of this rank's shard; rank order is node order.
  off = 0;
  for (int q = 0; q < p; ++q) {
    recv_displ[size_t(q)] = int(off);
    recv_count[size_t(q)] = lay.count[size_t(q)] * my_len;
    off += recv_count[size_t(q)];
  }
  if (recv_buf.size() < size_t(std::max<int64_t>(off, 1))) recv_buf.resize(size_t(std::max<int64_t>(off, 1)));
  check(MPI_Alltoallv(send_buf.data(), send_count.data(), send_displ.data(), MPI_FLOAT,
                      recv_buf.data(), recv_count.data(), recv_displ.data(), MPI_FLOAT,
                      MPI_COMM_WORLD),
        "MPI_Alltoallv");
  // Combine this rank's shard in tree order, divide, straight into its place in out.
  if (my_len > 0) {
    recv_ptr.resize(size_t(total_nodes));
    for (int k = 0; k < total_nodes; ++k) recv_ptr[size_t(k)] = recv_buf.data() + int64_t(k) * my_len;
    detail::tree_combine_div(n, lay.all, recv_ptr, my_len, out + shard_displ[size_t(r)], float(n));
  }
  check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, shard_count.data(),
                       shard_displ.data(), MPI_FLOAT, MPI_COMM_WORLD),
        "MPI_Allgatherv");
#else
  (void)out;
#endif
}

}  // namespace fp4::dist
