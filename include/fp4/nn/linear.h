// The quantized Linear layer: Y = X·Wᵀ with its three GEMMs (fprop, dgrad, wgrad) run in
// FP32, BF16 or block-scaled FP4 per the recipe (docs/numerics.md "Notation", "Quantizing one
// operand", "Tensor reference g", "Random Hadamard transform", "GEMM emulation: decoded").
// The only place in the model that knows about FP4.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "fp4/base/profile.h"
#include "fp4/gemm/gemm.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/numerics/qtensor.h"
#include "fp4/recipe/recipe.h"
#include "fp4/numerics/telemetry.h"

namespace fp4::nn {

/// std::allocator with 64-byte alignment: the SIMD quantizers write large outputs with
/// streaming stores only to 64-byte-aligned buffers (see fp4/numerics/quant_fast.h).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  bool operator==(const Aligned64&) const { return true; }
};
using AlignedFloats = std::vector<float, Aligned64<float>>;

/// A 64-byte-aligned float buffer that only grows: get(n) returns at least n floats, keeping
/// the buffer (and its contents) when it is large enough, else replacing it by a larger one
/// (contents lost). Never zero-fills, so a smaller request after a larger one costs nothing.
class ScratchFloats {
 public:
  float* get(int64_t n);
  /// The same storage as n BF16 bit patterns (get((n + 1) / 2) floats' bytes): for operands the
  /// decoded-BF16 GEMM reads as BF16 (Linear::bf16_operands).
  uint16_t* get_bf16(int64_t n) { return reinterpret_cast<uint16_t*>(get((n + 1) / 2)); }
  int64_t capacity() const { return cap_; }  ///< floats
 private:
  struct Free {
    void operator()(float* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<float[], Free> p_;
  int64_t cap_ = 0;
};

/// The transient operand buffers of FP4-mode Linears (quantized fprop X and dgrad dY, the
/// dgrad weight copy, the transposes), shared by every Linear bound to it: only one Linear
/// runs at a time, and nothing in these buffers outlives the forward() or backward() call
/// that wrote it, except the quantized X that Linear::forward may reuse inside a shared-input
/// scope (below). What must persist from forward to backward (the quantized weight reused by
/// dgrad; BF16 operand copies) stays in each Linear. A Linear owns a workspace of its own
/// unless bound to another (Model binds all its linears to one). Not thread-safe: Linears
/// sharing a workspace must not run concurrently.
struct LinearWorkspace {
  ScratchFloats row;     ///< fprop: quantized X [M, K]; dgrad: quantized dY [M, N]
  ScratchFloats wqd;     ///< dgrad: quantized weight when it differs from fprop's [N, K]
  ScratchFloats t0, t1;  ///< transposes: dgrad Wᵀ [K, N]; wgrad dYᵀ [N, M] and Xᵀ [K, M]
  QTensor pa, pb;        ///< probe-matched mode: the packed operands A and B of the current GEMM
  BlockScaledGemmScratch gemm;  ///< decoded-bf16 mode: BF16 operand copies, the unscaled product

  /// Grow the buffers for an FP4 Linear of K inputs, N outputs and M tokens per call, so
  /// that its calls allocate nothing (Model does this once for its largest linears).
  void reserve(int64_t M, int64_t K, int64_t N);
  /// Bytes held by the buffers (capacity).
  int64_t bytes() const;

  /// Shared-input scope: between begin_shared_input(X) and end_shared_input() the caller
  /// promises that every Linear forward() given X reads the same, unchanged [M, K] tensor.
  /// Inside it, a forward() may reuse the quantized X left in `row` by the previous Linear
  /// instead of quantizing again, iff it gets the same X and M (and K), an identical fprop-X
  /// spec (every field), an identical reference g (bit for bit) and RNE element rounding (SR
  /// bits are keyed by the layer id); and the tensor amax max|X| is measured at most once.
  /// The results are bit-identical to quantizing per layer. `sharing` = false disables the
  /// reuse (tests compare both).
  void begin_shared_input(const float* X) { end_shared_input(); shared_x = X; }
  void end_shared_input() { shared_x = nullptr; xq.valid = false; amax.valid = false; }
  bool sharing = true;
  /// Statistics (tests): fprop-X quantizations reused, and amax measurements reused.
  int64_t reused_inputs = 0, reused_amax = 0;

