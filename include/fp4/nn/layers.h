// Layers of the Llama-style decoder as plain forward/backward functions over row-major
// FP32 arrays (llm.c style). Linear layers live in fp4/nn/linear.h; this file has
// everything else. Conventions:
//  * BT = batch · seq_len tokens; C = d_model; H heads of size hd = C / H (attention also
//    has a grouped-query form with Hkv key/value heads and an explicit hd).
//  * Backward functions ACCUMULATE (+=) into every gradient they produce (inputs and
//    parameters), so residual branches and shared weights add up naturally.
//  * All reductions are done in a fixed order independent of thread count and SIMD width.
//  * Implementation (layers_fast.cpp): Google Highway, one build per x86 target, the target
//    the one quant_fast_target() names (quant_fast_use_target() switches these kernels too);
//    OpenMP over rows or fixed chunks. Every kernel has a plain scalar twin in `detail`
//    (layers_ref.cpp) performing the same FP32/FP64 operations in the same order, and the
//    fast kernel matches it bit for bit on every target and for any thread count
//    (tests/nn/test_layers_twin.cpp). The project compiles with -ffp-contract=off: no FMA.
//
// Canonical sum (the one reduction order used by every sum below, over n terms):
//   chunks of 1024 consecutive terms (from term 0): 16 FP32 partials starting at +0, term i
//   added to partial i mod 16 with i ascending, combined by the fixed tree p[i] += p[i+8]
//   (i < 8), p[i] += p[i+4] (i < 4), p[i] += p[i+2] (i < 2), sum = p[0] + p[1];
//   superchunks of 2^18 terms: FP64 sum from 0.0 of their chunk sums, ascending;
//   result: FP64 sum from 0.0 of the superchunk sums, ascending.
// So a sum is FP32 within 1024 terms (64 terms per partial) and FP64 beyond.
//
// exp: the softmax (cross-entropy) and SwiGLU use detail::exp_ref's algorithm (range
// reduction + polynomial, multiplies and adds only), not std::exp, so vector and scalar code
// agree bit for bit. Max error measured against exp in double: see tests/nn/test_layers_twin.cpp
// (ExpTwin.AccuracyAgainstDoubleExp: ≤ 1 ulp measured, 2 asserted); exact special cases: −inf and x < −104 → +0, x > 88.7228317 → +inf,
// NaN → NaN.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fp4::nn {

/// out[BT, C] = wte[tokens[t], :]. tokens in [0, V). Throws std::out_of_range on a bad id.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t BT,
                       int64_t C, int64_t V);
/// dwte[tokens[t], :] += dout[t, :]. Throws std::out_of_range on a negative id.
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t BT,
                        int64_t C);

/// RMSNorm forward. x, out: [BT, C] FP32; weight [C]; rstd [BT] (written, saved for
/// backward). Per row t: ss = canonical sum over c of x[c]·x[c] (FP32 squares);
/// rstd[t] = float(1 / sqrt(ss / C + eps)) evaluated in double; out[c] = (x[c]·rstd)·w[c].
/// BT ≤ 0 does nothing; C must be > 0. Throws nothing.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight,
                     int64_t BT, int64_t C, float eps);
/// RMSNorm backward, accumulating into dx [BT, C] and dweight [C] (dout, x [BT, C]; weight
/// [C]; rstd [BT] from forward). Per row: dot = canonical sum over c of (w[c]·g[c])·x[c];
/// k = float(dot·r·r / C) in double; dx[c] += r·(w[c]·g[c] − x[c]·k). dweight[c] +=
/// acc[c] with acc[c] = Σ_t (g[t,c]·x[t,c])·r_t, an FP32 sum from +0 with t ascending.
void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, int64_t BT, int64_t C);

