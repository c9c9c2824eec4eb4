// FP32 GEMM backend over oneDNN's sgemm and BF16 GEMM backend over oneDNN's matmul
// primitive, both made thread-count independent by fixed output tiling.
#include "fp4/gemm/gemm.h"

#include "fp4/base/cpu_isa.h"
#include "fp4/base/int_math.h"
#include "fp4/numerics/bf16.h"

#include <dnnl.h>
#include <emmintrin.h>
#include <dnnl_version.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace fp4 {
namespace {
// Output tile shape. Fixed (never derived from the thread count), so each output element
// is computed by exactly one single-threaded oneDNN call over the full K: its summation
// order is the same for 1, 2 or 64 threads.
constexpr int64_t kTileM = 128;
constexpr int64_t kTileN = 512;

// FP4_MAX_CPU_ISA (fp4/base/cpu_isa.h) caps oneDNN too: applied once, before the first oneDNN call
// of the process (oneDNN accepts dnnl_set_max_cpu_isa only before anything has asked it for its
// ISA or run a kernel; every function here that calls oneDNN calls this first). A refused cap
// would silently run the CPU's full ISA under a header saying otherwise, so it throws.
void apply_isa_cap() {
  static const bool done = [] {
    const CpuIsa cap = max_cpu_isa();
    dnnl_status_t st = dnnl_success;
    if (cap == CpuIsa::Avx2)
      st = dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
    else if (cap < CpuIsa::Avx2)
      st = dnnl_set_max_cpu_isa(dnnl_cpu_isa_sse41);
    if (st != dnnl_success)
      throw std::logic_error("FP4_MAX_CPU_ISA: oneDNN refused the cap (status " +
                             std::to_string(int(st)) +
                             "): oneDNN was used before fp4::gemm applied it");
    return true;
  }();
  (void)done;
}

inline const float* at(const float* p, bool trans, int64_t r, int64_t c, int64_t ld) {
  // Element (r, c) of op(P) where op(P) = P or Pᵀ; returns the base pointer of a sub-block.
  return trans ? p + c * ld + r : p + r * ld + c;
}
}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  apply_isa_cap();
  const int64_t tm = (M + kTileM - 1) / kTileM, tn = (N + kTileN - 1) / kTileN;
  const int64_t tiles = tm * tn;
  int failures = 0;
  dnnl_status_t first_error = dnnl_success;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : failures)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = (t / tn) * kTileM, j0 = (t % tn) * kTileN;
    const int64_t mb = std::min(kTileM, M - i0), nb = std::min(kTileN, N - j0);
    // Sub-block of op(A) rows i0.., all K; of op(B) all K, cols j0..
    const float* a = at(A, trans_a, i0, 0, lda);
    const float* b = at(B, trans_b, 0, j0, ldb);
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', mb, nb, K, alpha, a,
                                  lda, b, ldb, beta, C + i0 * ldc + j0, ldc);
    if (st != dnnl_success) {
      ++failures;
#pragma omp critical
      first_error = st;
    }
  }
  if (failures)
    throw std::runtime_error("oneDNN sgemm failed with status " + std::to_string(first_error) +
                             " (M=" + std::to_string(M) + ", N=" + std::to_string(N) +
                             ", K=" + std::to_string(K) + ")");
}

