// Kernels of the Mamba-2 mixer (Nemotron-H): causal depthwise conv1d + SiLU, the SSD scan
// (selective state-space recurrence, chunked), and the gated RMSNorm. All FP32, row-major,
// rows = B·T tokens with sequence b on rows b·T .. b·T + T − 1. Conventions as fp4/nn/layers.h:
//  * backward functions ACCUMULATE (+=) into every gradient they produce;
//  * results never depend on the thread count (each output element is produced by one thread
//    in a fixed order; sums over rows / batch use a fixed order);
//  * every public function X (src/nn/ssm.cpp: GCC vector extensions built for AVX-512,
//    AVX2 and baseline SSE2, chosen once from the CPU and FP4_MAX_CPU_ISA, OpenMP over
//    independent units) has a scalar twin X_ref (src/nn/ssm_ref.cpp: plain loops, no
//    vectors, no OpenMP) that performs the same FP32/FP64 operations in the same order, and
//    the two agree bit for bit for finite inputs (tests/nn/test_ssm.cpp, every variant, 1/2/3
//    threads). The project builds with -ffp-contract=off: nothing is fused implicitly; the
//    scan's matrix products use one explicit fused multiply-add per term (std::fma in the
//    twin, the FMA instruction or std::fma per lane in the vector builds: the same bits).
//  * exp is internal::exp_scalar (layers_internal.h; lane-wise copy in the vector code);
//    σ(u) = 1 / (1 + exp(−u)); SiLU(u) = u · σ(u);
//    softplus(u) = u > 20 ? u : log1pf(exp(u)) (std::log1p on float, same call in both
//    twins, per element, scalar); softplus′(u) = u > 20 ? 1 : σ(u).
//  * sums over a contiguous row ("canonical sum", fp4/nn/layers.h): 16 FP32 partials per
//    1024-term chunk (term i → partial i mod 16), tree16, chunk sums in FP64.
//
// Sources: Dao & Gu, "Transformers are SSMs" (2024), §6 (SSD, chunked algorithm) and
// state-spaces/mamba mamba_ssm/modules/mamba2.py + ssd_minimal.py (conv1d, softplus(dt +
// dt_bias), A = −exp(A_log), D skip, RMSNormGated with norm_before_gate=False); HF
// transformers NemotronHMamba2Mixer (torch_forward) for the same definitions.
#pragma once
#include <cstdint>

namespace fp4::nn {

// ---------------------------------------------------------------- causal depthwise conv1d
/// Causal depthwise conv1d + SiLU forward over C channels (C = d_inner + 2·G·N in Mamba-2).
/// x: [B·T, ldx] FP32, channel c of token row r at x[r·ldx + c] (ldx ≥ C: x may be a column
/// slice of the in_proj output); w: [C, W] (PyTorch conv1d weight [C, 1, W] squeezed);
/// bias: [C]; out: [B·T, C] dense. Per sequence, token t, channel c:
///   pre = bias[c]; for k = 0..W−1 with t − (W−1) + k ≥ 0: pre = pre + w[c,k]·x[t−(W−1)+k, c]
///   (terms before the sequence start are skipped, i.e. zero padding), out = pre·σ(pre).
/// pre is not stored: the backward recomputes it with the same operations.
/// Throws std::invalid_argument (message names the argument) if a pointer is null, B, T, C
/// or W < 1, or ldx < C.
void ssm_conv_forward(float* out, const float* x, int64_t ldx, const float* w,
                      const float* bias, int64_t B, int64_t T, int64_t C, int64_t W);
/// Backward of ssm_conv_forward: given dout [B·T, C] dense, ACCUMULATES into dx (strided like
/// x: [B·T, ldx], only columns < C touched), dw [C, W] and dbias [C]. dpre = dout·σ(pre)·
/// (1 + pre·(1 − σ(pre))); dx[s, c] += Σ_k w[c,k]·dpre[s + W−1−k, c] (k ascending, terms past
/// the sequence end skipped, FP32 from +0, then added to dx); dw[c,k] += Σ_{b,t} dpre[t,c]·
/// x[t−(W−1)+k, c] and dbias[c] += Σ_{b,t} dpre[t,c], summed in two levels: per row block
/// (64 rows t = 64·j .. 64·j + 63 of one sequence b; the last block of a sequence may be
/// shorter) an FP32 partial from +0 over its rows ascending, then the partials in FP32 from
/// +0 in block order (b, then j), the total added once. The blocks are fixed by T, never by
/// the thread count. Throws as the forward.
void ssm_conv_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x,
                       int64_t ldx, const float* w, const float* bias, int64_t B, int64_t T,
                       int64_t C, int64_t W);