/// Rotary position embedding applied in place to x [B, T, H, hd] FP32 (hd even), pairs
/// (x[2i], x[2i+1]) rotated by angle a = t · theta^(−2i/hd) (radians; cos/sin evaluated in
/// double, rounded to float, cached per (T, hd, theta), thread-safe):
/// (x0, x1) ← (x0·c + x1·(−s), x1·c + x0·s). backward applies the inverse rotation to the
/// gradient in place (dx = Rᵀ dout, s negated). Throws std::invalid_argument if hd is odd
/// or ≤ 0.
void rope_forward(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta);
void rope_backward(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, float theta);

/// Causal grouped-query attention (GQA; multi-head attention when Hkv = H), FP32:
/// H query heads share Hkv key/value heads, query head h using KV head h / (H / Hkv)
/// (Ainslie et al. 2023, "GQA", §2.2; the grouping of HF transformers' repeat_kv, as used by
/// Nemotron-H and Llama). q and out are [B, T, H·hd] (query head h occupies columns
/// h·hd..(h+1)·hd), k and v are [B, T, Hkv·hd] (KV head g at columns g·hd..(g+1)·hd); H·hd
/// need not equal d_model. out_i = Σ_{j ≤ i} softmax_j(q_i·k_j / sqrt(hd)) v_j per head
/// (Vaswani et al. 2017, §3.2.1, with a causal mask). att [B, H, T, T] receives the softmax
/// probabilities (row i, cols ≤ i; the masked upper triangle is written as 0) for backward.
/// B ≤ 0 does nothing (no checks). Throws std::invalid_argument (message naming the
/// argument) unless T, H, Hkv, hd > 0, H % Hkv == 0 and T, H, hd < 2^31. Bit-identical for
/// any OpenMP thread count; for Hkv = H the results are those of the former [B, T, C] MHA
/// kernels (the wrappers below).
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd);
/// Backward of attention_forward (same shapes, same exceptions): accumulates (+=) into dq
/// [B, T, H·hd] and dk, dv [B, T, Hkv·hd]; dout [B, T, H·hd]; att from the forward. The
/// gradient of a KV head is the sum over the H / Hkv query heads that share it: each query
/// head's contribution is one finished sum, added to dk/dv in ascending query-head order
/// (independent of thread count; the threads split the B·Hkv (batch, KV head) pairs, the
/// forward the B·H (batch, query head) pairs). `scratch` must hold
/// attention_scratch_floats(B, T, H) = B·H·T·T floats (unchanged by GQA); it receives
/// ∂L/∂(q_i·k_j), the gradient w.r.t. the raw dot products (softmax gradient times
/// 1/sqrt(hd)), [B, H, T, T] with zeros above the diagonal.
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                        const float* q, const float* k, const float* v, const float* att,
                        int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd);
/// Floats of attention_backward's `scratch` (and of attention_forward's `att`): B·H·T·T.
constexpr int64_t attention_scratch_floats(int64_t B, int64_t T, int64_t H) {
  return B * H * T * T;
}

namespace detail {
/// hd = C / H for the [B, T, C] multi-head wrappers below. Throws std::invalid_argument
/// naming `fn` unless C > 0, H > 0 and C % H == 0.
inline int64_t mha_head_dim(int64_t C, int64_t H, const char* fn) {
  if (C <= 0 || H <= 0 || C % H != 0)
    throw std::invalid_argument(std::string(fn) + ": need C, H > 0 and C % H == 0 (got C=" +
                                std::to_string(C) + ", H=" + std::to_string(H) + ")");
  return C / H;
}
}  // namespace detail