// ------------------------------------------------------------------------------------------
// BF16 GEMM (oneDNN matmul).
//
// Why the bits do not depend on the thread count:
//  * The output is cut into tiles of kBf16TileM × kBf16TileN (constants; smaller outputs take
//    kScaledTileM × kScaledTileN, see bf16_tile; the blocked path widens some to whole rows,
//    see blocked_tile), so the set of tile problems is a function of (M, N) (and ldc on the
//    blocked path) only.
//  * Each tile is one primitive execution over the full K. Its primitive is created with
//    OpenMP's nthreads ICV set to 1 on the creating thread, so oneDNN's configuration
//    (blocking, and in particular any split of K across threads, which would change the
//    summation order) is the single-thread one whatever OMP_NUM_THREADS says. oneDNN 2.6
//    takes the thread count at creation from omp_get_max_threads() (dnnl_get_max_threads /
//    dnnl_get_current_num_threads in src/common/dnnl_thread.hpp).
//  * The tile executions run inside our OpenMP loop. oneDNN's parallel() runs its work
//    sequentially in the calling thread when omp_in_parallel() is true or when its thread
//    count is 1 (adjust_num_threads), so every tile is computed by one thread with the
//    configuration above. tests/gemm/test_gemm.cpp checks 1, 2 and 3 threads bit for bit.
//  * The scratchpad is user-managed (one buffer per OpenMP thread), so concurrent executions
//    of one primitive share no memory.
namespace {
constexpr int64_t kBf16TileM = 256;
constexpr int64_t kBf16TileN = 512;
// gemm_block_scaled's tiles: smaller, so that the wgrad GEMMs of narrow linears (outputs of
// 256 × 256) still give every thread of a small machine a tile (docs/gemm.md "Decoded FP4 on
// the BF16 GEMM").
constexpr int64_t kScaledTileM = 128;
constexpr int64_t kScaledTileN = 256;
// An output of fewer than this many kBf16TileM × kBf16TileN tiles is "small" (bf16_tile).
constexpr int64_t kSmallOutputTiles = 16;
// oneDNN implementation used for every tile: its BF16 GEMM ("gemm:jit", AVX512_BF16 dot
// products). oneDNN 2.6 offers its AMX brgemm matmul only when all three tile matrices are
// dense, i.e. for some tile shapes and strides and not others; pinning one implementation keeps
// the numerics (summation order, subnormal handling) the same for every shape and stride.
// On a CPU without it, the first implementation oneDNN offers is used.
constexpr const char* kBf16Impl = "gemm:jit";
// The blocked path (Bf16GemmPath::Blocked) takes oneDNN's brgemm matmul ("brg:avx512_core_bf16",
// "brg:avx512_core_amx_bf16" on AMX), which oneDNN 2.6 offers only for dense A and C tiles and
// weights in its own blocked layout; any other implementation is refused.
constexpr const char* kBlockedImplPrefix = "brg:";

void check(dnnl_status_t st, const char* what) {
  if (st != dnnl_success)
    throw std::runtime_error(std::string("oneDNN ") + what + " failed with status " +
                             std::to_string(int(st)) + " (fp4::gemm_bf16)");
}

dnnl_engine_t bf16_engine() {
  static dnnl_engine_t eng = [] {
    apply_isa_cap();
    dnnl_engine_t e = nullptr;
    check(dnnl_engine_create(&e, dnnl_cpu, 0), "engine creation");
    return e;
  }();
  return eng;
}

// One matmul primitive for an [mb, nb] tile over K with the given transposes and strides.
// Memory objects of one primitive for one OpenMP thread slot, created with the primitive
// and re-pointed per call (dnnl_memory_set_data_handle), so that running a tile allocates
// nothing of ours.
struct Bf16Mems {
  dnnl_memory_t a = nullptr, b = nullptr, c = nullptr, s = nullptr;
  dnnl_memory_t r = nullptr;  // blocked path: the reorder's source (a plain op(B) panel)
};

struct Bf16Prim {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_desc_t a_md{}, b_md{}, c_md{}, scratch_md{};
  size_t scratch_bytes = 0;
  std::string impl;
  std::vector<Bf16Mems> mems;  // per thread slot (thread_slot())
  // Blocked path: b_md is oneDNN's blocked weight layout (b_bytes bytes per panel), and
  // `reorder` copies a plain op(B) panel (r_md: K × nb with the call's strides) into it.
  dnnl_primitive_t reorder = nullptr;
  dnnl_memory_desc_t r_md{};
  size_t b_bytes = 0;
  // b_md is BA16a<vnni_nblk>b2a, which detail::pack_bf16_vnni writes; else 0
  int64_t vnni_nblk = 0;
  ~Bf16Prim();  // defined after destroy_mems
};

// A primitive's key: mb, nb, K, ta, tb, lda, ldb, ldc, accumulate, blocked, nblk.
//  - native path (blocked = 0): the tile's shape, transposes and strides; nblk = 0.
//  - blocked path (blocked = 1, see blocked_key): dense A and C (ta = 0, lda = K, ldc = nb); tb = 0
//    and ldb that of the plain panel the fallback reorder reads; the sum post-op only for a tile
//    written in place (gemm_bf16_blocked); weights in BA16a<nblk>b2a for nblk > 0 where oneDNN's
//    brgemm takes that layout, else (and for nblk = 0) in the layout oneDNN picks.
using Bf16Key = std::array<int64_t, 11>;

// Sets omp_get_max_threads() to 1 on this thread for the scope (oneDNN's creation-time thread
// count), restoring it after.
struct OneThreadScope {
  int saved = omp_get_max_threads();
  OneThreadScope() { omp_set_num_threads(1); }
  ~OneThreadScope() { omp_set_num_threads(saved); }
};

// Whether BA16a<nblk>b2a is a layout detail::pack_bf16_vnni writes (and oneDNN names).
bool is_vnni_nblk(int64_t nblk) { return nblk == 16 || nblk == 32 || nblk == 48 || nblk == 64; }

// The column block nblk when md, the blocked weights of a [K, nb] panel, is exactly the layout
// detail::pack_bf16_vnni writes (BA16a<nblk>b2a, dense, no offset or extra data); else 0, and
// the panel is reordered by oneDNN. Read from oneDNN 2.6's public memory descriptor fields.
int64_t vnni_block_of(const dnnl_memory_desc_t& md, int64_t K, int64_t nb) {
  const dnnl_blocking_desc_t& bl = md.format_desc.blocking;
  if (md.ndims != 2 || md.format_kind != dnnl_blocked || md.data_type != dnnl_bf16 ||
      md.offset0 != 0 || md.extra.flags != 0 || bl.inner_nblks != 3)
    return 0;
  const int64_t nblk = bl.inner_blks[1];
  const int64_t Kpad = round_up(K, 32), Npad = nblk > 0 ? round_up(nb, nblk) : 0;
  const bool ok = bl.inner_idxs[0] == 0 && bl.inner_blks[0] == 16 && bl.inner_idxs[1] == 1 &&
                  is_vnni_nblk(nblk) && bl.inner_idxs[2] == 0 && bl.inner_blks[2] == 2 &&
                  md.dims[0] == K && md.dims[1] == nb && md.padded_dims[0] == Kpad &&
                  md.padded_dims[1] == Npad && md.padded_offsets[0] == 0 &&
                  md.padded_offsets[1] == 0 && bl.strides[0] == 32 * nblk &&
                  bl.strides[1] == Kpad * nblk &&
                  dnnl_memory_desc_get_size(&md) == size_t(Kpad * Npad) * sizeof(uint16_t);
  return ok ? nblk : 0;
}

// oneDNN's format tag of the layout BA16a<nblk>b2a (nblk 16, 32, 48 or 64), or, for 0, "any"
// (oneDNN picks the layout).
dnnl_format_tag_t vnni_tag(int64_t nblk) {
  switch (nblk) {
    case 0:
      return dnnl_format_tag_any;
    case 16:
      return dnnl_BA16a16b2a;
    case 32:
      return dnnl_BA16a32b2a;
    case 48:
      return dnnl_BA16a48b2a;
    case 64:
      return dnnl_BA16a64b2a;
  }
  throw std::logic_error("fp4::gemm_bf16 (blocked path): no layout BA16a" + std::to_string(nblk) +
                         "b2a");
}

// The matmul primitive descriptor for p's a_md, b_md, c_md (and the sum post-op for acc): the
// native path's kBf16Impl where oneDNN offers it, else its first implementation; the blocked
// path's brgemm ("brg:") or none (dnnl_unimplemented). Created for one thread.
dnnl_status_t find_matmul_pd(const Bf16Prim& p, bool acc, bool blocked,
                             dnnl_primitive_desc_t* out) {
  *out = nullptr;
  dnnl_matmul_desc_t md;
  dnnl_status_t st = dnnl_matmul_desc_init(&md, &p.a_md, &p.b_md, nullptr, &p.c_md);
  dnnl_primitive_attr_t attr = nullptr;
  if (st == dnnl_success) st = dnnl_primitive_attr_create(&attr);
  dnnl_post_ops_t po = nullptr;
  if (st == dnnl_success)
    st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (st == dnnl_success && acc) {
    st = dnnl_post_ops_create(&po);
    if (st == dnnl_success) st = dnnl_post_ops_append_sum(po, 1.f);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, po);
  }
  dnnl_primitive_desc_t pd = nullptr;
  if (st == dnnl_success) {
    OneThreadScope one;
    dnnl_primitive_desc_iterator_t it = nullptr;
    st = dnnl_primitive_desc_iterator_create(&it, &md, attr, bf16_engine(), nullptr);
    for (dnnl_status_t more = st; more == dnnl_success;
         more = dnnl_primitive_desc_iterator_next(it)) {
      dnnl_primitive_desc_t cand = dnnl_primitive_desc_iterator_fetch(it);
      if (!cand) continue;
      const char* name = nullptr;
      dnnl_primitive_desc_query(cand, dnnl_query_impl_info_str, 0, &name);
      const bool wanted = name && (blocked ? std::strncmp(name, kBlockedImplPrefix,
                                                          std::strlen(kBlockedImplPrefix)) == 0
                                           : std::strcmp(name, kBf16Impl) == 0);
      if (blocked && !wanted) {  // the blocked path runs brgemm or nothing
        dnnl_primitive_desc_destroy(cand);
        continue;
      }
      if (!pd || wanted) {
        if (pd) dnnl_primitive_desc_destroy(pd);
        pd = cand;
        if (wanted) break;
      } else {
        dnnl_primitive_desc_destroy(cand);
      }
    }
    if (it) dnnl_primitive_desc_iterator_destroy(it);
    if (st == dnnl_success && !pd) st = dnnl_unimplemented;
  }
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  *out = pd;
  return st;
}

std::unique_ptr<Bf16Prim> make_bf16_prim(const Bf16Key& k) {
  const int64_t mb = k[0], nb = k[1], K = k[2], lda = k[5], ldb = k[6], ldc = k[7];
  const bool ta = k[3], tb = k[4], acc = k[8], blocked = k[9];
  const int64_t nblk = k[10];
  auto p = std::make_unique<Bf16Prim>();
  const dnnl_dims_t a_dims = {mb, K}, b_dims = {K, nb}, c_dims = {mb, nb};
  const dnnl_dims_t a_str = {ta ? 1 : lda, ta ? lda : 1};
  const dnnl_dims_t b_str = {tb ? 1 : ldb, tb ? ldb : 1};
  const dnnl_dims_t c_str = {ldc, 1};
  check(dnnl_memory_desc_init_by_strides(&p->a_md, 2, a_dims, dnnl_bf16, a_str), "A desc");
  if (blocked) {  // weights in BA16a<nblk>b2a or oneDNN's choice; the reorder's source is plain
    check(dnnl_memory_desc_init_by_tag(&p->b_md, 2, b_dims, dnnl_bf16, vnni_tag(nblk)), "B desc");
    check(dnnl_memory_desc_init_by_strides(&p->r_md, 2, b_dims, dnnl_bf16, b_str), "B panel desc");
  } else {
    check(dnnl_memory_desc_init_by_strides(&p->b_md, 2, b_dims, dnnl_bf16, b_str), "B desc");
  }
  check(dnnl_memory_desc_init_by_strides(&p->c_md, 2, c_dims, dnnl_f32, c_str), "C desc");
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_status_t st = find_matmul_pd(*p, acc, blocked, &pd);
  if (blocked && nblk > 0 && st == dnnl_unimplemented) {  // brgemm refuses that layout
    check(dnnl_memory_desc_init_by_tag(&p->b_md, 2, b_dims, dnnl_bf16, dnnl_format_tag_any),
          "B desc");
    st = find_matmul_pd(*p, acc, blocked, &pd);
  }
  check(st, "matmul primitive descriptor creation");
  const char* impl = nullptr;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  p->impl = impl ? impl : "?";
  const dnnl_memory_desc_t* smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (smd) {
    p->scratch_md = *smd;
    p->scratch_bytes = dnnl_memory_desc_get_size(smd);
  }
  if (blocked) {
    p->b_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    p->b_bytes = dnnl_memory_desc_get_size(&p->b_md);
    p->vnni_nblk = vnni_block_of(p->b_md, K, nb);
  }
  {
    OneThreadScope one;
    st = dnnl_primitive_create(&p->prim, pd);
  }
  dnnl_primitive_desc_destroy(pd);
  check(st, "matmul primitive creation");
  if (blocked) {
    OneThreadScope one;  // a single-threaded reorder (it runs inside our loop over panels)
    dnnl_primitive_desc_t rpd = nullptr;
    check(dnnl_reorder_primitive_desc_create(&rpd, &p->r_md, bf16_engine(), &p->b_md, bf16_engine(),
                                             nullptr),
          "reorder primitive descriptor creation");
    st = dnnl_primitive_create(&p->reorder, rpd);
    dnnl_primitive_desc_destroy(rpd);
    check(st, "reorder primitive creation");
  }
  return p;
}