// ---------------------------------------------------------------- SSD scan
/// Shapes of the SSD scan: B sequences of T tokens, H heads of head dim P (d_inner = H·P),
/// G groups (H % G == 0; head h uses group h / (H / G)), state size N, chunk length Q (T need
/// not be a multiple of Q; the last chunk is shorter).
struct SsdDims {
  int64_t B = 0, T = 0, H = 0, P = 0, G = 1, N = 0, Q = 64;
};

/// Floats of the workspace ssd_scan_forward writes and ssd_scan_backward reads:
/// B·H·(nc·N·P + T), nc = ceil(T / Q). Layout (float offsets):
///   states: [B][H][nc][N][P] at 0: entry (b, h, c) is the state entering chunk c (S_{c−1};
///           zero for c = 0) stored TRANSPOSED, element (n, p) = S[p, n];
///   delta:  [B][H][T] at B·H·nc·N·P: Δ_t = softplus(dt[t, h] + dt_bias[h]).
/// Throws std::invalid_argument on bad shapes (as ssd_scan_forward).
int64_t ssd_workspace_floats(const SsdDims& d);
int64_t ssd_workspace_floats(int64_t B, int64_t T, int64_t H, int64_t P, int64_t G, int64_t N,
                             int64_t Q);

/// SSD scan forward (chunked, Dao & Gu 2024 §6). Inputs (FP32, token rows r = b·T + t):
///   x [B·T, ldx]: x_t of head h = x[r·ldx + h·P .. + P)          (ldx ≥ H·P)
///   Bm, Cm [B·T, ldb / ldc]: B_t, C_t of group g at [r·ld + g·N .. + N) (ld ≥ G·N)
///   dt [B·T, lddt]: raw dt of head h at dt[r·lddt + h]            (lddt ≥ H)
///   dt_bias, A_log, D: [H].
/// Output y [B·T, H·P] dense; ws: ssd_workspace_floats(d) floats, written (see there).
/// Math: Δ_t = softplus(dt + dt_bias), A = −exp(A_log), S_t = exp(Δ_t·A)·S_{t−1} + Δ_t·x_t B_tᵀ
/// (S_{−1} = 0), y_t = S_t C_t + D·x_t. Chunked evaluation, per (b, h) and chunk of q ≤ Q rows:
///   a_s = Δ_s·A; seg[t,s] = Σ_{r=s+1..t} a_r (FP32, r ascending), L_t = seg[t,0] + a_0;
///   E = exp(seg), M[t,s] = E[t,s]·Δ_s (s ≤ t), e_t = exp(L_t), w_s = M[q−1, s];
///   Gm = C Bᵀ; Wm = Gm ∘ M (0 above the diagonal); Yd = Wm X; Yo = C S_prevᵀ;
///   y_t = (Yd + e_t·Yo) + D·x_t;  S_end = e_{q−1}·S_prev + Σ_s w_s·x_s B_sᵀ.
/// Matrix products sum over their contraction index ascending, FP32 from +0, one fused
/// multiply-add per term (acc = fma(a, b, acc)).
/// Throws std::invalid_argument for a null pointer, B, T, H, P, G, N < 1, Q < 1, H % G != 0,
/// or a row stride below its width (ldx < H·P, ldb or ldc < G·N, lddt < H).
void ssd_scan_forward(float* y, float* ws, const float* x, int64_t ldx, const float* Bm,
                      int64_t ldb, const float* Cm, int64_t ldc, const float* dt, int64_t lddt,
                      const float* dt_bias, const float* A_log, const float* D,
                      const SsdDims& d);