  // The state of the scope (read and written by Linear only).
  const float* shared_x = nullptr;
  struct {
    bool valid = false;
    const float* x = nullptr;
    int64_t M = 0, K = 0;
    BlockQuantSpec spec;
    float g = 0;
    bool bf16 = false;  ///< as BF16 bit patterns (Linear::bf16_operands)
  } xq;  ///< what `row` holds, while valid: X quantized with spec and g
  struct {
    bool valid = false;
    const float* x = nullptr;
    int64_t n = 0;
    float value = 0;
  } amax;  ///< max|X| of the shared X, once measured
};

/// Activation tensor reference `g` of an FP4 Linear's fprop X in inference forwards
/// (StepContext::training == false; docs/numerics.md "Tensor reference g", docs/evaluation.md
/// "Quantized inference evaluation"). The weight reference of every inference forward is amax(W)
/// measured at the first inference forward after Linear::reset_inference and then frozen.
/// None of these touch the training caches (Linear::reference).
enum class InferenceRef {
  Current,    ///< g = max|X| of this call (D = 1)
  Replay,     ///< sample-and-hold keyed by StepContext::infer_batch: refreshed to max|X| iff
              ///< empty or infer_batch − last ≥ D (D of reset_inference), else held
  Calibrate,  ///< calibration pass: current scaling, and the running max over calls of
              ///< max|X| is recorded as the calibrated reference
  Frozen,     ///< g = the recorded calibrated reference, whatever this call's X; throws
              ///< std::logic_error if the layer was never calibrated since the last reset
  /// llama.cpp's CPU arithmetic on a GGUF export: an FP4 linear multiplies its fprop-quantized
  /// W (frozen weight amax, as every policy) by X quantized as llama.cpp's Q8_0
  /// (fp4/numerics/q8_0.h) in the decoded GEMM; a BF16 or FP32 linear runs in FP32, as its
  /// exported FP32 weights do there (docs/export.md "FP4 weights in GGUF").
  LlamaQ8,
};

/// How data-parallel ranks agree on the activation and gradient references of a training step
/// (docs/recipes.md "Micro-batches and data parallelism"; Recipe::amax_ranks). Implemented by
/// the trainer over MPI; a Linear calls it, on every rank in the same order, whenever it has
/// measured a reference of a role other than W (weights are replicated).
struct RankReferences {
  virtual ~RankReferences() = default;
  /// The value every rank uses, given this rank's measurement `local`. `sample`: a held
  /// reference being sampled (a D > 1 refresh, or D = 1 with amax_sample = "per-step"), made
  /// on each rank's first micro-batch of the step; false: a per-call D = 1 amax.
  virtual float agree(float local, bool sample) = 0;
};

/// Per-step context handed to every Linear.
struct StepContext {
  int64_t step = 1;        ///< 1-based optimizer step (keys SR bits and held references)
  uint64_t seed = 0;       ///< run seed (keys SR bits)
  /// Run seed (train.seed, never train.sr_seed) keying the per-layer and per-step signs of the
  /// Hadamard transforms (fp4::hadamard_signs).
  uint64_t hadamard_seed = 0;
  /// Micro-batch of the step, 0-based, global over MPI ranks (keys SR bits, so draws never
  /// repeat within a step); < 65536.
  int micro = 0;
  /// Whether this is this process's first micro-batch of the step: telemetry restarts there,
  /// later micro-batches merge into it (the worst value of each statistic).
  bool first_micro = true;
  /// Data-parallel agreement on references; null for one process.
  RankReferences* ranks = nullptr;
  bool training = true;    ///< false: inference, no held-reference updates, no backward
  bool quantize = true;    ///< false: run FP32 whatever the recipe (unquantized evaluation)
  bool telemetry = false;  ///< training step whose FP4 operands get numerics statistics
  InferenceRef infer_ref = InferenceRef::Current;  ///< inference only: activation reference
  int64_t infer_batch = 1;  ///< inference only: 1-based evaluation batch (Replay's clock)
};

/// Inference-only tensor references of one Linear, kept apart from the training caches so
/// that evaluating never changes training (docs/evaluation.md "Quantized inference
/// evaluation").
struct InferenceState {
  TensorReference x{50};     ///< Replay: held activation reference, clocked by eval batch
  bool has_w = false;        ///< weight amax measured (first inference forward since reset)
  float w = 0.f;             ///< the frozen weight amax
  bool has_calibrated = false;
  float calibrated_x = 0.f;  ///< max over calibration calls of max|X|
};

/// Numerics telemetry of the five quantized operands of one FP4 Linear on a telemetry step:
/// fprop X (blocks along K), W, dgrad dY (blocks along N), wgrad dYᵀ and Xᵀ (blocks along
/// tokens, after the RHT when the recipe has it).
struct LinearTelemetry {
  static constexpr int kOperands = 5;
  static constexpr const char* kNames[kOperands] = {"x", "w", "dy", "dyt", "xt"};
  bool valid = false;  ///< set on a telemetry step of an FP4 layer
  QuantStats op[kOperands];
};

/// Operand roles of the tensor references (one cache per (layer, role)). XT_RHT and DYT_RHT
/// are the RHT-transformed wgrad operands, whose amax differs from the untransformed tensor's;
/// DY_HAD and W_HAD the Hadamard-transformed dgrad operands (fp4.hadamard_gemms "dgrad": dY
/// along N, W's columns along N; docs/numerics.md "Random Hadamard transform").
enum class Role { X = 0, W = 1, DY = 2, XT_RHT = 3, DYT_RHT = 4, DY_HAD = 5, W_HAD = 6 };
/// The number of roles (Role values 0 .. kRoleCount − 1).
inline constexpr int kRoleCount = 7;

/// Telemetry of the last GEMM calls (references used this step).
struct LinearRefs {
  float g_x = 0, g_w = 0, g_dy = 0;
};

class Linear;
/// Sees the operands of the forward() and backward() calls of the Linears it is attached to
/// (Linear::set_observer): how the fidelity panel reads each linear's X, Y and dY inside a
/// whole-model pass (docs/fidelity.md "Per-linear roles"). forward_done is called after
/// forward() has written Y [M, N], with X [M, K] as the caller passed it (before any BF16
/// boundary rounding); backward_start at the start of backward(), with dY [M, N]. The pointers
/// are valid only during the call. An observer changes nothing the Linear computes.
struct LinearObserver {
  virtual ~LinearObserver() = default;
  virtual void forward_done(const Linear& lin, const float* X, const float* Y, int64_t M) = 0;
  virtual void backward_start(const Linear& lin, const float* dY, int64_t M) = 0;
};

class Linear {
 public:
  /// A linear of `in` (K) inputs and `out` (N) outputs whose weight W [N, K] and gradient
  /// dW [N, K] live in buffers owned by the model. `id` is the layer index used in SR keys.
  /// `plan` is everything it needs from the recipe, resolved once (resolve_linear_plans, or
  /// LinearPlan::uniform(recipe, mode) for a linear without overrides): the mode, the spec of
  /// every GEMM × operand, the GEMM mode, D, the RHT and the BF16 boundary. A Linear never
  /// reads a Recipe. With plan.rht(), the token count M of every call must be a multiple of
  /// plan.hadamard_size (16 for TE's RHT); with plan.dgrad_hadamard(), `out` must be
  /// (check_hadamard_shape; backward throws std::invalid_argument otherwise). `id` also keys
  /// the per-layer and per-step Hadamard signs (fp4::hadamard_signs).
  /// dY keeps one reference per layer shared by dgrad and wgrad, whatever the two specs' T or
  /// rounding (docs/numerics.md "Tensor reference g"). The W specs may have another block
  /// length (tile side) than the X and dY specs (the recipe's fp4.weight_block): each operand
  /// is quantized with its own spec, and both GEMM modes take operands of different block
  /// lengths (docs/recipes.md "Weight tiles apart from the blocks").
  Linear(int id, int64_t in, int64_t out, const LinearPlan& plan);