// Creates in m the memory objects (no data yet) of p's arguments: A, B, C, the scratchpad when p
// has one, and the reorder's source when p is a blocked-path primitive. Returns the first failing
// status (m then holds what was made; destroy_mems releases it).
dnnl_status_t create_mems(const Bf16Prim& p, Bf16Mems& m) {
  const dnnl_engine_t e = bf16_engine();
  dnnl_status_t st = dnnl_memory_create(&m.a, &p.a_md, e, DNNL_MEMORY_NONE);
  if (st == dnnl_success) st = dnnl_memory_create(&m.b, &p.b_md, e, DNNL_MEMORY_NONE);
  if (st == dnnl_success) st = dnnl_memory_create(&m.c, &p.c_md, e, DNNL_MEMORY_NONE);
  if (st == dnnl_success && p.scratch_bytes > 0)
    st = dnnl_memory_create(&m.s, &p.scratch_md, e, DNNL_MEMORY_NONE);
  if (st == dnnl_success && p.reorder) st = dnnl_memory_create(&m.r, &p.r_md, e, DNNL_MEMORY_NONE);
  return st;
}

void destroy_mems(Bf16Mems& m) {
  for (dnnl_memory_t* x : {&m.a, &m.b, &m.c, &m.s, &m.r}) {
    if (*x) dnnl_memory_destroy(*x);
    *x = nullptr;
  }
}

Bf16Prim::~Bf16Prim() {
  for (Bf16Mems& m : mems) destroy_mems(m);
  if (prim) dnnl_primitive_destroy(prim);
  if (reorder) dnnl_primitive_destroy(reorder);
}

// Process-wide cache; entries are never removed, so returned pointers stay valid.
const Bf16Prim& bf16_prim(const Bf16Key& k) {
  static std::mutex mu;
  static std::map<Bf16Key, std::unique_ptr<Bf16Prim>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[k];
  if (!slot) {
    slot = make_bf16_prim(k);
    // Memory objects for as many thread slots as the OpenMP team can have, made now rather
    // than at a thread's first tile (which would allocate mid-training); a thread beyond
    // them gets temporary ones per tile.
    const int slots = std::max(omp_get_max_threads(), omp_get_num_procs());
    slot->mems.resize(size_t(slots));
    for (Bf16Mems& m : slot->mems) check(create_mems(*slot, m), "memory creation");
  }
  return *slot;
}

thread_local bool g_in_execute = false;  // detail::in_onednn_execute

// Per-thread execution state: a stream and the scratchpad buffer.
struct Bf16Thread {
  dnnl_stream_t stream = nullptr;
  std::vector<unsigned char> scratch;
  Bf16Thread() { check(dnnl_stream_create(&stream, bf16_engine(), dnnl_stream_default_flags),
                       "stream creation"); }
  ~Bf16Thread() {
    if (stream) dnnl_stream_destroy(stream);
  }
};

// This thread's slot among the per-thread memory objects of every primitive: numbered in the
// order threads first run a tile (OpenMP's pool threads persist, so after the first GEMM the
// same few slots serve every call; concurrent callers from other threads get other slots).
int thread_slot() {
  static std::atomic<int> next{0};
  thread_local const int slot = next.fetch_add(1);
  return slot;
}

// This thread's oneDNN stream and scratchpad buffer (one per thread, for tiles and reorders).
Bf16Thread& bf16_thread() {
  thread_local Bf16Thread t;
  return t;
}

// Makes this thread's stream and grows its scratchpad buffer to the largest of the call's
// primitives (prims[row][column]: [last row of tiles][last column of tiles]), before the call's
// tile loop. The loops hand out tiles dynamically, so a thread may run its first tile of a
// primitive only in a later call; growing the buffer there would allocate in a training step's
// steady state (tests/nn/test_alloc.cpp), where every thread of the team enters the loop.
void reserve_bf16_thread(const Bf16Prim* const (&prims)[2][2]) {
  size_t bytes = 0;
  for (const auto& row : prims)
    for (const Bf16Prim* p : row) bytes = std::max(bytes, p ? p->scratch_bytes : size_t{0});
  Bf16Thread& t = bf16_thread();
  if (bytes > t.scratch.size()) t.scratch.resize(bytes);
}

// Runs primitive `prim` with `args` on this thread's stream and waits for it.
dnnl_status_t execute(dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t* args) {
  Bf16Thread& t = bf16_thread();
  g_in_execute = true;
  dnnl_status_t st = dnnl_primitive_execute(prim, t.stream, nargs, args);
  g_in_execute = false;
  if (st == dnnl_success) st = dnnl_stream_wait(t.stream);
  return st;
}

// Thread slot `slot`'s memory objects of p in *m, or, for a slot beyond those made with the
// primitive (a larger team), temporaries made in tmp, which the caller releases (destroy_mems).
dnnl_status_t slot_mems(const Bf16Prim& p, int slot, Bf16Mems& tmp, const Bf16Mems*& m) {
  if (slot >= 0 && size_t(slot) < p.mems.size()) {
    m = &p.mems[size_t(slot)];
    return dnnl_success;
  }
  m = &tmp;
  return create_mems(p, tmp);
}

// Runs one tile with thread slot `slot`'s memory objects; returns the first failing status.
dnnl_status_t run_bf16_tile(const Bf16Prim& p, int slot, const void* a, const void* b, float* c) {
  Bf16Thread& t = bf16_thread();
  if (p.scratch_bytes > t.scratch.size()) t.scratch.resize(p.scratch_bytes);
  Bf16Mems tmp;
  const Bf16Mems* m = nullptr;
  dnnl_status_t st = slot_mems(p, slot, tmp, m);
  if (st == dnnl_success) st = dnnl_memory_set_data_handle(m->a, const_cast<void*>(a));
  if (st == dnnl_success) st = dnnl_memory_set_data_handle(m->b, const_cast<void*>(b));
  if (st == dnnl_success) st = dnnl_memory_set_data_handle(m->c, c);
  if (st == dnnl_success && m->s) st = dnnl_memory_set_data_handle(m->s, t.scratch.data());
  if (st == dnnl_success) {
    const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m->a}, {DNNL_ARG_WEIGHTS, m->b},
                                     {DNNL_ARG_DST, m->c}, {DNNL_ARG_SCRATCHPAD, m->s}};
    st = execute(p.prim, m->s ? 4 : 3, args);
  }
  destroy_mems(tmp);
  return st;
}

// Blocked path: reorders the plain op(B) panel at src into the blocked layout at dst with thread
// slot `slot`'s memory objects (as run_bf16_tile); returns the first failing status.
dnnl_status_t run_reorder(const Bf16Prim& p, int slot, const void* src, void* dst) {
  Bf16Mems tmp;
  const Bf16Mems* m = nullptr;
  dnnl_status_t st = slot_mems(p, slot, tmp, m);
  if (st == dnnl_success) st = dnnl_memory_set_data_handle(m->r, const_cast<void*>(src));
  if (st == dnnl_success) st = dnnl_memory_set_data_handle(m->b, dst);
  if (st == dnnl_success) {
    const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, m->r}, {DNNL_ARG_TO, m->b}};
    st = execute(p.reorder, 2, args);
  }
  destroy_mems(tmp);
  return st;
}

void check_bf16_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                     const float* C, int64_t ldc) {
  auto bad = [&](const std::string& what) {
    throw std::invalid_argument("fp4::gemm_bf16: " + what + " (M=" + std::to_string(M) +
                                ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")");
  };
  if (K < 0) bad("negative K");
  if (!C) bad("C is null");
  if (ldc < N) bad("ldc = " + std::to_string(ldc) + " < N");
  if (K == 0) return;
  if (!A || !B) bad("A or B is null");
  const int64_t min_lda = trans_a ? M : K, min_ldb = trans_b ? K : N;
  if (lda < min_lda) bad("lda = " + std::to_string(lda) + " < " + std::to_string(min_lda));
  if (ldb < min_ldb) bad("ldb = " + std::to_string(ldb) + " < " + std::to_string(min_ldb));
}