/// SSD scan backward: given dy [B·T, H·P] dense and ws from ssd_scan_forward on the same
/// inputs, ACCUMULATES into dx (strided like x, ldx), dB (like Bm, ldb), dC (like Cm, ldc),
/// d_dt (like dt, lddt; gradient w.r.t. the raw dt), dA_log, dD, d_dt_bias [H]. The exact
/// derivative of the chunked forward (reverse over chunks carrying dS; Gm, M recomputed).
/// Per chunk, with U = dY S_prev (q × N, FP32 product over P ascending from +0): the gradient
/// of e_t is de_t = C_t·U_t (canonical sum over n, rounded to float) and the inter-chunk part
/// of dC_t is e_t·U_t (Yo is not recomputed). dB/dC (one thread per (b, g)): each row's
/// gradient is summed in FP32 from +0 and the total added once to dB, dC. Per chunk and row the
/// sum takes the heads' inter-chunk parts in ascending head order (dC_inter, w·dB_state), then
/// the group's intra-chunk part (dG_sum B for dC, dG_sumᵀ C for dB, with dG_sum the FP32 sum
/// from +0, heads ascending, of the heads' dG = dW ∘ M: B and C are shared by the heads of a
/// group, so these two products are formed once per group).
/// Parameter grads: per (b, h) FP64 sums over t, then summed over b ascending in FP64,
/// rounded to float and added. Both directions skip the products with a zero operand (the
/// state entering chunk 0, the dS carried into the last chunk) and the +0 terms they would
/// add: for finite inputs the same bits as computing them, up to the sign of a zero that
/// the fused multiply-adds can leave at −0 (src/nn/ssm_body.inc, "Exact zeros"). Throws as
/// the forward.
void ssd_scan_backward(float* dx, float* dB, float* dC, float* d_dt, float* dA_log, float* dD,
                       float* d_dt_bias, const float* dy, const float* ws, const float* x,
                       int64_t ldx, const float* Bm, int64_t ldb, const float* Cm, int64_t ldc,
                       const float* dt, int64_t lddt, const float* dt_bias, const float* A_log,
                       const float* D, const SsdDims& d);

/// Plain sequential recurrence (the definition above, no chunking), all FP64, std::exp /
/// std::log1p (softplus(u) = u > 20 ? u : log1p(exp(u))). Same argument layout as
/// ssd_scan_forward (d.Q unused, ignored); y [B·T, H·P] dense. Reference for the chunked
/// kernels and for finite-difference tests. Throws as ssd_scan_forward.
void ssd_scan_sequential(double* y, const double* x, int64_t ldx, const double* Bm, int64_t ldb,
                         const double* Cm, int64_t ldc, const double* dt, int64_t lddt,
                         const double* dt_bias, const double* A_log, const double* D,
                         const SsdDims& d);

// ---------------------------------------------------------------- gated RMSNorm
/// Mamba-2 RMSNormGated (norm_before_gate = False), group size gs = d_inner / G:
/// g = y·SiLU(z) (SiLU(z) = z·σ(z)); per row and group: ss = canonical sum of g·g,
/// rstd = float(1 / sqrt(ss / gs + eps)) in FP64; out = (g·rstd)·weight.
/// y, out: [BT, d_inner] dense; z: [BT, ldz] (ldz ≥ d_inner); weight [d_inner]; rstd [BT·G]
/// written (row-major [BT, G]) for the backward. Throws std::invalid_argument for a null
/// pointer, BT, d_inner or G < 1, d_inner % G != 0, ldz < d_inner.
void gated_rmsnorm_forward(float* out, float* rstd, const float* y, const float* z, int64_t ldz,
                           const float* weight, int64_t BT, int64_t d_inner, int64_t G,
                           float eps);