  /// Bind the weight and its gradient buffer (both [N, K], row-major FP32).
  void bind(float* W, float* dW) { W_ = W; dW_ = dW; }

  /// fprop: Y [M, N] = quant(X [M, K]) · quant(W)ᵀ (overwrites Y). X must stay alive and
  /// unchanged until backward(). Throws std::invalid_argument on a non-finite X or W.
  void forward(const float* X, float* Y, int64_t M, const StepContext& ctx) {
    forward_impl(X, Y, M, ctx);
    if (obs_) obs_->forward_done(*this, X, Y, M);
  }

  /// dgrad: dX [M, K] += quant(dY) · quant(W); wgrad: dW [N, K] += quant(dYᵀ) · quant(Xᵀ)ᵀ,
  /// dY [M, N] from the matching forward() call. dX may be null (input needs no gradient).
  void backward(const float* dY, float* dX, int64_t M, const StepContext& ctx) {
    if (obs_) obs_->backward_start(*this, dY, M);
    backward_impl(dY, dX, M, ctx);
  }
  /// Attach `o` (not owned; null detaches): it sees every later forward() and backward().
  void set_observer(LinearObserver* o) { obs_ = o; }
  /// The bound weight W [N, K] (null before bind()).
  const float* weight() const { return W_; }

  int id() const { return id_; }
  int64_t in() const { return K_; }
  int64_t out() const { return N_; }
  LinearMode mode() const { return mode_; }
  /// The specs this layer quantizes with, per GEMM and operand.
  const LinearPlan& plan() const { return plan_; }
  const LinearRefs& refs() const { return refs_; }
  /// Statistics of the last telemetry step (valid == false if none yet or not FP4).
  const LinearTelemetry& telemetry() const { return tel_; }
  /// The same, writable: the trainer merges it across data-parallel ranks.
  LinearTelemetry& telemetry_for_reduction() { return tel_; }
  const TensorReference& reference(Role r) const { return ref_[static_cast<int>(r)]; }
  TensorReference& reference(Role r) { return ref_[static_cast<int>(r)]; }  ///< (resume)