Bf16Key bf16_key(bool ta, bool tb, int64_t mb, int64_t nb, int64_t K, int64_t lda, int64_t ldb,
                 int64_t ldc, bool acc) {
  return {mb, nb, K, ta, tb, lda, ldb, ldc, acc, 0, 0};
}
// The blocked path's primitive for an [mb, nb] tile over K: dense A [mb, K] and C [mb, nb],
// weights in oneDNN's layout. Where detail::pack_bf16_vnni cannot write that layout, the
// panels are reordered by oneDNN from op(B) read with (tb, ldb); a transposed op(B) panel is
// first copied dense ([K, nb], by transpose_bf16), so the reorder always reads a plain panel
// (tb = 0, ldb = nb): oneDNN 2.6's reorder from the transposed layout into its blocked one ran
// about 5× slower than from the plain one (docs/gemm.md "The blocked path
// (`FP4_BF16_GEMM=blocked`)"). The weights in BA16a<nblk>b2a where brgemm takes it (nblk > 0),
// else in the layout oneDNN picks.
Bf16Key blocked_key(bool tb, int64_t mb, int64_t nb, int64_t K, int64_t ldb, bool acc,
                    int64_t nblk) {
  return {mb, nb, K, 0, 0, K, tb ? nb : ldb, nb, acc, 1, nblk};
}

// The column block the blocked path asks oneDNN for (detail::set_bf16_blocked_nblk): 64, the one
// oneDNN 2.6.3 picks itself for brgemm on AVX512-BF16, and on AMX but for a tile that is a single
// block of at most 64 × 64, where its heuristic (brgemm_matmul_utils.cpp,
// compute_blocking_heuristic_amx) may narrow it to 48 or 32 (and, for panels of 33 to 63
// columns, to a width with no layout, refusing brgemm). Asked for, the layout is fixed and the
// heuristic keeps it, so every tile of a call takes one layout, which pack_bf16_vnni writes.
std::atomic<int64_t> blocked_nblk{64};
}  // namespace

// ------------------------------------------------------------------------------------------
// BF16 GEMM, widened path: for CPUs where oneDNN has no BF16 matmul (oneDNN 2.6 has none below
// AVX512_CORE, e.g. AMD Zen 3 with AVX2 only, or ONEDNN_MAX_CPU_ISA=AVX2).
//
// Same tiles as the native path; for each tile the BF16 rows of op(A) and columns of op(B) it
// reads are widened to FP32 (exact: a BF16 value is the top half of its FP32 value) into
// per-thread buffers kept across calls, then one single-threaded oneDNN sgemm runs on them
// (called inside our OpenMP loop, oneDNN's sgemm runs in the calling thread, as fp4::sgemm
// relies on). Each product of two BF16 values has at most 8 + 8 significant bits, so it is
// exact in FP32 whether the kernel uses FMA or multiply-then-add; the sum is FP32 in
// oneDNN's (fixed, single-thread) order, so the contract of fp4/gemm/gemm.h holds. Unlike the
// AVX512_BF16 instructions, subnormal inputs and results are kept (IEEE FP32 arithmetic).
namespace {
void widen_bf16(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  // dst [rows, cols] dense, from src rows of stride ld. Bit shift: exact, no rounding.
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * ld;
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + r * cols);
    for (int64_t c = 0; c < cols; ++c) d[c] = uint32_t(s[c]) << 16;
  }
}

struct WidenScratch {
  std::vector<float> a, b;
};

// This thread's widening buffers, grown (never shrunk) to hold na and nb floats. gemm_bf16
// grows them in every thread of its team before the first tile, whether or not the thread
// then gets a tile, so a thread that first gets a tile in a later step (dynamic schedule,
// more threads than tiles) does not allocate mid-training.
WidenScratch& widen_scratch(size_t na, size_t nb) {
  thread_local WidenScratch w;
  if (w.a.size() < na) w.a.resize(na);
  if (w.b.size() < nb) w.b.resize(nb);
  return w;
}

dnnl_status_t run_widened_tile(bool ta, bool tb, int64_t mb, int64_t nb, int64_t K,
                               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                               bool acc, float* c, int64_t ldc) {
  WidenScratch& w = widen_scratch(size_t(mb * K), size_t(nb * K));
  // op(A) tile: ta ? A stored [K, M] (columns i0.. of K rows) : [M, K] (rows i0..).
  if (ta) widen_bf16(a, K, mb, lda, w.a.data());
  else widen_bf16(a, mb, K, lda, w.a.data());
  // op(B) tile: tb ? B stored [N, K] (rows j0..) : [K, N] (columns j0.. of K rows).
  if (tb) widen_bf16(b, nb, K, ldb, w.b.data());
  else widen_bf16(b, K, nb, ldb, w.b.data());
  return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', mb, nb, K, 1.f, w.a.data(), ta ? mb : K,
                    w.b.data(), tb ? K : nb, acc ? 1.f : 0.f, c, ldc);
}

// Which path gemm_bf16 takes, chosen once per process (see gemm_bf16_path).
std::atomic<int> g_bf16_path{-1};

bool native_bf16_offered() {
  static const bool ok = [] {
    try {
      // Any shape: oneDNN either has a BF16 matmul for this CPU (and ISA cap) or has none.
      (void)bf16_prim(bf16_key(false, false, 16, 16, 32, 32, 16, 16, false));
      return true;
    } catch (const std::runtime_error&) {
      return false;
    }
  }();
  return ok;
}

bool blocked_bf16_offered() {
  static const bool ok = [] {
    if (!native_bf16_offered()) return false;
    try {
      (void)bf16_prim(blocked_key(false, 16, 16, 32, 16, false, 0));
      return true;
    } catch (const std::runtime_error&) {
      return false;
    }
  }();
  return ok;
}

const char* onednn_isa_name(dnnl_cpu_isa_t isa);

// Why this CPU (and ISA cap) cannot run `path`, or "" when it can (the widened path always can).
std::string unavailable(Bf16GemmPath path) {
  apply_isa_cap();  // before the ISA query below: a query first would make oneDNN refuse the cap
  const bool native = path == Bf16GemmPath::Native, blocked = path == Bf16GemmPath::Blocked;
  if ((!native || native_bf16_offered()) && (!blocked || blocked_bf16_offered())) return "";
  return std::string("oneDNN offers no ") + (native ? "native BF16" : "brgemm BF16") +
         " matmul on this CPU (ISA " + onednn_isa_name(dnnl_get_effective_cpu_isa()) +
         (native ? "; needs AVX512_CORE or better" : "; needs AVX512_CORE_BF16 or AMX") +
         ", and no ONEDNN_MAX_CPU_ISA or FP4_MAX_CPU_ISA below it)";
}

// FP4_BF16_GEMM, read once: the path it asks for, or -1 (unset or empty: the default).
// Throws std::runtime_error naming the variable for any other value or an unavailable path.
int requested_bf16_path() {
  const char* v = std::getenv("FP4_BF16_GEMM");
  if (!v || !*v) return -1;
  const std::string s(v);
  Bf16GemmPath path;
  if (s == "widened") path = Bf16GemmPath::Widened;
  else if (s == "native") path = Bf16GemmPath::Native;
  else if (s == "blocked") path = Bf16GemmPath::Blocked;
  else
    throw std::runtime_error("FP4_BF16_GEMM='" + s +
                             "': expected native, blocked or widened (or unset for the default)");
  if (const std::string why = unavailable(path); !why.empty())
    throw std::runtime_error("FP4_BF16_GEMM=" + s + ": " + why);
  return int(path);
}

// Whether Native is this CPU's default (docs/gemm.md "Which path a CPU takes"): oneDNN offers
// it, and the CPU's BF16 units outrun its FP32 FMAs. They do with AMX tiles, and with
// AVX512-BF16 on AMD's cores (Zen 4: oneDNN's BF16 matmul 2.1–2.3× its sgemm). On an Intel
// core without AMX (measured: family 6 model 207, its hypervisor hiding AMX) VDPBF16PS issued
// once every two cycles and FP32 FMAs twice per cycle, a BF16 peak of half the FP32 one: there
// oneDNN's BF16 matmul ran at 0.60–0.65 of its sgemm, and the widened path is the faster one. The choice
// follows the CPU and the ISA caps only (never a timing), so a machine's bits stay fixed.
// Decided once per process, like native_bf16_offered.
bool native_bf16_default() {
  static const bool fast = [] {
    if (!native_bf16_offered()) return false;
    apply_isa_cap();
    const unsigned isa = unsigned(dnnl_get_effective_cpu_isa());
    auto has = [isa](dnnl_cpu_isa_t x) { return (isa & unsigned(x)) == unsigned(x); };
    if (has(dnnl_cpu_isa_avx512_core_amx)) return true;
    __builtin_cpu_init();
    return has(dnnl_cpu_isa_avx512_core_bf16) && __builtin_cpu_is("amd");
  }();
  return fast;
}