/// Multi-head attention on q, k, v, out [B, T, C], C = H·hd: attention_forward with
/// Hkv = H, hd = C / H (bit for bit). B ≤ 0 does nothing; throws std::invalid_argument
/// unless C, H > 0 and C % H == 0, or T ≤ 0 (as the GQA form).
inline void attention_forward(float* out, float* att, const float* q, const float* k,
                              const float* v, int64_t B, int64_t T, int64_t C, int64_t H) {
  if (B <= 0) return;
  attention_forward(out, att, q, k, v, B, T, H, H,
                    detail::mha_head_dim(C, H, "attention_forward"));
}
/// Multi-head backward on [B, T, C]: attention_backward with Hkv = H, hd = C / H (same
/// contract and exceptions as the forward wrapper; scratch holds B·H·T·T floats).
inline void attention_backward(float* dq, float* dk, float* dv, float* scratch,
                               const float* dout, const float* q, const float* k,
                               const float* v, const float* att, int64_t B, int64_t T,
                               int64_t C, int64_t H) {
  if (B <= 0) return;
  attention_backward(dq, dk, dv, scratch, dout, q, k, v, att, B, T, H, H,
                     detail::mha_head_dim(C, H, "attention_backward"));
}

/// Squared ReLU (Nemotron-H MLP), n elements FP32: out = r·r with r = x > 0 ? x : 0
/// (NaN → 0). backward: dx += dout·(2·r).
void squared_relu_forward(float* out, const float* x, int64_t n);
void squared_relu_backward(float* dx, const float* dout, const float* x, int64_t n);

/// SwiGLU: x is [BT, 2F] = [gate | up] FP32; out [BT, F] = (g·σ)·u with σ = 1 / (1 + e),
/// e = exp(−g) (detail::exp_ref's algorithm).
void swiglu_forward(float* out, const float* x, int64_t BT, int64_t F);
/// SwiGLU backward, accumulating into dx [BT, 2F]: dgate += (d·u)·(σ·(1 + g·(1 − σ))),
/// dup += d·(g·σ). dout [BT, F].
void swiglu_backward(float* dx, const float* dout, const float* x, int64_t BT, int64_t F);

/// Mean softmax cross-entropy over BT rows of logits [BT, V] FP32 with targets in [0, V).
/// Per row: m = max of the row (then m + 0, so −0 becomes +0); sum = canonical sum over v of
/// exp(z[v] − m); loss = double(m) + log(sum) − double(z[target]) (nats, double). Returns
/// the mean loss (a double sum over rows in row order, divided by BT; 0 if BT ≤ 0) and
/// writes float(loss) per row to `losses` (may be null). Logits may be −inf (as long as the
/// row max is finite); a NaN logit gives an unspecified result. Throws std::out_of_range on
/// a target outside [0, V) (also in backward).
double cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                             int64_t BT, int64_t V);
/// dlogits[BT, V] = (softmax(logits) − onehot(target)) · scale (overwrites, not accumulate;
/// scale is usually 1/BT). Per row: e[v] = exp(z[v] − m) (m as forward), sum = canonical
/// sum of e, inv = float(1 / sum) in double; dz[v] = (e[v]·inv)·scale, and
/// dz[target] = (e[target]·inv − 1)·scale. dlogits may be logits (in place: every element is
/// read before it is written, rows are independent); partial overlaps are not allowed.
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int64_t BT, int64_t V, float scale);

/// Residual add x[i] += r[i] for i < n (FP32, elementwise; x and r may not overlap unless
/// equal).
void residual_add(float* x, const float* r, int64_t n);