/// Backward of gated_rmsnorm_forward, ACCUMULATING into dy [BT, d_inner], dz (strided, ldz)
/// and dweight [d_inner]. Per row and group: tw = weight·dout; dot = canonical sum of tw·g;
/// k = float(dot·r·r / gs) in FP64; dg = r·(tw − g·k); dy += dg·SiLU(z);
/// dz += (dg·y)·(σ(z)·(1 + z·(1 − σ(z)))); dweight[c] += Σ_t (dout·g)·r in two levels: per
/// block of 64 rows (t = 64·j .. 64·j + 63, the last block may be shorter) an FP32 partial
/// from +0 over its rows ascending, then the partials in FP32 from +0, j ascending, the total
/// added once. Throws as the forward.
void gated_rmsnorm_backward(float* dy, float* dz, float* dweight, const float* dout,
                            const float* y, const float* z, int64_t ldz, const float* weight,
                            const float* rstd, int64_t BT, int64_t d_inner, int64_t G);

// ---------------------------------------------------------------- scalar twins
/// Scalar twins (src/nn/ssm_ref.cpp): same arguments, same results bit for bit (finite
/// inputs), same exceptions.
void ssm_conv_forward_ref(float* out, const float* x, int64_t ldx, const float* w,
                          const float* bias, int64_t B, int64_t T, int64_t C, int64_t W);
void ssm_conv_backward_ref(float* dx, float* dw, float* dbias, const float* dout,
                           const float* x, int64_t ldx, const float* w, const float* bias,
                           int64_t B, int64_t T, int64_t C, int64_t W);
void ssd_scan_forward_ref(float* y, float* ws, const float* x, int64_t ldx, const float* Bm,
                          int64_t ldb, const float* Cm, int64_t ldc, const float* dt,
                          int64_t lddt, const float* dt_bias, const float* A_log,
                          const float* D, const SsdDims& d);
void ssd_scan_backward_ref(float* dx, float* dB, float* dC, float* d_dt, float* dA_log,
                           float* dD, float* d_dt_bias, const float* dy, const float* ws,
                           const float* x, int64_t ldx, const float* Bm, int64_t ldb,
                           const float* Cm, int64_t ldc, const float* dt, int64_t lddt,
                           const float* dt_bias, const float* A_log, const float* D,
                           const SsdDims& d);
void gated_rmsnorm_forward_ref(float* out, float* rstd, const float* y, const float* z,
                               int64_t ldz, const float* weight, int64_t BT, int64_t d_inner,
                               int64_t G, float eps);
void gated_rmsnorm_backward_ref(float* dy, float* dz, float* dweight, const float* dout,
                                const float* y, const float* z, int64_t ldz,
                                const float* weight, const float* rstd, int64_t BT,
                                int64_t d_inner, int64_t G);

namespace detail {
/// Vector variants of the fast kernels (tests force each one the CPU can run). kEmu16 is
/// the AVX-512 variant's code (16-lane vectors, 6 × 64-column tiles) compiled for the
/// baseline target (GCC splits the vectors), so that its 16-lane logic is tested on any CPU;
/// never chosen by default.
enum class SsmIsa { kAvx512, kAvx2, kBase, kEmu16 };
/// Forces a variant; returns false (and changes nothing) if the CPU lacks it or
/// FP4_MAX_CPU_ISA forbids it. Not thread-safe with running kernels.
bool set_ssm_isa(SsmIsa isa);
/// Restores the default (best allowed) variant.
void reset_ssm_isa();
}  // namespace detail

}  // namespace fp4::nn
