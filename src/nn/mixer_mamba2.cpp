// 'M' blocks: the Mamba-2 mixer of Nemotron-H (mamba_ssm Mamba2 / HF NemotronHMamba2Mixer,
// Dao & Gu 2024), with its two projections as FP4-eligible Linears and everything between
// them in FP32 (fp4/nn/ssm.h):
//   zxbcdt = in_proj(x)                      d → 2·d_inner + 2·G·N + H, no bias, split into
//                                            z [d_inner] | xBC [d_inner + 2·G·N] | dt [H]
//   xBC'   = SiLU(conv1d(xBC) + bias)        depthwise causal, width mamba_conv_kernel
//   y      = SSD(x', B', C', Δ = softplus(dt + dt_bias), A = −exp(A_log), D)
//            (x', B', C' the d_inner | G·N | G·N columns of xBC')
//   out    = out_proj(RMSNormGated(y, z))    y·SiLU(z), RMSNorm per group of d_inner/G
//                                            channels (weight d_inner), then d_inner → d
// Parameters (storage order; full names layers.N.mixer.*): conv1d [C', W] and conv1d_bias
// [C'] (C' = d_inner + 2·G·N), dt_bias [H], A_log [H], D [H], norm [d_inner], then the
// in_proj [2·d_inner + 2·G·N + H, d] and out_proj [d, d_inner] weights. No weight decay on
// conv1d_bias, dt_bias, A_log, D, norm (as mamba_ssm's _no_weight_decay on A_log and D, and
// the usual exemption of biases and norms).
//
// Initialisation (mamba_ssm Mamba2.__init__ and HF NemotronHPreTrainedModel._init_weights):
//   in_proj N(0, init_std); out_proj N(0, init_std/sqrt(n_blocks)) (Model::init);
//   conv1d and conv1d_bias U(−1/sqrt(W), 1/sqrt(W)): PyTorch's Conv1d default (kaiming
//     uniform with a = sqrt(5), fan_in = W for a depthwise conv), which mamba_ssm keeps;
//   dt_bias = softplus⁻¹(dt) = dt + log(−expm1(−dt)), dt = exp(U(log dt_min, log dt_max))
//     floored at dt_init_floor (mamba_ssm's dt initialisation);
//   A_log[h] = log(h + 1) (HF NemotronH: A = arange(1, H + 1)); D = 1; norm = 1.
#include <cmath>
#include <cstring>
#include <string>

#include "fp4/nn/layers.h"
#include "fp4/nn/mixer.h"
#include "fp4/nn/ssm.h"
#include "fp4/base/profile.h"
#include "mixers.h"