Bf16GemmPath chosen_bf16_path() {
  int p = g_bf16_path.load(std::memory_order_acquire);
  if (p < 0) {
    p = requested_bf16_path();
    if (p < 0) p = int(native_bf16_default() ? Bf16GemmPath::Native : Bf16GemmPath::Widened);
    int expected = -1;
    if (!g_bf16_path.compare_exchange_strong(expected, p)) p = expected;
  }
  return Bf16GemmPath(p);
}

const char* onednn_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "all";
  }
}
}  // namespace

bool gemm_bf16_native_available() { return native_bf16_offered(); }

bool gemm_bf16_blocked_available() { return blocked_bf16_offered(); }

std::string gemm_bf16_env_error() {
  try {
    (void)requested_bf16_path();
    return "";
  } catch (const std::runtime_error& e) {
    return e.what();
  }
}

Bf16GemmPath gemm_bf16_path() { return chosen_bf16_path(); }

void gemm_bf16_set_path(Bf16GemmPath path) {
  if (const std::string why = unavailable(path); !why.empty())
    throw std::runtime_error("fp4::gemm_bf16_set_path: " + why);
  g_bf16_path.store(int(path), std::memory_order_release);
}

std::string gemm_fp32_description() {
  apply_isa_cap();
  return std::string("oneDNN ") + std::to_string(DNNL_VERSION_MAJOR) + "." +
         std::to_string(DNNL_VERSION_MINOR) + " sgemm, ISA " +
         onednn_isa_name(dnnl_get_effective_cpu_isa());
}

std::string gemm_bf16_description() {
  if (chosen_bf16_path() == Bf16GemmPath::Blocked)
    return std::string("blocked: oneDNN BF16 brgemm matmul, weights in its blocked layout (") +
           gemm_bf16_impl(false, false, 16, 16, 32, 32, 16, 16, false) + ")";
  if (chosen_bf16_path() == Bf16GemmPath::Native)
    return std::string("native: oneDNN BF16 matmul (") +
           gemm_bf16_impl(false, false, 16, 16, 32, 32, 16, 16, false) + ")";
  // A fact of the CPU, however the widened path was chosen (default, FP4_BF16_GEMM, set_path).
  const bool slower_native = native_bf16_offered() && !native_bf16_default();
  return "widened: BF16 operands widened to FP32, oneDNN sgemm (ISA " +
         std::string(onednn_isa_name(dnnl_get_effective_cpu_isa())) +
         (slower_native ? "; faster here than the native BF16 matmul" : "") + ")";
}

namespace detail {
void transpose_bf16_ref(const uint16_t* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst,
                        int64_t ldd) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
}

namespace {
// One 8 × 8 block: eight 16-byte row loads, three rounds of SSE2 unpacks (16-, 32-, 64-bit
// interleaves), eight 16-byte row stores. SSE2 is part of x86-64, so every CPU runs it.
inline void transpose8x8_bf16(const uint16_t* s, int64_t lds, uint16_t* d, int64_t ldd) {
  __m128i r[8], a[8], b[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * lds));
  for (int k = 0; k < 4; ++k) {  // a[2k], a[2k+1]: rows 2k, 2k+1 interleaved by element
    a[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 2; ++k) {  // pairs of element pairs: rows 4k .. 4k+3
    b[4 * k] = _mm_unpacklo_epi32(a[4 * k], a[4 * k + 2]);
    b[4 * k + 1] = _mm_unpackhi_epi32(a[4 * k], a[4 * k + 2]);
    b[4 * k + 2] = _mm_unpacklo_epi32(a[4 * k + 1], a[4 * k + 3]);
    b[4 * k + 3] = _mm_unpackhi_epi32(a[4 * k + 1], a[4 * k + 3]);
  }
  // columns 2k and 2k+1 of the block: rows 0..3 from b[k], rows 4..7 from b[4+k]
  for (int k = 0; k < 4; ++k) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k) * ldd),
                     _mm_unpacklo_epi64(b[k], b[4 + k]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k + 1) * ldd),
                     _mm_unpackhi_epi64(b[k], b[4 + k]));
  }
}
}  // namespace

void transpose_bf16(const uint16_t* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst,
                    int64_t ldd) {
  // Blocks of 8 × 8 kernels: 64 × 16 for a tall source, else 32 × 32 (the faster of 16 × 16,
  // 32 × 32, 64 × 16, 64 × 8 and 8 × 64 for the blocked path's operand shapes on an AMD EPYC
  // Zen 4, whose strides of 4 KiB multiples make taller blocks on the strided side thrash L1).
  const int64_t bi = rows > cols ? 64 : 32, bj = rows > cols ? 16 : 32;
  for (int64_t i0 = 0; i0 < rows; i0 += bi)
    for (int64_t j0 = 0; j0 < cols; j0 += bj) {
      const int64_t i1 = std::min(rows, i0 + bi), j1 = std::min(cols, j0 + bj);
      const int64_t i8 = i0 + (i1 - i0) / 8 * 8, j8 = j0 + (j1 - j0) / 8 * 8;
      for (int64_t i = i0; i < i8; i += 8)
        for (int64_t j = j0; j < j8; j += 8)
          transpose8x8_bf16(src + i * lds + j, lds, dst + j * ldd + i, ldd);
      // the ragged edges: columns j8.. of the whole rows, then rows i8.. of the block
      transpose_bf16_ref(src + i0 * lds + j8, lds, i8 - i0, j1 - j8, dst + j8 * ldd + i0, ldd);
      transpose_bf16_ref(src + i8 * lds + j0, lds, i1 - i8, j1 - j0, dst + j0 * ldd + i8, ldd);
    }
}

namespace {
// Element (k, n)'s offset in the layout BA16a<nblk>b2a of a [K, N] matrix padded to
// [round_up(K, 32), round_up(N, nblk)]: blocks of nblk columns outermost, then blocks of 32
// rows, then the 16 row pairs, the nblk columns, and the pair's two rows.
inline int64_t vnni_offset(int64_t k, int64_t n, int64_t Kpad, int64_t nblk) {
  return (n / nblk) * Kpad * nblk + (k / 32) * 32 * nblk + (k % 32) / 2 * 2 * nblk +
         (n % nblk) * 2 + k % 2;
}

// One element of op(B) [K, N], 0 outside it (the layout's padding).
inline uint16_t op_b_at(const uint16_t* B, int64_t ldb, bool trans, int64_t K, int64_t N, int64_t k,
                        int64_t n) {
  if (k >= K || n >= N) return 0;
  return trans ? B[n * ldb + k] : B[k * ldb + n];
}

// Rows k0 .. k1 of one 32-row block's worth of columns n0 .. n1, element by element.
void pack_vnni_scalar(const uint16_t* B, int64_t ldb, bool trans, int64_t K, int64_t N,
                      int64_t nblk, int64_t k0, int64_t k1, int64_t n0, int64_t n1, uint16_t* dst) {
  const int64_t Kpad = round_up(K, 32);
  for (int64_t k = k0; k < k1; ++k)
    for (int64_t n = n0; n < n1; ++n)
      dst[vnni_offset(k, n, Kpad, nblk)] = op_b_at(B, ldb, trans, K, N, k, n);
}
}  // namespace

void pack_bf16_vnni_ref(const uint16_t* B, int64_t ldb, bool trans, int64_t K, int64_t N,
                        int64_t nblk, int64_t k0, int64_t k1, uint16_t* dst) {
  pack_vnni_scalar(B, ldb, trans, K, N, nblk, k0, k1, 0, round_up(N, nblk), dst);
}