  /// Forget every inference reference (frozen weight amax, Replay hold, calibration) and
  /// set Replay's interval D (≥ 1, else std::invalid_argument). Call before each evaluation,
  /// and after changing the weights outside a training forward (a training forward() resets
  /// the inference state itself, since training moves the weights).
  void reset_inference(int replay_interval = 50);
  const InferenceState& inference_state() const { return inf_; }
  /// Bytes held by this layer's own buffers, by capacity: the quantized weight kept from
  /// forward for dgrad, in BF16 mode the BF16 operand copies, and with the recipe's
  /// bf16_boundary the BF16-rounded X and dY. The transient FP4 buffers
  /// are in workspace() (see workspace_bytes), possibly shared with other linears.
  int64_t scratch_bytes() const;
  /// Use `ws` (shared, e.g. by all linears of a Model) for the transient FP4 operand buffers
  /// instead of this layer's own. Null: back to a workspace of its own.
  void bind_workspace(std::shared_ptr<LinearWorkspace> ws);
  /// Grow the workspace so that FP4 calls of M tokens allocate nothing (no-op unless FP4):
  /// to workspace_floats(plan(), in(), out(), M).
  void reserve_workspace(int64_t M);
  /// The floats of each LinearWorkspace buffer that an FP4 linear of `plan`, K inputs and N
  /// outputs needs for calls of M tokens (all zero unless FP4 in the decoded GEMM mode; the
  /// probe-matched mode's scratch grows on use). The one formula behind reserve_workspace and
  /// fp4::model_info's memory estimate.
  struct WorkspaceFloats {
    int64_t row = 0, wqd = 0, t0 = 0, t1 = 0;
    /// decoded-bf16 mode (BlockScaledGemmScratch): BF16 elements of the operand copies A and
    /// B, and floats of the unscaled product of an accumulating GEMM.
    int64_t bf16_a = 0, bf16_b = 0, product = 0;
  };
  static WorkspaceFloats workspace_floats(const LinearPlan& plan, int64_t K, int64_t N, int64_t M);
  const LinearWorkspace& workspace() const { return *ws_; }
  LinearWorkspace& workspace() { return *ws_; }

