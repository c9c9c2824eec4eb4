// The fixed summation tree over a step's micro-batches (fp4/dist/dist.h): which tree nodes a
// contiguous range of micro-batches covers, and the combine of node sums in tree order.
// Pure computation, no MPI.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/dist/dist.h"
#include "tree_internal.h"

namespace fp4::dist {
namespace {

// Appends the maximal nodes of the subtree [lo, hi) that lie inside [a, b), left to right.
void collect(int lo, int hi, int a, int b, std::vector<TreeNode>& out) {
  if (hi <= a || lo >= b) return;  // disjoint
  if (a <= lo && hi <= b) {        // inside: maximal, since its parent was not inside
    out.push_back({lo, hi});
    return;
  }
  const int mid = lo + (hi - lo) / 2;  // hi - lo >= 2 here: a leaf is inside or disjoint
  collect(lo, mid, a, b, out);
  collect(mid, hi, a, b, out);
}

// The combine as a postfix program over the tree [lo, hi): an entry k >= 0 pushes the sum of
// nodes[k]; kAdd pops R, then L, and pushes L + R. Tracks the deepest stack. Throws if the
// nodes are not the tree's own nodes tiling [0, n) in ascending order.
constexpr int kAdd = -1;
void program(int lo, int hi, const std::vector<TreeNode>& nodes, size_t& k, int depth,
             std::vector<int>& prog, int& max_depth) {
  max_depth = std::max(max_depth, depth + 1);
  if (k < nodes.size() && nodes[k].lo == lo && nodes[k].hi == hi) {
    prog.push_back(int(k++));
    return;
  }
  if (hi - lo == 1) {
    const std::string got = k < nodes.size() ? "[" + std::to_string(nodes[k].lo) + ", " +
                                                   std::to_string(nodes[k].hi) + ")"
                                             : "no node";
    throw std::invalid_argument("tree_combine: nodes must be the summation tree's nodes tiling [0, n) "
                                "in ascending order; at micro-batch " +
                                std::to_string(lo) + " found " + got);
  }
  const int mid = lo + (hi - lo) / 2;
  program(lo, mid, nodes, k, depth, prog, max_depth);
  program(mid, hi, nodes, k, depth + 1, prog, max_depth);
  prog.push_back(kAdd);
}

constexpr int64_t kChunk = 2048;  // floats per scratch slot and per unit of parallel work

// Whether [lo, hi) is a node of the tree over [0, n).
bool is_tree_node(int n, int lo, int hi) {
  int tlo = 0, thi = n;
  for (;;) {
    if (tlo == lo && thi == hi) return true;
    if (thi - tlo <= 1) return false;
    const int mid = tlo + (thi - tlo) / 2;
    if (hi <= mid) thi = mid;
    else if (lo >= mid) tlo = mid;
    else return false;  // straddles the split
  }
}

// d[i] = d[i] + r[i] (left operand first), elementwise.
void add_into(float* d, const float* r, int64_t len) {
#pragma omp parallel for schedule(static) if (len >= (int64_t(1) << 16))
  for (int64_t i = 0; i < len; ++i) d[i] = d[i] + r[i];
}

}  // namespace

std::vector<TreeNode> tree_nodes(int n, int a, int b) {
  if (n < 1) throw std::invalid_argument("tree_nodes: n must be >= 1, got " + std::to_string(n));
  if (!(0 <= a && a < b && b <= n))
    throw std::invalid_argument("tree_nodes: need 0 <= a < b <= n, got a = " + std::to_string(a) +
                                ", b = " + std::to_string(b) + ", n = " + std::to_string(n));
  std::vector<TreeNode> out;
  collect(0, n, a, b, out);
  return out;
}

namespace detail {

void tree_combine_div(int n, const std::vector<TreeNode>& nodes,
                      const std::vector<const float*>& values, int64_t len, float* out,
                      float divisor) {
  if (n < 1) throw std::invalid_argument("tree_combine: n must be >= 1, got " + std::to_string(n));
  if (values.size() != nodes.size())
    throw std::invalid_argument("tree_combine: values has " + std::to_string(values.size()) +
                                " pointers for " + std::to_string(nodes.size()) + " nodes");
  if (len < 0) throw std::invalid_argument("tree_combine: len must be >= 0, got " + std::to_string(len));
  thread_local std::vector<int> prog;
  prog.clear();
  size_t k = 0;
  int max_depth = 0;
  program(0, n, nodes, k, 0, prog, max_depth);
  if (k != nodes.size())
    throw std::invalid_argument("tree_combine: nodes extend past [0, n) (n = " + std::to_string(n) + ")");
  if (len == 0) return;
  if (!out) throw std::invalid_argument("tree_combine: out is null");
  for (const float* v : values)
    if (!v) throw std::invalid_argument("tree_combine: a values pointer is null");

  const int64_t n_chunks = (len + kChunk - 1) / kChunk;
  const std::vector<int>& pr = prog;  // shared read-only with the team
  // Every element goes through the same operations in the same order whatever thread handles
  // its chunk, so the result does not depend on the thread count.
#pragma omp parallel for schedule(static) if (n_chunks >= 8)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t c0 = c * kChunk, m = std::min(kChunk, len - c0);
    thread_local std::vector<float> scratch;
    thread_local std::vector<const float*> stack;
    if (scratch.size() < size_t(max_depth * kChunk)) scratch.resize(size_t(max_depth * kChunk));
    stack.clear();
    float* dst = out + c0;
    if (pr.size() == 1) {  // one node covers [0, n): a copy (or the division alone)
      const float* v = values[size_t(pr[0])] + c0;
      if (divisor != 0.0f) {
        for (int64_t j = 0; j < m; ++j) dst[j] = v[j] / divisor;
      } else if (v != dst) {
        std::memmove(dst, v, size_t(m) * sizeof(float));
      }
      continue;
    }
    for (size_t p = 0; p < pr.size(); ++p) {
      if (pr[p] != kAdd) {
        stack.push_back(values[size_t(pr[p])] + c0);
        continue;
      }
      const float* R = stack.back();
      stack.pop_back();
      const float* L = stack.back();
      if (p + 1 == pr.size()) {  // the root: into out (L may be out itself: read, then written)
        if (divisor != 0.0f) {
          for (int64_t j = 0; j < m; ++j) {
            const float s = L[j] + R[j];
            dst[j] = s / divisor;
          }
        } else {
          for (int64_t j = 0; j < m; ++j) dst[j] = L[j] + R[j];
        }
      } else {  // an inner node: into the scratch slot of its stack position
        float* d = scratch.data() + (stack.size() - 1) * size_t(kChunk);
        for (int64_t j = 0; j < m; ++j) d[j] = L[j] + R[j];
        stack.back() = d;
      }
    }
  }
}

}  // namespace detail