namespace fp4::nn {
using prof::Cat;
using prof::Scope;

namespace {
enum { kConv = 0, kConvBias, kDtBias, kALog, kD, kNorm };

class Mamba2Mixer final : public Mixer {
 public:
  explicit Mamba2Mixer(const ModelConfig& c)
      : d_(c.d_model), H_(c.mamba_num_heads), P_(c.mamba_head_dim), G_(c.mamba_n_groups),
        N_(c.mamba_state_size), W_(c.mamba_conv_kernel), Q_(c.mamba_chunk_size),
        di_(H_ * P_), Cc_(di_ + 2 * G_ * N_), Din_(2 * di_ + 2 * G_ * N_ + H_), eps_(c.norm_eps),
        dt_min_(c.mamba_dt_min), dt_max_(c.mamba_dt_max), dt_floor_(c.mamba_dt_init_floor) {}
  char symbol() const override { return 'M'; }
  std::vector<MixerParam> params() const override {
    return {{"conv1d", Cc_, W_, true, ParamInit::kCustom},
            {"conv1d_bias", 1, Cc_, false, ParamInit::kCustom},
            {"dt_bias", 1, H_, false, ParamInit::kCustom},
            {"A_log", 1, H_, false, ParamInit::kCustom},
            {"D", 1, H_, false, ParamInit::kOnes},
            {"norm", 1, di_, false, ParamInit::kOnes}};
  }
  std::vector<MixerLinear> linears() const override {
    return {{"in_proj", d_, Din_, false}, {"out_proj", di_, d_, true}};
  }
  void init_param(size_t i, float* w, std::mt19937_64& rng) const override {
    switch (i) {
      case kConv:
      case kConvBias: {
        const float b = 1.f / std::sqrt(float(W_));
        std::uniform_real_distribution<float> u(-b, b);
        const int64_t n = i == kConv ? Cc_ * W_ : Cc_;
        for (int64_t k = 0; k < n; ++k) w[k] = u(rng);
        break;
      }
      case kDtBias: {
        std::uniform_real_distribution<double> u(std::log(double(dt_min_)), std::log(double(dt_max_)));
        for (int64_t h = 0; h < H_; ++h) {
          const double dt = std::max(std::exp(u(rng)), double(dt_floor_));
          w[h] = float(dt + std::log(-std::expm1(-dt)));
        }
        break;
      }
      case kALog:
        for (int64_t h = 0; h < H_; ++h) w[h] = float(std::log(double(h + 1)));
        break;
      default:
        Mixer::init_param(i, w, rng);
    }
  }
  int64_t ws_floats(int64_t B, int64_t T) const {
    return ssd_workspace_floats(B, T, H_, P_, G_, N_, Q_);
  }
  // Kept: zxbcdt [BT, Din], xBC' [BT, C'], y [BT, d_inner], the gated norm's output
  // [BT, d_inner] (out_proj's input) and rstd [BT, G], the SSD workspace (chunk states, Δ).
  int64_t activation_floats(int64_t batch, int64_t T) const override {
    const int64_t BT = batch * T;
    return BT * (Din_ + Cc_ + 2 * di_ + G_) + ws_floats(batch, T);
  }
  // dyn, dy [BT, d_inner], dzxbcdt [BT, Din], dxBC' [BT, C'].
  int64_t scratch_floats(int64_t batch, int64_t T) const override {
    const int64_t BT = batch * T;
    return BT * (2 * di_ + Din_ + Cc_);
  }
  struct Acts {
    float *zx, *xbc, *y, *yn, *rstd, *ws;
  };
  Acts acts(float* p, int64_t BT) const {
    Acts a;
    a.zx = p;
    a.xbc = a.zx + BT * Din_;
    a.y = a.xbc + BT * Cc_;
    a.yn = a.y + BT * di_;
    a.rstd = a.yn + BT * di_;
    a.ws = a.rstd + BT * G_;
    return a;
  }
  SsdDims dims(int64_t B, int64_t T) const { return SsdDims{B, T, H_, P_, G_, N_, Q_}; }
  // Model FLOPs of the recurrence per token and direction: state update Δ·x·Bᵀ and readout
  // S·C, 2·d_inner·N each.
  double scan_flops(int64_t BT) const { return 4.0 * double(di_) * double(N_) * double(BT); }

  void forward(const MixerCall& c, const float* x, float* out) override {
    const int64_t B = c.B, T = c.T, BT = B * T;
    const Acts A = acts(c.acts, BT);
    const float* const* p = c.params;
    c.linears[0].forward(x, A.zx, BT, *c.ctx);
    {
      Scope s(Cat::kSsmConv);
      ssm_conv_forward(A.xbc, A.zx + di_, Din_, p[kConv], p[kConvBias], B, T, Cc_, W_);
    }
    {
      Scope s(Cat::kSsmScan);
      prof::add_flops(Cat::kSsmScan, scan_flops(BT));
      ssd_scan_forward(A.y, A.ws, A.xbc, Cc_, A.xbc + di_, Cc_, A.xbc + di_ + G_ * N_, Cc_,
                       A.zx + di_ + Cc_, Din_, p[kDtBias], p[kALog], p[kD], dims(B, T));
    }
    {
      Scope s(Cat::kSsmNorm);
      gated_rmsnorm_forward(A.yn, A.rstd, A.y, A.zx, Din_, p[kNorm], BT, di_, G_, eps_);
    }
    c.linears[1].forward(A.yn, out, BT, *c.ctx);
  }