void pack_bf16_vnni(const uint16_t* B, int64_t ldb, bool trans, int64_t K, int64_t N, int64_t nblk,
                    int64_t k0, int64_t k1, uint16_t* dst) {
  const int64_t Kpad = round_up(K, 32), Npad = round_up(N, nblk);
  for (int64_t kb = k0; kb < k1; kb += 32) {
    if (kb + 32 > K) {  // the block holding K's end: element by element, zeros past K
      pack_vnni_scalar(B, ldb, trans, K, N, nblk, kb, kb + 32, 0, Npad, dst);
      continue;
    }
    int64_t nv = 0;  // columns done with vectors
    if (!trans) {
      // Row pair (kb + 2p, kb + 2p + 1): 8 columns of each, interleaved by element, are 16
      // consecutive values of the pair's run of 2·nblk.
      nv = N / 8 * 8;
      for (int64_t p = 0; p < 16; ++p) {
        const uint16_t* r0 = B + (kb + 2 * p) * ldb;
        const uint16_t* r1 = r0 + ldb;
        for (int64_t n = 0; n < nv; n += 8) {
          const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + n));
          const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + n));
          uint16_t* d = dst + vnni_offset(kb + 2 * p, n, Kpad, nblk);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_unpacklo_epi16(a, b));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 8), _mm_unpackhi_epi16(a, b));
        }
      }
    } else {
      // op(B)[k][n] = B[n][k]: a row pair's two values of column n are one 32-bit word of B's
      // row n. Four rows of B × four words (8 values) form a 4 × 4 transpose of 32-bit words:
      // word j of the result is row pair 4q + j's run for the four columns n .. n + 3.
      nv = N / 4 * 4;
      for (int64_t n = 0; n < nv; n += 4) {
        const uint16_t* s = B + n * ldb + kb;
        for (int64_t q = 0; q < 4; ++q) {
          const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 8 * q));
          const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + ldb + 8 * q));
          const __m128i r2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * ldb + 8 * q));
          const __m128i r3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 3 * ldb + 8 * q));
          const __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpackhi_epi32(r0, r1);
          const __m128i t2 = _mm_unpacklo_epi32(r2, r3), t3 = _mm_unpackhi_epi32(r2, r3);
          const __m128i w[4] = {_mm_unpacklo_epi64(t0, t2), _mm_unpackhi_epi64(t0, t2),
                                _mm_unpacklo_epi64(t1, t3), _mm_unpackhi_epi64(t1, t3)};
          for (int64_t j = 0; j < 4; ++j)
            _mm_storeu_si128(
                reinterpret_cast<__m128i*>(dst + vnni_offset(kb + 2 * (4 * q + j), n, Kpad, nblk)),
                w[j]);
        }
      }
    }
    // the columns left over, and the padding up to Npad
    pack_vnni_scalar(B, ldb, trans, K, N, nblk, kb, kb + 32, nv, Npad, dst);
  }
}
}  // namespace detail

namespace {
using detail::transpose_bf16;

// The blocked path's tile for an [M, N] output with leading dimension ldc, given the caller's
// tile_m × tile_n: a dense C (ldc == N) wider than tile_n is cut into tiles of whole rows, which
// brgemm writes in place (gemm_bf16_blocked), of at most the caller's tile area (rows: a multiple
// of 16, at least kMinRowTileM), so that there are at least as many tiles as the caller's shape
// gives and a many-core machine's threads stay busy; otherwise the caller's tile. A function of
// (M, N, ldc) and the caller's constants, never of the thread count.
constexpr int64_t kMinRowTileM = 32;
// Whether the blocked path's tiles of width tile_n are dense in an [., N] C with leading
// dimension ldc (whole rows of a dense C), so that brgemm writes them in place.
bool blocked_in_place(int64_t N, int64_t ldc, int64_t tile_n) { return ldc == N && tile_n >= N; }
std::pair<int64_t, int64_t> blocked_tile(int64_t N, int64_t ldc, int64_t tile_m, int64_t tile_n) {
  if (ldc == N && N > tile_n) {
    const int64_t rows = tile_m * tile_n / N / 16 * 16;
    if (rows >= kMinRowTileM) return {rows, N};
  }
  return {tile_m, tile_n};
}

// Counts the panels oneDNN's reorder wrote (detail::bf16_blocked_reorders).
std::atomic<int64_t> reorder_count{0};

// Whether the blocked path packs panels itself where the layout allows (detail::set_bf16_blocked_own_pack).
std::atomic<bool> own_pack{true};
}  // namespace

void detail::set_bf16_blocked_own_pack(bool own) { own_pack.store(own, std::memory_order_relaxed); }

void detail::set_bf16_blocked_nblk(int64_t nblk) {
  if (nblk != 0 && !is_vnni_nblk(nblk))
    throw std::invalid_argument(
        "fp4::detail::set_bf16_blocked_nblk: nblk must be 0, 16, 32, 48 "
        "or 64, not " +
        std::to_string(nblk));
  blocked_nblk.store(nblk, std::memory_order_relaxed);
}

int64_t detail::bf16_blocked_reorders() { return reorder_count.load(std::memory_order_relaxed); }

int64_t detail::bf16_blocked_vnni_block(int64_t K, int64_t nb) {
  if (K <= 0 || nb <= 0)
    throw std::invalid_argument("fp4::detail::bf16_blocked_vnni_block: K and nb must be positive");
  return bf16_prim(blocked_key(false, std::min(kScaledTileM, nb), nb, K, nb, false,
                               blocked_nblk.load(std::memory_order_relaxed)))
      .vnni_nblk;
}