namespace detail {
/// Attention kernel variants (AVX-512: 8 × 32 register blocks; AVX2 + FMA: 4 × 16; baseline:
/// 4 × 16 with std::fma per lane). kScalarTwin is the baseline x86-64 build of the same
/// kernel (4-lane SSE2 vectors, the same per-lane fused multiply-add sequence). kEmu16 is the
/// AVX-512 body (16 lanes, 8 × 32 blocks) emulated on any x86-64 CPU (GCC vectors lowered to
/// SSE2, std::fma per lane), for tests only. All must match attention_*_ref bit for bit.
enum class AttentionIsa { kAuto, kAvx512, kAvx2, kScalarTwin, kEmu16 };
/// For tests and benchmarks: force a variant (not thread-safe; call between layer calls).
/// Returns false, changing nothing, if this CPU cannot run it.
bool set_attention_isa(AttentionIsa isa);

/// Plain scalar reference twin of the GQA attention_forward (same contract and exceptions,
/// with the _ref name): one (b, h, i) row at a time (h the query head, k/v read from its KV
/// head h / (H / Hkv)), no vectors, no threads, no padding. It performs exactly the
/// FP32 operations of the vector kernels in the same order, so every variant must match it
/// bit for bit:
///   s[j] = (Σ_{c=0}^{hd−1} q_i[c]·k_j[c]) · (1/sqrt(hd))  (acc = fma(q, k, acc) from +0, c
///          ascending), j ≤ i;
///   m = max of s[0..i] over 16 partials (s[j] into partial j mod 16, j ascending, each from
///       −inf taking x when x > partial), combined by a fixed pairwise tree (8, 4, 2, 1);
///   e[j] = exp(s[j] − m) (the project's multiply/add-only expf, internal::exp_scalar);
///   sum = Σ_j e[j] over 16 partials (j mod 16, from +0) and the same tree (tree16);
///   p[j] = e[j] · (1/sum);
///   out_i[c] = Σ_{j=0}^{i} p[j]·v_j[c] (fma from +0, j ascending). att is 0 above the diagonal.
void attention_forward_ref(float* out, float* att, const float* q, const float* k,
                           const float* v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                           int64_t hd);
/// Plain scalar reference twin of attention_backward (same contract: accumulates into dq,
/// dk, dv, overwrites scratch). Per row i: dp[j] = Σ_c dout_i[c]·v_j[c] (fma from +0, c
/// ascending); dot = Σ_{j≤i} p[j]·dp[j] (16 fma partials, j mod 16, then tree16);
/// ds[j] = p[j]·(dp[j] − dot) · (1/sqrt(hd)). Then, each sum an fma chain from +0 with its
/// index ascending, added once to the gradient: dq_i += Σ_{j=0}^{i} ds[i,j]·k_j,
/// dk_j += Σ_{i=j}^{T−1} ds[i,j]·q_i, dv_j += Σ_{i=j}^{T−1} p[i,j]·dout_i, where dk_j, dv_j
/// are rows of query head h's KV head; (b, h) run with h ascending, so the KV head's rows
/// get one such addition per query head of its group, in ascending h.
void attention_backward_ref(float* dq, float* dk, float* dv, float* scratch,
                            const float* dout, const float* q, const float* k,
                            const float* v, const float* att, int64_t B, int64_t T, int64_t H,
                            int64_t Hkv, int64_t hd);
/// [B, T, C] multi-head forms of the twins (Hkv = H, hd = C / H), as the public wrappers.
inline void attention_forward_ref(float* out, float* att, const float* q, const float* k,
                                  const float* v, int64_t B, int64_t T, int64_t C, int64_t H) {
  if (B <= 0) return;
  attention_forward_ref(out, att, q, k, v, B, T, H, H,
                        mha_head_dim(C, H, "attention_forward_ref"));
}
inline void attention_backward_ref(float* dq, float* dk, float* dv, float* scratch,
                                   const float* dout, const float* q, const float* k,
                                   const float* v, const float* att, int64_t B, int64_t T,
                                   int64_t C, int64_t H) {
  if (B <= 0) return;
  attention_backward_ref(dq, dk, dv, scratch, dout, q, k, v, att, B, T, H, H,
                         mha_head_dim(C, H, "attention_backward_ref"));
}

/// Scalar twins of the kernels above (same contracts, same exceptions with the _ref name):
/// plain loops, no vectors, no threads, exactly the FP32/FP64 operations of the fast
/// kernels in the same order (see each kernel's docstring and "Canonical sum" above), so
/// the fast kernels must match them bit for bit. rope_*_ref rebuild the cos/sin table on
/// every call (no cache).
void rmsnorm_forward_ref(float* out, float* rstd, const float* x, const float* weight,
                         int64_t BT, int64_t C, float eps);
void rmsnorm_backward_ref(float* dx, float* dweight, const float* dout, const float* x,
                          const float* weight, const float* rstd, int64_t BT, int64_t C);
void rope_forward_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta);
void rope_backward_ref(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, float theta);
void squared_relu_forward_ref(float* out, const float* x, int64_t n);
void squared_relu_backward_ref(float* dx, const float* dout, const float* x, int64_t n);
void swiglu_forward_ref(float* out, const float* x, int64_t BT, int64_t F);
void swiglu_backward_ref(float* dx, const float* dout, const float* x, int64_t BT, int64_t F);
double cross_entropy_forward_ref(float* losses, const float* logits, const int32_t* targets,
                                 int64_t BT, int64_t V);