void tree_combine(int n, const std::vector<TreeNode>& nodes, const std::vector<const float*>& values,
                  int64_t len, float* out) {
  detail::tree_combine_div(n, nodes, values, len, out, 0.0f);
}

// ---------------------------------------------------------------- TreeAccumulator
TreeAccumulator::TreeAccumulator(int n, int a, int b, int64_t len)
    : n_(n), a_(a), b_(b), len_(len), nodes_(tree_nodes(n, a, b)) {
  if (len < 0) throw std::invalid_argument("TreeAccumulator: len must be >= 0, got " + std::to_string(len));
}

int TreeAccumulator::acquire() {
  if (!free_.empty()) {
    const int i = free_.back();
    free_.pop_back();
    return i;
  }
  bufs_.emplace_back(static_cast<size_t>(len_));
  return int(bufs_.size()) - 1;
}

void TreeAccumulator::add(const float* grad) {
  if (complete())
    throw std::logic_error("TreeAccumulator::add: all " + std::to_string(b_ - a_) +
                           " micro-batches of the share were added; reset() first");
  if (len_ > 0 && !grad) throw std::invalid_argument("TreeAccumulator::add: grad is null");
  const int j = a_ + count_;
  int lo = j, hi = j + 1, buf = -1;  // buf -1: still the caller's grad
  // Merge with the partial sums on the stack while the new part is a right child whose left
  // sibling is complete: parent = left + right.
  while (!stack_.empty()) {
    const Part t = stack_.back();
    if (t.hi != lo || t.lo + (hi - t.lo) / 2 != t.hi || !is_tree_node(n_, t.lo, hi)) break;
    add_into(bufs_[size_t(t.buf)].data(), buf < 0 ? grad : bufs_[size_t(buf)].data(), len_);
    if (buf >= 0) free_.push_back(buf);
    buf = t.buf;
    lo = t.lo;
    stack_.pop_back();
  }
  if (buf < 0) {  // a left child (or a one-leaf node): keep a copy
    buf = acquire();
    if (len_ > 0) std::memcpy(bufs_[size_t(buf)].data(), grad, size_t(len_) * sizeof(float));
  }
  const TreeNode& target = nodes_[done_.size()];
  if (lo == target.lo && hi == target.hi) done_.push_back(buf);  // the stack is empty now
  else stack_.push_back({lo, hi, buf});
  ++count_;
  if (complete()) {
    sums_.clear();
    for (int i : done_) sums_.push_back(bufs_[size_t(i)].data());
  }
}

const std::vector<const float*>& TreeAccumulator::node_sums() const {
  if (!complete())
    throw std::logic_error("TreeAccumulator::node_sums: " + std::to_string(count_) + " of " +
                           std::to_string(b_ - a_) + " micro-batches added");
  return sums_;
}

void TreeAccumulator::reset() {
  for (int i : done_) free_.push_back(i);
  for (const Part& p : stack_) free_.push_back(p.buf);
  done_.clear();
  stack_.clear();
  sums_.clear();
  count_ = 0;
}

}  // namespace fp4::dist