namespace {

// This thread's dense C tile of the blocked path, grown (never shrunk) to nc floats.
std::vector<float>& blocked_c_tile(size_t nc) {
  thread_local std::vector<float> c;
  if (c.size() < nc) c.resize(nc);
  return c;
}

// The blocked path of gemm_bf16_tiled (Bf16GemmPath::Blocked; docs/gemm.md "The blocked path
// (`FP4_BF16_GEMM=blocked`)"). oneDNN's brgemm matmul takes its weights in its own blocked
// layout and, in oneDNN 2.6, only dense A and C tiles, so:
//   1. op(B)'s column panels (one per column of tiles) are written in that layout into a buffer
//      of the calling thread: by detail::pack_bf16_vnni, in pieces of kPackRows rows shared by
//      the threads, where the layout is BA16a<nblk>b2a (vnni_block_of), else by oneDNN's reorder,
//      one panel per task (a transposed panel copied dense first, see blocked_key); op(A) is read
//      in place when it is dense (not transposed, lda == K), else copied dense into another, one
//      row of tiles per task;
//   2. per output tile (after a barrier: every panel and row is ready), the single-threaded
//      brgemm primitive writes the tile's product into a dense per-thread tile, which is then
//      stored into C or, with accumulate, added to it (one FP32 addition per element); a tile
//      that is dense in C (whole rows, ldc == N; blocked_tile) is written in place, with
//      brgemm's sum post-op for accumulate, which is the same one addition (tested).
// Each output element is still one primitive execution over the full K, created with one thread,
// so the bits do not depend on the thread count (as the native path; see above).
void gemm_bf16_blocked(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                       bool accumulate, float* C, int64_t ldc, int64_t tile_m, int64_t tile_n) {
  std::tie(tile_m, tile_n) = blocked_tile(N, ldc, tile_m, tile_n);
  const int64_t tm = (M + tile_m - 1) / tile_m, tn = (N + tile_n - 1) / tile_n;
  const int64_t rm = M - (tm - 1) * tile_m, rn = N - (tn - 1) * tile_n;
  // Tiles spanning C's whole rows of a C with ldc == N are dense in C: brgemm writes them in
  // place (adding to C by its sum post-op: the same one FP32 addition per element), without
  // the per-thread tile and its copy, which cost as much as a short-K product.
  const bool in_place = blocked_in_place(N, ldc, tile_n);
  // Weights in BA16a<blocked_nblk>b2a (see there). One packed panel serves every row of tiles, so
  // the ragged last row takes the first row's layout, also where that one is oneDNN's choice
  // (brgemm refused BA16a<blocked_nblk>b2a, or the test hook asks for oneDNN's choice).
  const Bf16Prim* prims[2][2] = {};  // [last row of tiles][last column of tiles]
  const int64_t rows0 = std::min(tile_m, M);
  for (int j = 0; j < 2; ++j) {
    const int64_t cols = j ? rn : std::min(tile_n, N);
    prims[0][j] = &bf16_prim(blocked_key(trans_b, rows0, cols, K, ldb, in_place && accumulate,
                                         blocked_nblk.load(std::memory_order_relaxed)));
    prims[1][j] = rm == rows0
                      ? prims[0][j]
                      : &bf16_prim(blocked_key(trans_b, rm, cols, K, ldb, in_place && accumulate,
                                               prims[0][j]->vnni_nblk));
  }
  for (int j = 0; j < 2; ++j)
    if (!dnnl_memory_desc_equal(&prims[0][j]->b_md, &prims[1][j]->b_md))
      throw std::logic_error("fp4::gemm_bf16 (blocked path): oneDNN's weight layout depends on "
                             "the tile's rows (M=" + std::to_string(M) + ", N=" +
                             std::to_string(N) + ", K=" + std::to_string(K) + ")");
  // 1. the panels, 64-byte aligned, panel tj at packed + tj · stride
  const size_t stride = (std::max(prims[0][0]->b_bytes, prims[0][1]->b_bytes) + 63) / 64 * 64;
  thread_local std::vector<unsigned char> packed_buf;
  if (packed_buf.size() < stride * size_t(tn) + 64) packed_buf.resize(stride * size_t(tn) + 64);
  unsigned char* packed = packed_buf.data() +
                          (64 - reinterpret_cast<uintptr_t>(packed_buf.data()) % 64) % 64;
  thread_local std::vector<uint16_t> bt_buf;  // a transposed op(B) panel copied dense: [K, nb]
  const bool a_dense = !trans_a && lda == K;
  thread_local std::vector<uint16_t> a_buf;  // op(A) dense, when it is not in place
  if (!a_dense && a_buf.size() < size_t(M * K)) a_buf.resize(size_t(M * K));
  uint16_t* Ad = a_buf.data();
  const size_t nc = in_place ? 0 : size_t(std::min(tile_m, M) * std::min(tile_n, N));
  std::atomic<int> failures{0};
  // A tile of a panel whose reorder failed is skipped. Per calling thread, grown only when too
  // small: the steady state allocates nothing (tests/nn/test_alloc.cpp).
  thread_local std::vector<char> panel_ok_buf;
  if (panel_ok_buf.size() < size_t(tn)) panel_ok_buf.resize(size_t(tn));
  char* const panel_ok = panel_ok_buf.data();
  std::fill(panel_ok, panel_ok + tn, char{1});
  dnnl_status_t first_error = dnnl_success;
  auto note = [&](dnnl_status_t st) {
    if (st == dnnl_success) return;
    failures.fetch_add(1, std::memory_order_relaxed);
#pragma omp critical
    first_error = st;
  };
  // Panels in oneDNN's layout BA16a<nblk>b2a are packed by pack_bf16_vnni in pieces of
  // kPackRows rows of op(B), so that a single panel's packing is shared by the threads (64: small
  // enough that one short panel still gives every thread work); each panel with its own nblk.
  const bool own = own_pack.load(std::memory_order_relaxed) && prims[0][0]->vnni_nblk &&
                   prims[0][1]->vnni_nblk;
  constexpr int64_t kPackRows = 64;
  const int64_t Kpad = round_up(K, 32), pieces = own ? (Kpad + kPackRows - 1) / kPackRows : 1;
#pragma omp parallel
  {
    std::vector<float>& ct = blocked_c_tile(nc);
    reserve_bf16_thread(prims);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t t = 0; t < tn * pieces; ++t) {
      const int64_t tj = t / pieces, piece = t % pieces;
      const int64_t nb = std::min(tile_n, N - tj * tile_n);
      const uint16_t* b = trans_b ? B + tj * tile_n * ldb : B + tj * tile_n;
      uint16_t* dst = reinterpret_cast<uint16_t*>(packed + size_t(tj) * stride);
      if (own) {
        const int64_t k0 = piece * kPackRows, k1 = std::min(Kpad, k0 + kPackRows);
        detail::pack_bf16_vnni(b, ldb, trans_b, K, nb, prims[0][tj == tn - 1]->vnni_nblk, k0, k1,
                               dst);
        continue;
      }
      if (trans_b) {  // op(B)'s panel is rows tj·tile_n .. of B [N, K]: copy it dense, [K, nb]
        if (bt_buf.size() < size_t(K * nb)) bt_buf.resize(size_t(K * nb));
        transpose_bf16(b, ldb, nb, K, bt_buf.data(), nb);
        b = bt_buf.data();
      }
      reorder_count.fetch_add(1, std::memory_order_relaxed);
      const dnnl_status_t st = run_reorder(*prims[0][tj == tn - 1], thread_slot(), b, dst);
      note(st);
      panel_ok[size_t(tj)] = st == dnnl_success;
    }
    // op(A) dense [M, K] in Ad unless it is already (not transposed, lda == K), per row of tiles
    if (!a_dense) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t ti = 0; ti < tm; ++ti) {
        const int64_t i0 = ti * tile_m, mb = std::min(tile_m, M - i0);
        if (trans_a) {
          transpose_bf16(A + i0, lda, K, mb, Ad + i0 * K, K);
        } else {
          for (int64_t r = 0; r < mb; ++r)
            std::memcpy(Ad + (i0 + r) * K, A + (i0 + r) * lda, size_t(K) * sizeof(uint16_t));
        }
      }
    }
#pragma omp barrier
    // 2. the tiles
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tm * tn; ++t) {
      const int64_t ti = t / tn, tj = t % tn;
      const int64_t i0 = ti * tile_m, j0 = tj * tile_n;
      const int64_t mb = std::min(tile_m, M - i0), nb = std::min(tile_n, N - j0);
      if (!panel_ok[size_t(tj)]) continue;
      const uint16_t* a = a_dense ? A + i0 * lda : Ad + i0 * K;
      float* c_tile = in_place ? C + i0 * ldc : ct.data();
      const dnnl_status_t st = run_bf16_tile(*prims[ti == tm - 1][tj == tn - 1], thread_slot(), a,
                                             packed + size_t(tj) * stride, c_tile);
      note(st);
      if (st != dnnl_success || in_place) continue;
      for (int64_t r = 0; r < mb; ++r) {
        float* c = C + (i0 + r) * ldc + j0;
        const float* p = ct.data() + r * nb;
        if (accumulate) {
          for (int64_t j = 0; j < nb; ++j) c[j] += p[j];
        } else {
          std::memcpy(c, p, size_t(nb) * sizeof(float));
        }
      }
    }
  }
  if (failures.load())
    throw std::runtime_error("oneDNN brgemm matmul (blocked BF16 GEMM) failed with status " +
                             std::to_string(first_error) + " (M=" + std::to_string(M) +
                             ", N=" + std::to_string(N) + ", K=" + std::to_string(K) + ")");
}

// gemm_bf16 on output tiles of tile_m × tile_n (gemm_bf16: kBf16TileM × kBf16TileN;
// gemm_block_scaled: kScaledTileM × kScaledTileN). The tile shape is a constant of the caller,
// so the bits never depend on the thread count.
void gemm_bf16_tiled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                     bool accumulate, float* C, int64_t ldc, int64_t tile_m, int64_t tile_n) {
  if (M <= 0 || N <= 0) return;
  check_bf16_args(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    return;
  }
  if (chosen_bf16_path() == Bf16GemmPath::Blocked)
    return gemm_bf16_blocked(trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, tile_m,
                             tile_n);
  const int64_t tm = (M + tile_m - 1) / tile_m, tn = (N + tile_n - 1) / tile_n;
  const int64_t tiles = tm * tn;
  int failures = 0;
  dnnl_status_t first_error = dnnl_success;
  const bool widened = chosen_bf16_path() == Bf16GemmPath::Widened;
  // Native path: at most four tile shapes (full, ragged M, ragged N, both), created here,
  // serially.
  const int64_t rm = M - (tm - 1) * tile_m, rn = N - (tn - 1) * tile_n;
  const Bf16Prim* prims[2][2] = {};  // [last row of tiles][last column of tiles]
  if (!widened)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        prims[i][j] = &bf16_prim(bf16_key(trans_a, trans_b, i ? rm : std::min(tile_m, M),
                                          j ? rn : std::min(tile_n, N), K, lda, ldb, ldc,
                                          accumulate));
  const size_t widen_a = size_t(std::min(tile_m, M) * K),
               widen_b = size_t(std::min(tile_n, N) * K);
#pragma omp parallel reduction(+ : failures)
  {
    if (widened) (void)widen_scratch(widen_a, widen_b);
    else
      reserve_bf16_thread(prims);
#pragma omp for schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t ti = t / tn, tj = t % tn;
    const int64_t i0 = ti * tile_m, j0 = tj * tile_n;
    const uint16_t* a = trans_a ? A + i0 : A + i0 * lda;
    const uint16_t* b = trans_b ? B + j0 * ldb : B + j0;
    float* c = C + i0 * ldc + j0;
    const dnnl_status_t st =
        widened ? run_widened_tile(trans_a, trans_b, std::min(tile_m, M - i0),
                                   std::min(tile_n, N - j0), K, a, lda, b, ldb, accumulate,
                                   c, ldc)
                : run_bf16_tile(*prims[ti == tm - 1][tj == tn - 1], thread_slot(), a, b, c);
    if (st != dnnl_success) {
      ++failures;
#pragma omp critical
      first_error = st;
    }
  }
  }
  if (failures)
    throw std::runtime_error(std::string(widened ? "oneDNN sgemm (widened BF16 GEMM)"
                                                 : "oneDNN BF16 matmul") +
                             " failed with status " + std::to_string(first_error) + " (M=" +
                             std::to_string(M) + ", N=" + std::to_string(N) + ", K=" +
                             std::to_string(K) + ")");
}
}  // namespace