 private:
  void forward_impl(const float* X, float* Y, int64_t M, const StepContext& ctx);
  void forward_llama_q8(const float* X, float* Y, int64_t M, const StepContext& ctx);
  void backward_impl(const float* dY, float* dX, int64_t M, const StepContext& ctx);
  // The decoded dgrad GEMM: dX [M, K] += a [M, inner] · b (b [inner, K], or with tb b [K, inner]
  // transposed); under bf16_outputs the product is rounded to BF16 first (in the workspace's
  // t1), then added. gd_a, gd_b: the operands' tensor decode scales (decoded-bf16 mode only).
  void add_dgrad(int64_t M, int64_t inner, BlockScaledOperand a, float gd_a, bool tb,
                 BlockScaledOperand b, float gd_b, float* dX);
  // C [M, N] (+)= A [M, K] · op(B) of two quantized operands (B [N, K] with tb, else [K, N]),
  // timed as GEMM kind c: the FP32 GEMM of the decoded operands x̂ (FP32 only; gd_a, gd_b
  // unused), or in decoded-bf16 mode fp4::gemm_block_scaled of q·c_b (FP32 or BF16) with the
  // decode scales gd_a, gd_b.
  void quantized_product(prof::Cat c, bool tb, int64_t M, int64_t N, int64_t K,
                         BlockScaledOperand A, float gd_a, BlockScaledOperand B, float gd_b,
                         bool accumulate, float* C);
  // ---- Quartet II's quantizers (plan.quartet_forward(), plan.ms_eden(); docs/numerics.md
  // "MS-EDEN in a Linear"). The fprop X quantized by Quartet II's forward quantizer into the
  // workspace (never shared across linears).
  const float* quantize_fprop_x_quartet(const float* X, int64_t M, float gx);
  // The fprop W [N, K] quantized into wq_ (M-independent): the block quantizer with the fprop W
  // spec, or Quartet II's forward quantizer under plan.quartet_forward(). Training forwards and
  // the llama-q8_0 inference forward share it, so an evaluation quantizes W as training did.
  // block_scaled: q·c_b (decoded-bf16 GEMM) instead of x̂ (the llama-q8_0 forward passes false).
  void quantize_fprop_w(float gw, const SrKey& kw, bool block_scaled);
  // dgrad and wgrad by MS-EDEN from the forward's X̂ (xhat_) and Ŵ (wq_) and dY.
  void backward_ms_eden(const float* dY, float* dX, int64_t M, const StepContext& ctx);
  // One MS-EDEN operand: src [rows, cols] (or, `transposed`, src [cols, rows] read as its
  // transpose) zero-padded to [rows, cols_p], transformed along the padded dim by h, its
  // reference (role r) measured, MS-EDEN-quantized with `key` and decoded into out [rows, cols_p].
  void ms_eden_operand(const float* src, int64_t rows, int64_t cols, bool transposed,
                       int64_t cols_p, const HadamardTransform& h, Role r, const SrKey& key,
                       const StepContext& ctx, float* out);
  AlignedFloats xhat_;  // plan.ms_eden(): the forward's quantized X̂ [M, K], kept for wgrad
  // FP4 mode: quantize a [rows, cols] operand into `out` with `spec`: x̂ = q·d_b (dequantized),
  // or with block_scaled q·c_b for the decoded-bf16 GEMM (its decode scale: decode_scale).
  void prep(const float* src, int64_t rows, int64_t cols, const BlockQuantSpec& spec, float g,
            const SrKey* key, float* out, bool block_scaled) const;
  // The same with q·c_b written as BF16 bit patterns (bf16_operands(); out must not overlap src).
  void prep(const float* src, int64_t rows, int64_t cols, const BlockQuantSpec& spec, float g,
            const SrKey* key, uint16_t* out) const;
  // Whether this linear's FP4 operands are q·c_b for the decoded-bf16 GEMM.
  bool block_scaled() const { return plan_.bf16_gemm(); }
  // Whether the decoded-bf16 GEMM's activation operands (fprop X, dgrad dY, wgrad dYᵀ and Xᵀ)
  // are quantized straight to BF16 bit patterns: where the GEMM runs on BF16 units (gemm_bf16's
  // native or blocked path), which then read them in place instead of converting FP32 copies
  // (docs/gemm.md "Decoded FP4 on the BF16 GEMM", "Paths"; the same values, so the same bits).
  // The widened path (AVX2, or Intel without AMX) multiplies FP32 operands, so they stay FP32 there.
  // Per operand, only where its quantizer is the fused SIMD kernel (simd_x_, simd_dy_,
  // simd_wgrad_, set once from the plan).
  bool bf16_operands() const { return block_scaled() && gemm_bf16_path() != Bf16GemmPath::Widened; }
  bool simd_x_ = false, simd_dy_ = false, simd_wgrad_ = false;
  // The decode scale the GEMM applies for an operand quantized with spec and reference g:
  // tensor_decode_scale(spec, g) for the decoded-bf16 GEMM's q·c_b, 1 for x̂ (gd already in it).
  float operand_gd(const BlockQuantSpec& spec, float g) const {
    return block_scaled() ? tensor_decode_scale(spec, g) : 1.f;
  }
  float reference_for(Role r, const float* x, int64_t n, const StepContext& ctx);
  template <class F>
  float training_reference(Role r, const StepContext& ctx, F&& measure);
  // FP4 dgrad under the plan's Hadamard transform h (docs/numerics.md "Random Hadamard
  // transform"): dyq [M, N] = q(dY with its rows transformed in N-chunks), its reference that of
  // the transformed dY (Role::DY_HAD); and the dequantized dgrad weight [N, K] = q(W with its
  // columns transformed), in ws.wqd (Role::W_HAD), which the function returns.
  // gd: the operand's tensor decode scale (for the decoded-bf16 GEMM).
  void dgrad_hadamard_dy(const float* dY, int64_t M, const StepContext& ctx,
                         const HadamardTransform& h, bool tel, float* dyq, float& gd);
  const float* dgrad_hadamard_w(const StepContext& ctx, const HadamardTransform& h, float& gd);
  // FP4 fprop X [M, K] quantized into the workspace (or reused there, see LinearWorkspace).
  // As BF16 bit patterns where bf16_operands().
  BlockScaledOperand quantize_fprop_x(const float* X, int64_t M, float gx, const SrKey& kx);
  // Whether any quantizer of this layer's operand role r uses the tensor reference g (the MX
  // scale rules never do); the amax behind an unused reference is never measured.
  bool uses_reference(Role r) const;
  // FP4 with gemm = probe-matched (fidelity mode, slow).
  bool probe() const { return plan_.probe(); }
  // ---- Row-scaled activation (recipe fp4.row_scaled_activation; docs/numerics.md "Per-row
  // reference"): X and Xᵀ take one current reference per row, never held.
  bool row_scaled_x() const { return mode_ == LinearMode::FP4 && plan_.row_scaled_activation; }
  // The per-row references of the fprop X [M, K] into x_row_g_ (training and the inference
  // policies that measure the current X; others throw UserError); returns their max (= max|X|,
  // reported as refs().g_x).
  float measure_x_rows(const float* X, int64_t M, const StepContext& ctx);
  // FP4 fprop X quantized per row (x_row_g_) into the workspace.
  const float* quantize_fprop_x_rows(const float* X, int64_t M, const SrKey& kx);
  // The decoded wgrad Xᵀ [K, M] into xt (blocks along tokens, the RHT if any), with the
  // reference g_xt or, row-scaled, one per row; and its telemetry from the materialised xt.
  void quantize_wgrad_x(int64_t M, float g_xt, const SrKey& kx, const HadamardTransform* wh, float* xt);
  // The same as q·c_b in BF16 bit patterns (bf16_operands(); never row-scaled there).
  void quantize_wgrad_x(int64_t M, float g_xt, const SrKey& kx, const HadamardTransform* wh,
                        uint16_t* xt);
  QuantStats wgrad_x_stats(const float* xt, int64_t M, float g_xt, const SrKey& kx);
  std::vector<float> x_row_g_;  // [M] per-row references of the last fprop X
  std::vector<float> xt_row_g_;  // [K] per-row references of the last wgrad Xᵀ

