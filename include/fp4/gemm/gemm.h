// FP32 and BF16 GEMM backends (oneDNN). Deterministic: results do not depend on the thread count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fp4 {

/// Row-major C[M,N] = alpha · op(A) · op(B) + beta · C, op(A) = A [M,K] or Aᵀ (A stored [K,M]),
/// op(B) = B [K,N] or Bᵀ (B stored [N,K]); lda/ldb/ldc are row strides in elements.
/// Runs oneDNN's single-threaded sgemm on fixed output tiles in an OpenMP loop, so the
/// per-element accumulation order is independent of thread count.
/// Not batch-invariant: a row's bits may depend on M (and a column's on N), because oneDNN
/// picks its kernel and blocking by the tile's shape. Measured with oneDNN 2.6.3 on an Intel
/// Xeon (Sapphire Rapids class, AVX-512): rows [M − m, M) computed alone, m ≤ 16, differed
/// from the same rows of the M-row product in 576 of 2,240 random cases (M 24..128, N 16..100,
/// K 16..256, every transpose); with ONEDNN_MAX_CPU_ISA=AVX2 in 1,309 of 2,240. The
/// differences are FP32 rounding (another summation order); for one shape the bits are fixed.
/// Throws std::runtime_error if oneDNN reports an error.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);

/// Row-major FP32 C[M,N] = op(A)·op(B) (accumulate == false) or C[M,N] += op(A)·op(B)
/// (accumulate == true), with A and B given as BF16 bit patterns (fp4/numerics/bf16.h: bf16_bits):
/// op(A) = A [M,K] (trans_a == false, row stride lda ≥ K) or Aᵀ with A stored [K,M] (row
/// stride lda ≥ M); op(B) = B [K,N] (trans_b == false, ldb ≥ N) or Bᵀ with B stored [N,K]
/// (ldb ≥ K); C has row stride ldc ≥ N; strides in elements. C must not overlap A or B.
///
/// Numerics (docs/numerics.md, recipe `bf16`: BF16 operands, FP32 accumulate): each product
/// of two BF16 values is exact in FP32; the products (and, with accumulate, the old C) are
/// summed in FP32 in an order fixed by oneDNN's kernel. So
/// |C − exact| ≤ γ_(K+1)·(Σ_k |a_ik·b_kj| + |C_old|), γ_n = n·2^-24/(1 − n·2^-24).
///
/// Three paths (gemm_bf16_path), chosen once per process from what the CPU and oneDNN offer
/// and FP4_BF16_GEMM (docs/gemm.md "Which path a CPU takes"):
///  * Native (the default where the CPU's BF16 units outrun its FP32 FMAs: AMX, or
///    AVX512-BF16 on AMD; available, by FP4_BF16_GEMM=native, on every AVX512_CORE CPU):
///    oneDNN matmul primitives (src bf16, weights bf16, dst f32), implementation pinned
///    to oneDNN's BF16 GEMM ("gemm:jit", see gemm.cpp), transposes as memory-descriptor
///    strides, one primitive per distinct output tile shape, cached process-wide (thread-safe)
///    by (tile shape, K, transposes, strides, accumulate), created with oneDNN's thread count
///    forced to 1; accumulate through oneDNN's sum post-op. Needs AVX512_CORE (oneDNN 2.6).
///    Subnormals: on AVX512_BF16 / AMX-BF16 hardware the dot-product instructions treat BF16
///    subnormal inputs as zero and flush subnormal FP32 results (docs/gemm.md "BF16 GEMM
///    (`gemm_bf16`)").
///  * Widened (the default on every other x86-64 CPU: AVX2 only, ONEDNN_MAX_CPU_ISA=AVX2, or
///    Intel without AMX, where VDPBF16PS peaks at half the FP32 FMA rate): per output
///    tile the BF16 operands are widened to FP32 (exact) into per-thread buffers kept across
///    calls and multiplied by one single-threaded oneDNN sgemm (beta = 1 with accumulate).
///    IEEE FP32 arithmetic: subnormals kept.
///  * Blocked (opt-in, FP4_BF16_GEMM=blocked; AVX512_CORE_BF16 or AMX): per call the column
///    panels of op(B) are written in oneDNN's blocked weight layout (by detail::pack_bf16_vnni
///    where the layout is one it writes, else by oneDNN's reorder) and op(A) made dense if it is
///    not; per tile one single-threaded brgemm primitive, written in place where the tile is
///    dense in C, else into a dense per-thread tile then stored or added into C (docs/gemm.md
///    "The blocked path (`FP4_BF16_GEMM=blocked`)").
/// The paths sum in different orders, so their bits differ (within the bound above).
/// NaN/Inf propagate as in IEEE arithmetic.
///
/// Determinism: C is cut into fixed tiles (never derived from the thread count) run in an
/// OpenMP loop; each tile is one single-threaded oneDNN execution over the full K, so
/// every element's summation order is the same for any thread count (same CPU ISA and path).
/// M, N ≤ 0: nothing. K == 0: C = 0, or C unchanged with accumulate.
/// Throws std::invalid_argument on negative K, a null pointer with M, N > 0 (A, B only when
/// K > 0) or a stride below the minimum; std::runtime_error if oneDNN reports an error.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, bool accumulate, float* C,
               int64_t ldc);