  void backward(const MixerCall& c, const float* x, const float* dout, float* dx) override {
    (void)x;
    const int64_t B = c.B, T = c.T, BT = B * T;
    const Acts A = acts(c.acts, BT);
    const float* const* p = c.params;
    float* const* g = c.grads;
    float* dyn = c.scratch;
    float* dy = dyn + BT * di_;
    float* dzx = dy + BT * di_;
    float* dxbc = dzx + BT * Din_;
    std::memset(dyn, 0, sizeof(float) * BT * di_);
    c.linears[1].backward(dout, dyn, BT, *c.ctx);
    std::memset(dy, 0, sizeof(float) * BT * di_);
    std::memset(dzx, 0, sizeof(float) * BT * Din_);
    {
      Scope s(Cat::kSsmNorm);
      gated_rmsnorm_backward(dy, dzx, g[kNorm], dyn, A.y, A.zx, Din_, p[kNorm], A.rstd, BT, di_,
                             G_);
    }
    std::memset(dxbc, 0, sizeof(float) * BT * Cc_);
    {
      Scope s(Cat::kSsmScanBwd);
      prof::add_flops(Cat::kSsmScanBwd, 2.0 * scan_flops(BT));
      ssd_scan_backward(dxbc, dxbc + di_, dxbc + di_ + G_ * N_, dzx + di_ + Cc_, g[kALog], g[kD],
                        g[kDtBias], dy, A.ws, A.xbc, Cc_, A.xbc + di_, Cc_,
                        A.xbc + di_ + G_ * N_, Cc_, A.zx + di_ + Cc_, Din_, p[kDtBias], p[kALog],
                        p[kD], dims(B, T));
    }
    {
      Scope s(Cat::kSsmConv);
      ssm_conv_backward(dzx + di_, g[kConv], g[kConvBias], dxbc, A.zx + di_, Din_, p[kConv],
                        p[kConvBias], B, T, Cc_, W_);
    }
    std::memset(dx, 0, sizeof(float) * BT * d_);
    c.linears[0].backward(dzx, dx, BT, *c.ctx);
  }
  // PaLM-style: the SSD's state update and readout, 2·d_inner·N FLOPs each per token
  // forward, ×3 with backward (the analogue of attention's 12·d·T).
  double extra_flops_per_token(int64_t T) const override {
    (void)T;
    return 12.0 * double(di_) * double(N_);
  }

 private:
  int64_t d_, H_, P_, G_, N_, W_, Q_, di_, Cc_, Din_;
  float eps_, dt_min_, dt_max_, dt_floor_;
};
}  // namespace

namespace {
void check_mamba2(const ModelConfig& m, const ConfigFail& fail) {
  if (m.mamba_num_heads < 1)
    fail("model.mamba_num_heads must be set (>= 1): the pattern has Mamba-2 blocks ('M')");
  if (m.mamba_n_groups < 1 || m.mamba_num_heads % m.mamba_n_groups != 0)
    fail("model.mamba_num_heads (" + std::to_string(m.mamba_num_heads) +
         ") must be a multiple of model.mamba_n_groups (" + std::to_string(m.mamba_n_groups) + ")");
  if (m.mamba_dt_min > m.mamba_dt_max) fail("model.mamba_dt_min must not exceed model.mamba_dt_max");
}

std::unique_ptr<Mixer> make_mamba2(const ModelConfig& c) { return std::make_unique<Mamba2Mixer>(c); }

// HF NemotronHMamba2Mixer: conv1d.weight [C', 1, W], conv1d.bias, dt_bias, A_log, D,
// norm.weight, in_proj.weight, out_proj.weight.
std::vector<HfPiece> hf_mamba2(const std::string& m, const float* v, int64_t rows, int64_t cols,
                               const ModelConfig& cfg) {
  (void)cfg;
  const int64_t n = rows * cols;
  std::vector<float> data(v, v + n);
  if (m == "conv1d") return {{"conv1d.weight", {rows, 1, cols}, std::move(data)}};
  if (m == "conv1d_bias") return {{"conv1d.bias", {n}, std::move(data)}};
  if (m == "dt_bias" || m == "A_log" || m == "D") return {{m, {n}, std::move(data)}};
  if (m == "norm") return {{"norm.weight", {n}, std::move(data)}};
  if (m == "in_proj" || m == "out_proj") return {{m + ".weight", {rows, cols}, std::move(data)}};
  return {};
}
}  // namespace

MixerKind mamba2_mixer_kind() {
  MixerKind k;
  k.symbol = 'M';
  k.name = "Mamba-2";
  k.key = "mamba2";
  k.linears = {"in_proj", "out_proj"};
  k.check = check_mamba2;
  k.make = make_mamba2;
  k.hf = hf_mamba2;  // no Llama layout: hf_llama_module stays empty
  return k;
}

}  // namespace fp4::nn