  int id_;
  int64_t K_, N_;
  LinearMode mode_;
  LinearPlan plan_;
  float* W_ = nullptr;
  float* dW_ = nullptr;
  const float* X_ = nullptr;  // input of the last forward
  int64_t M_ = 0;
  bool quantized_ = false;    // whether the last forward quantized (ctx.quantize)
  TensorReference ref_[kRoleCount];
  InferenceState inf_;        // inference references; never read or written by training
  LinearRefs refs_;
  LinearTelemetry tel_;
  bool merge_tel_ = false;  // this step's telemetry merges into tel_ (a later micro-batch)
  void note_stats(int operand, const QuantStats& s);
  AlignedFloats wq_;  // quantized (FP4) weight of the last forward, reused by dgrad
  // recipe.bf16_boundary: X of the last forward (kept for wgrad) and dY, rounded to BF16.
  AlignedFloats xr_, dyr_;
  // BF16 mode: X, W (from fprop, reused by backward) and dY as BF16 bit patterns.
  std::vector<uint16_t, Aligned64<uint16_t>> xb_, wb_, dyb_;
  std::shared_ptr<LinearWorkspace> ws_;  // transient FP4 operand buffers (maybe shared)
  LinearObserver* obs_ = nullptr;        // set_observer
};

}  // namespace fp4::nn