/// Buffers gemm_block_scaled reuses from call to call (BF16 copies of the operands, the FP32
/// product before its scale), kept by the caller so that a training loop's steady state
/// allocates nothing.
struct BlockScaledGemmScratch {
  std::vector<uint16_t> a, b;
  std::vector<float> product;
  std::vector<float> wa, wb;  ///< widened path: FP32 copies of operands given as BF16
};

/// One operand of gemm_block_scaled, q·c_b either as FP32 values (the call converts them to
/// BF16 on the native and blocked paths) or as their BF16 bit patterns (the uint16 output of
/// quantize_block_scaled_fast, read in place there: no conversion pass; the widened path
/// widens them to FP32, exactly). Converts implicitly from either pointer (or nullptr).
struct BlockScaledOperand {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  BlockScaledOperand(const float* p) : f32(p) {}      // NOLINT(google-explicit-constructor)
  BlockScaledOperand(const uint16_t* p) : bf16(p) {}  // NOLINT(google-explicit-constructor)
  BlockScaledOperand(std::nullptr_t) {}               // NOLINT(google-explicit-constructor)
  bool null() const { return f32 == nullptr && bf16 == nullptr; }
};
/// Grows scratch to at least a and b BF16 elements and `product` floats, each capacity to exactly
/// what is asked when it grows (a workspace reserved for its largest call holds no more).
void reserve_block_scaled(BlockScaledGemmScratch& scratch, int64_t a, int64_t b, int64_t product);

/// The decoded-BF16 GEMM of two block-scaled FP4 operands (recipe `linear.gemm =
/// "decoded-bf16"`; docs/gemm.md "Decoded FP4 on the BF16 GEMM"), contiguous row-major:
///   P = op(A)·op(B) over A, B holding q·c_b (quantize_block_scaled_fast, quant_fast.h),
///   s = fl64(gd_a · gd_b)   (exact: two FP32 factors),
///   C = fl32(fl64(P · s))              (accumulate == false), or
///   C = fl32(C + fl32(fl64(P · s)))    (accumulate == true),
/// elementwise, no fused multiply-add. A and B are FP32 or BF16 (BlockScaledOperand: the same
/// values give the same bits either way). op(A) = A [M,K] or, with trans_a, Aᵀ of A stored [K,M];
/// op(B) = B [K,N] or, with trans_b, Bᵀ of B stored [N,K]; C [M,N]. C must not overlap A or B.
/// P is gemm_bf16 of the operands' BF16 bit patterns on its native and blocked paths (every
/// product exact, FP32 sums in oneDNN's order, 128 × 256 output tiles; the values must be BF16
/// values, as q·c_b of E2M1 with UE5M3, E4M3 or UE8M0 scales is: others would be rounded to
/// BF16), and on the widened path (AVX2, ONEDNN_MAX_CPU_ISA / FP4_MAX_CPU_ISA capped, or Intel
/// without AMX: gemm_bf16_path) one oneDNN sgemm of the FP32
/// operands as they are (the same exact products, faster than widening BF16 copies). Bits
/// depend on the path, never on the thread count. Subnormals as gemm_bf16's native path (flushed
/// by the BF16 units): with UE5M3 or E4M3 scales no operand, product or partial sum is
/// subnormal, so nothing is flushed (docs/gemm.md). M, N ≤ 0: nothing; K == 0: P = 0.
/// Throws std::invalid_argument on negative K or a null pointer with M, N > 0;
/// std::runtime_error if oneDNN reports an error.
void gemm_block_scaled(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       BlockScaledOperand A, float gd_a, BlockScaledOperand B, float gd_b,
                       bool accumulate, float* C, BlockScaledGemmScratch& scratch);