namespace {
// gemm_bf16's output tile for an [M, N] output, a function of (M, N) and the path only:
// kBf16TileM × kBf16TileN, except that an output of fewer than kSmallOutputTiles such tiles (the
// wgrad GEMMs of narrow linears: 256 × 256 is one tile, so one thread) takes gemm_block_scaled's
// kScaledTileM × kScaledTileN on the native and blocked paths, so that a small machine's threads
// all get work. oneDNN's gemm:jit sums each element in the same order whatever the tile (checked
// bit for bit on an AMD EPYC Zen 4 at wgrad and fprop shapes up to K = 8192; the identity check
// covers the recipes, docs/gemm.md "BF16 GEMM (`gemm_bf16`)"); the widened path keeps its tiles,
// whose sgemm calls might block K by tile.
std::pair<int64_t, int64_t> bf16_tile(int64_t M, int64_t N) {
  const int64_t big = ((M + kBf16TileM - 1) / kBf16TileM) * ((N + kBf16TileN - 1) / kBf16TileN);
  if (big < kSmallOutputTiles && chosen_bf16_path() != Bf16GemmPath::Widened)
    return {kScaledTileM, kScaledTileN};
  return {kBf16TileM, kBf16TileN};
}
}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, bool accumulate, float* C,
               int64_t ldc) {
  const auto [tile_m, tile_n] = bf16_tile(M, N);
  gemm_bf16_tiled(trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, tile_m, tile_n);
}

const char* gemm_bf16_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                           int64_t lda, int64_t ldb, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0 || K <= 0)
    throw std::invalid_argument("fp4::gemm_bf16_impl: M, N and K must be positive");
  if (chosen_bf16_path() == Bf16GemmPath::Widened) return "widened:sgemm";
  const auto [tile_m, tile_n] = bf16_tile(M, N);
  if (chosen_bf16_path() == Bf16GemmPath::Blocked) {
    const auto [mb, nb] = blocked_tile(N, ldc, tile_m, tile_n);
    const bool in_place = blocked_in_place(N, ldc, nb);
    return bf16_prim(blocked_key(trans_b, std::min(mb, M), std::min(nb, N), K, ldb,
                                 in_place && accumulate,
                                 blocked_nblk.load(std::memory_order_relaxed)))
        .impl.c_str();
  }
  return bf16_prim(bf16_key(trans_a, trans_b, std::min(tile_m, M), std::min(tile_n, N), K, lda, ldb,
                            ldc, accumulate))
      .impl.c_str();
}

namespace {
// apply_decode_scales' body, compiled for AVX-512, AVX2 and baseline x86-64 (as bf16.cpp's
// kernels): FP32 → FP64 → one FP64 multiply → FP32, and one FP32 addition, all exact IEEE
// operations, so every build gives the same bits (-ffp-contract=off: the add is never fused).
struct ScaleBody {
  [[gnu::always_inline]] static inline void run(const float* P, int64_t n, double s, bool acc,
                                                float* C) {
    if (acc) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) C[i] += static_cast<float>(static_cast<double>(P[i]) * s);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) C[i] = static_cast<float>(static_cast<double>(P[i]) * s);
    }
  }
};
__attribute__((target("avx512f"))) void scale_avx512(const float* P, int64_t n, double s, bool acc,
                                                       float* C) {
  ScaleBody::run(P, n, s, acc, C);
}
__attribute__((target("avx2"))) void scale_avx2(const float* P, int64_t n, double s, bool acc,
                                                  float* C) {
  ScaleBody::run(P, n, s, acc, C);
}
void scale_base(const float* P, int64_t n, double s, bool acc, float* C) {
  ScaleBody::run(P, n, s, acc, C);
}
using ScaleFn = void (*)(const float*, int64_t, double, bool, float*);
ScaleFn pick_scale_fn() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && cpu_isa_allowed(CpuIsa::Avx512)) return scale_avx512;
  if (__builtin_cpu_supports("avx2") && cpu_isa_allowed(CpuIsa::Avx2)) return scale_avx2;
  return scale_base;
}
}  // namespace

void apply_decode_scales(const float* P, int64_t n, float gd_a, float gd_b, bool accumulate,
                         float* C) {
  static const ScaleFn fn = pick_scale_fn();
  if (n <= 0) return;
  const double s = static_cast<double>(gd_a) * static_cast<double>(gd_b);  // exact
  constexpr int64_t kChunk = int64_t(1) << 15;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk;
    fn(P + i0, std::min(kChunk, n - i0), s, accumulate, C + i0);
  }
}

namespace {
// v.size() ≥ n, growing the capacity to exactly n (not the vector's doubling), so that a
// workspace reserved for its largest call (Linear::reserve_workspace) holds what
// model_info estimates.
template <class T>
void grow_exact(std::vector<T>& v, int64_t n) {
  if (v.size() >= size_t(n)) return;
  if (v.capacity() < size_t(n)) v.reserve(size_t(n));
  v.resize(size_t(n));
}
}  // namespace

void reserve_block_scaled(BlockScaledGemmScratch& scratch, int64_t a, int64_t b, int64_t product) {
  grow_exact(scratch.a, a);
  grow_exact(scratch.b, b);
  grow_exact(scratch.product, product);
}

namespace {
// An operand of gemm_block_scaled as FP32 values: in place, or widened (exactly) into `w`.
const float* as_f32(const BlockScaledOperand& x, int64_t n, std::vector<float>& w) {
  if (x.f32) return x.f32;
  grow_exact(w, n);
  widen_bf16(x.bf16, 1, n, n, w.data());  // the widened path's own widening
  return w.data();
}
// An operand of gemm_block_scaled as BF16 bit patterns: in place, or converted into `h`.
const uint16_t* as_bf16(const BlockScaledOperand& x, int64_t n, std::vector<uint16_t>& h) {
  if (x.bf16) return x.bf16;
  grow_exact(h, n);
  to_bf16_bits(x.f32, n, h.data());  // exact for q·c_b (a BF16 value)
  return h.data();
}
}  // namespace

void gemm_block_scaled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       BlockScaledOperand A, float gd_a, BlockScaledOperand B, float gd_b,
                       bool accumulate, float* C, BlockScaledGemmScratch& scratch) {
  if (M <= 0 || N <= 0) return;
  if (K < 0) throw std::invalid_argument("fp4::gemm_block_scaled: negative K");
  if (C == nullptr || (K > 0 && (A.null() || B.null())))
    throw std::invalid_argument("fp4::gemm_block_scaled: null operand");
  // 1. P = op(A)·op(B): into C itself unless C accumulates
  float* P = C;
  if (accumulate) {
    grow_exact(scratch.product, M * N);
    P = scratch.product.data();
  }
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  if (K == 0) {
    std::fill(P, P + M * N, 0.f);
  } else if (chosen_bf16_path() == Bf16GemmPath::Widened) {
    sgemm(trans_a, trans_b, M, N, K, 1.f, as_f32(A, M * K, scratch.wa), lda,
          as_f32(B, K * N, scratch.wb), ldb, 0.f, P, N);
  } else {
    gemm_bf16_tiled(trans_a, trans_b, M, N, K, as_bf16(A, M * K, scratch.a), lda,
                    as_bf16(B, K * N, scratch.b), ldb, false, P, N, kScaledTileM, kScaledTileN);
  }
  // 2. the two tensor decode scales, once per output
  apply_decode_scales(P, M * N, gd_a, gd_b, accumulate, C);
}

void sgemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(*at(A, trans_a, i, k, lda)) * double(*at(B, trans_b, k, j, ldb));
      const double prev = beta == 0.f ? 0.0 : double(beta) * C[i * ldc + j];
      C[i * ldc + j] = float(double(alpha) * s + prev);
    }
}

namespace detail {
bool in_onednn_execute() { return g_in_execute; }
}  // namespace detail

}  // namespace fp4