void cross_entropy_backward_ref(float* dlogits, const float* logits, const int32_t* targets,
                                int64_t BT, int64_t V, float scale);
void residual_add_ref(float* x, const float* r, int64_t n);

/// The project's FP32 exp (scalar): range reduction k = round(x·log2e) (magic-constant add),
/// r = (x − k·ln2_hi) − k·ln2_lo, degree-5 polynomial (Cephes expf coefficients) evaluated
/// with separate multiplies and adds, y = ((p·r² + r) + 1)·2^⌊k/2⌋·2^(k−⌊k/2⌋). Special cases:
/// x > 88.7228317 → +inf, x < −104 (and −inf) → +0, NaN → NaN; results below 2^−126 are
/// subnormal (rounded once). The exact operation list is in src/nn/layers_internal.h.
float exp_ref(float x);
/// out[i] = exp_ref(x[i]) for i < n, computed by the vector exp of the current SIMD target
/// (for tests: it must equal exp_ref bit for bit). Single-threaded.
void exp_fast(float* out, const float* x, int64_t n);

/// Coefficients of one AdamW update (all FP32, computed by AdamW::step):
/// b1, b2 = β1, β2; omb1 = 1 − b1, omb2 = 1 − b2 (FP32 subtractions); bc1 = 1 − β1^t,
/// bc2 = 1 − β2^t (double, rounded); lr; eps; wd (0 for parameters without decay).
struct AdamWCoeffs {
  float b1, b2, omb1, omb2, bc1, bc2, lr, eps, wd;
};
/// AdamW update of n parameters w with gradients g and moments m, v (all FP32 [n]):
/// m = b1·m + omb1·g; v = b2·v + (omb2·g)·g; mh = m / bc1; vh = v / bc2;
/// w = w − lr·(mh / (sqrt(vh) + eps) + wd·w). Elementwise; threaded over fixed chunks.
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n,
                  const AdamWCoeffs& k);
void adamw_update_ref(float* w, const float* g, float* m, float* v, int64_t n,
                      const AdamWCoeffs& k);
/// Sum of squares of g[i] (FP32) for i < n, as a double: the canonical sum (see top of file)
/// of g[i]·g[i] (FP32 squares). If that overflows to +inf although every g[i] is finite (an
/// FP32 partial of one chunk passes FLT_MAX: four entries of 1e19 already do), the result is
/// instead 2^(2k) · (canonical sum of (g[i]·2^−k)²), k = min(ilogb(max|g|), 126), scaled in
/// double (layers_internal.h, "sum of squares"); so 128 entries of 1e19 give 1.28e40. Inputs
/// that never overflow keep the plain sum's bits. +inf only if some g[i] is ±Inf, NaN if one
/// is NaN. Threaded over superchunks; the result does not depend on thread count or SIMD
/// target. n ≤ 0 gives 0. Throws nothing.
double sum_squares(const float* g, int64_t n);
double sum_squares_ref(const float* g, int64_t n);
/// g[i] = g[i]·s for i < n (FP32).
void scale_inplace(float* g, int64_t n, float s);
void scale_inplace_ref(float* g, int64_t n, float s);
}  // namespace detail

}  // namespace fp4::nn