/// The elementwise scale step of gemm_block_scaled on its own: C[i] = fl32(fl64(P[i]·s)), or
/// with accumulate C[i] = fl32(C[i] + fl32(fl64(P[i]·s))), s = fl64(gd_a·gd_b), for i < n.
/// P may be C when accumulate is false (in place). Vectorised per CPU (AVX-512, AVX2, baseline
/// x86-64 builds, all IEEE operations, so the same bits), threaded over fixed chunks.
void apply_decode_scales(const float* P, int64_t n, float gd_a, float gd_b, bool accumulate,
                         float* C);

/// oneDNN's implementation name (e.g. "gemm:jit") of the primitive that the native path of
/// gemm_bf16 runs for the first output tile of this problem; creates (and caches) it. On the
/// blocked path the brgemm primitive's (e.g. "brg:avx512_core_amx_bf16");
/// "widened:sgemm" when gemm_bf16_path() is Widened. For
/// benchmarks, tests and logs. Throws as gemm_bf16 (M, N, K must be positive).
const char* gemm_bf16_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                           int64_t lda, int64_t ldb, int64_t ldc, bool accumulate);

/// The implementations of gemm_bf16 (docs/gemm.md "BF16 GEMM (`gemm_bf16`)" and "The blocked
/// path (`FP4_BF16_GEMM=blocked`)"):
///  * Native: oneDNN's "gemm:jit" BF16 matmul per output tile, on the operands in place;
///  * Widened: BF16 tiles widened to FP32, oneDNN sgemm (the default where BF16 units are not faster than FP32 ones, gemm_bf16_path);
///  * Blocked: oneDNN's brgemm matmul per output tile ("brg:avx512_core_bf16", or
///    "brg:avx512_core_amx_bf16" on AMX) with op(B) written in oneDNN's blocked weight layout
///    once per call, op(A) and the C tile dense. Opt-in (FP4_BF16_GEMM=blocked): its
///    summation order differs from Native's, so its bits do too (never with the thread count).
enum class Bf16GemmPath { Native, Widened, Blocked };

/// The path gemm_bf16 takes in this process: FP4_BF16_GEMM's (native, blocked or widened) when
/// set, else Native when oneDNN offers a BF16 matmul for this CPU (and ONEDNN_MAX_CPU_ISA) and
/// the CPU has AMX, or AVX512-BF16 and is AMD's, else Widened (docs/gemm.md "Which path a CPU
/// takes"); decided at the first call (which creates a small oneDNN primitive to find out), or
/// set by gemm_bf16_set_path. Throws std::runtime_error (naming FP4_BF16_GEMM) for another value
/// or a path this CPU cannot run.
Bf16GemmPath gemm_bf16_path();

/// True if oneDNN offers a native BF16 matmul here (AVX512_CORE or better, not capped).
bool gemm_bf16_native_available();

/// True if oneDNN offers its brgemm BF16 matmul here (the Blocked path: AVX512_CORE_BF16 or
/// AMX, not capped).
bool gemm_bf16_blocked_available();

/// What is wrong with FP4_BF16_GEMM (gemm_bf16_path would throw it), or "" when it is unset,
/// empty or names a path this CPU runs. For fp4train's CLI, which refuses a bad value up front.
std::string gemm_bf16_env_error();

/// Forces the path for the rest of the process (tests use it to run both on one machine).
/// Not to be called while a gemm_bf16 runs. Throws std::runtime_error for Native when
/// gemm_bf16_native_available() is false, for Blocked when gemm_bf16_blocked_available() is
/// false.
void gemm_bf16_set_path(Bf16GemmPath path);

/// One line naming the FP32 GEMM implementation, e.g. "oneDNN 2.6 sgemm, ISA avx2"
/// (oneDNN's effective CPU ISA). For run headers and summary.json.
std::string gemm_fp32_description();

/// One line naming gemm_bf16's path and implementation, e.g.
/// "native: oneDNN BF16 matmul (gemm:jit)" or
/// "widened: BF16 operands widened to FP32, oneDNN sgemm (ISA avx2)". For run headers and
/// summary.json. May create a small oneDNN primitive (first call).
std::string gemm_bf16_description();

/// Naive reference of sgemm accumulating in double, for tests.
void sgemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

