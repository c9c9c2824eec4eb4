// Layers of the Llama-style decoder as plain forward/backward functions over row-major
// FP32 arrays (llm.c style). Linear layers live in fp4/nn/linear.h; this file has
// everything else. Conventions:
//  * BT = batch · seq_len tokens; C = d_model; H heads of size hd = C / H.
//  * Backward functions ACCUMULATE (+=) into every gradient they produce (inputs and
//    parameters), so residual branches and shared weights add up naturally.
//  * All reductions over tokens are done in a fixed order independent of thread count.
#pragma once
#include <cstdint>

namespace fp4::nn {

/// out[BT, C] = wte[tokens[t], :]. tokens in [0, V). Throws std::out_of_range on a bad id.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t BT,
                       int64_t C, int64_t V);
/// dwte[tokens[t], :] += dout[t, :]. Throws std::out_of_range on a negative id.
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t BT,
                        int64_t C);

/// RMSNorm: out = x / sqrt(mean(x²) + eps) ⊙ weight; rstd[BT] saved for backward.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight,
                     int64_t BT, int64_t C, float eps);
void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, int64_t BT, int64_t C);

/// Rotary position embedding applied in place to x [B, T, H, hd] (hd even), pairs
/// (x[2i], x[2i+1]) rotated by angle pos · theta^(−2i/hd). backward applies the inverse
/// rotation to the gradient in place (dx = Rᵀ dout). Throws std::invalid_argument if hd is
/// odd.
void rope_forward(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, float theta);
void rope_backward(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, float theta);

/// Causal multi-head attention: q, k, v, out are [B, T, C] (head h occupies columns
/// h·hd..(h+1)·hd). att [B, H, T, T] stores the softmax probabilities (row i, cols ≤ i;
/// the masked upper triangle is written as 0) for backward. Scale 1/sqrt(hd).
/// Throws std::invalid_argument unless C % H == 0.
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t C, int64_t H);
/// Accumulates into dq, dk, dv [B, T, C]. `scratch` must hold B·H·T·T floats; it receives
/// ∂L/∂(q_i·k_j), the gradient w.r.t. the raw dot products (softmax gradient times
/// 1/sqrt(hd)), [B, H, T, T] with zeros above the diagonal.
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                        const float* q, const float* k, const float* v, const float* att,
                        int64_t B, int64_t T, int64_t C, int64_t H);

/// Squared ReLU (Nemotron-H MLP): out = max(x, 0)², n elements.
void squared_relu_forward(float* out, const float* x, int64_t n);
void squared_relu_backward(float* dx, const float* dout, const float* x, int64_t n);

/// SwiGLU: x is [BT, 2F] = [gate | up]; out [BT, F] = silu(gate) ⊙ up.
void swiglu_forward(float* out, const float* x, int64_t BT, int64_t F);
void swiglu_backward(float* dx, const float* dout, const float* x, int64_t BT, int64_t F);

/// Mean softmax cross-entropy over BT rows of logits [BT, V] with targets in [0, V).
/// Returns the mean loss (nats) and writes per-row losses to `losses` (may be null).
/// Throws std::out_of_range on a target outside [0, V) (also in backward).
double cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                             int64_t BT, int64_t V);
/// dlogits[BT, V] = (softmax(logits) − onehot(target)) · scale (overwrites, not accumulate;
/// scale is usually 1/BT).
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int64_t BT, int64_t V, float scale);

namespace detail {
/// Attention micro-kernel variants. kScalarTwin is the baseline x86-64 build of the same
/// kernel (4-lane SSE2 vectors, same per-lane multiply-then-add order) that the AVX2 and
/// AVX-512 builds must match bit for bit.
enum class AttentionIsa { kAuto, kAvx512, kAvx2, kScalarTwin };
/// For tests and benchmarks: force a variant (not thread-safe; call between layer calls).
/// Returns false, changing nothing, if this CPU cannot run it.
bool set_attention_isa(AttentionIsa isa);

/// Plain scalar reference twin of attention_forward (same contract and exceptions): one
/// (b, h, i) row at a time, no vectors, no threads, no padding. It performs exactly the
/// FP32 operations of the vector kernels in the same order, so every variant must match it
/// bit for bit:
///   s[j] = (Σ_{c=0}^{hd−1} q_i[c]·k_j[c]) · (1/sqrt(hd))  (sum from +0, c ascending,
///          separate multiply and add), j ≤ i;
///   m = max_j s[j] (std::max, j ascending, from −inf); e[j] = exp(s[j] − m);
///   sum = Σ_j e[j] (from +0, j ascending); p[j] = e[j] · (1/sum);
///   out_i[c] = Σ_{j=0}^{i} p[j]·v_j[c] (from +0, j ascending). att is 0 above the diagonal.
void attention_forward_ref(float* out, float* att, const float* q, const float* k,
                           const float* v, int64_t B, int64_t T, int64_t C, int64_t H);
/// Plain scalar reference twin of attention_backward (same contract: accumulates into dq,
/// dk, dv, overwrites scratch). Per row i: dp[j] = Σ_c dout_i[c]·v_j[c] (from +0, c
/// ascending); dot = Σ_{j≤i} p[j]·dp[j] (from +0, j ascending); ds[j] = p[j]·(dp[j] − dot)
/// · (1/sqrt(hd)). Then, each sum from +0 with its index ascending and added once to the
/// gradient: dq_i += Σ_{j=0}^{i} ds[i,j]·k_j, dk_j += Σ_{i=j}^{T−1} ds[i,j]·q_i,
/// dv_j += Σ_{i=j}^{T−1} p[i,j]·dout_i.
void attention_backward_ref(float* dq, float* dk, float* dv, float* scratch,
                            const float* dout, const float* q, const float* k,
                            const float* v, const float* att, int64_t B, int64_t T, int64_t C,
                            int64_t H);
}  // namespace detail

}  // namespace fp4::nn