namespace detail {
/// True on a thread while it is inside oneDNN's primitive execution for gemm_bf16. oneDNN 2.6
/// builds its execution-argument map on the heap there (a couple of operator new calls per
/// tile), which the project cannot avoid; tests/nn/test_alloc.cpp counts those separately from
/// the project's own allocations.
bool in_onednn_execute();

/// dst[j·ldd + i] = src[i·lds + j] for i < rows, j < cols: the transpose of a [rows, cols] matrix
/// of 16-bit values (BF16 bit patterns, copied exactly) into [cols, rows]. The BF16 GEMM's blocked
/// path copies a transposed op(A) dense with it (docs/gemm.md "The blocked path
/// (`FP4_BF16_GEMM=blocked`)"). SSE2 8 × 8 blocks (every x86-64 CPU); transpose_bf16_ref is its
/// scalar twin, element by element. Needs lds ≥ cols, ldd ≥ rows (not checked); src and dst must
/// not overlap.
void transpose_bf16(const uint16_t* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst,
                    int64_t ldd);
void transpose_bf16_ref(const uint16_t* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst,
                        int64_t ldd);

/// Writes rows k0 .. k1 of op(B) [K, N] (BF16 bit patterns) into dst in oneDNN's blocked weight
/// layout BA16a<nblk>b2a, the one its brgemm matmul takes on AVX512-BF16 (nblk = 64). op(B) is
/// B [K, N] with leading dimension ldb ≥ N, or, when trans, Bᵀ of B [N, K] with ldb ≥ K. The
/// layout is op(B) padded with zeros to [Kpad, Npad] = [round_up(K, 32), round_up(N, nblk)]:
/// column blocks of nblk outermost, then blocks of 32 rows, then 16 row pairs, nblk columns,
/// the pair's two rows, so element (k, n) lies at
///   (n / nblk)·Kpad·nblk + (k / 32)·32·nblk + ((k % 32) / 2)·2·nblk + (n % nblk)·2 + k % 2.
/// dst is the whole panel's base (Kpad·Npad values); rows k0 .. k1 of it are written, padding
/// included. k0 and k1 are multiples of 32 with k1 ≤ Kpad, so disjoint row ranges can be written
/// by different threads. nblk is 16, 32, 48 or 64. None of this is checked; B and dst must not
/// overlap. The BF16 GEMM's blocked path packs its op(B) panels with it in place of oneDNN's
/// reorder where the primitive's weight layout is this one (docs/gemm.md "The blocked path
/// (`FP4_BF16_GEMM=blocked`)"). SSE2 (every x86-64 CPU); pack_bf16_vnni_ref is its scalar twin,
/// element by element.
void pack_bf16_vnni(const uint16_t* B, int64_t ldb, bool trans, int64_t K, int64_t N, int64_t nblk,
                    int64_t k0, int64_t k1, uint16_t* dst);
void pack_bf16_vnni_ref(const uint16_t* B, int64_t ldb, bool trans, int64_t K, int64_t N,
                        int64_t nblk, int64_t k0, int64_t k1, uint16_t* dst);

/// Test hook, for the whole process: whether the blocked path packs its op(B) panels with
/// pack_bf16_vnni where oneDNN's weight layout allows (true, the default) or always with oneDNN's
/// reorder (false). The two write the same bytes, so the GEMM's bits must not change
/// (docs/gemm.md "The blocked path (`FP4_BF16_GEMM=blocked`)"); tests compare them. Not for use
/// while another thread runs a GEMM.
void set_bf16_blocked_own_pack(bool own);

/// Test hook, for the whole process: the column block nblk of the weight layout BA16a<nblk>b2a
/// that the blocked path asks oneDNN's brgemm for (64, the default: the one oneDNN 2.6 picks
/// itself but for small tiles on AMX, see docs/gemm.md "The blocked path
/// (`FP4_BF16_GEMM=blocked`)"), or 0 for the layout oneDNN picks. Where brgemm refuses the
/// asked layout, it takes oneDNN's choice. Throws std::invalid_argument for nblk other than 0,
/// 16, 32, 48, 64. Not for use while another thread runs a GEMM.
void set_bf16_blocked_nblk(int64_t nblk);

/// The column block nblk of the weight layout oneDNN's brgemm matmul takes for a [K, nb] op(B)
/// panel when that layout is one pack_bf16_vnni writes (BA16a<nblk>b2a), else 0 (the blocked
/// path then reorders with oneDNN). Creates the primitive if needed; throws std::runtime_error
/// where oneDNN offers no brgemm (gemm_bf16_blocked_available), std::invalid_argument for
/// K or nb ≤ 0. For tests and diagnostics.
int64_t bf16_blocked_vnni_block(int64_t K, int64_t nb);

/// How many op(B) panels the blocked path has had oneDNN's reorder write since the process
/// started (panels packed by pack_bf16_vnni are not counted). For tests: a GEMM that leaves it
/// unchanged packed every panel itself.
int64_t bf16_blocked_reorders();
}  // namespace detail

}  // namespace fp4
