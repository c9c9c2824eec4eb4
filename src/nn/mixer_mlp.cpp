// '-' blocks: the MLP. up_proj: d → F (squared ReLU, Nemotron-H and Primer's relu²) or
// d → 2F (SwiGLU, gate and value fused in one linear), down_proj: F → d, no biases.
#include "fp4/nn/layers.h"
#include "fp4/nn/mixer.h"
#include "fp4/base/profile.h"
#include "mixers.h"

#include <cstring>
#include <string>

namespace fp4::nn {
using prof::Cat;
using prof::Scope;

namespace {
class MlpMixer final : public Mixer {
 public:
  explicit MlpMixer(const ModelConfig& c)
      : d_(c.d_model), F_(c.mlp_hidden), swiglu_(c.mlp == "swiglu"), U_(swiglu_ ? 2 * F_ : F_) {}
  char symbol() const override { return '-'; }
  std::vector<MixerLinear> linears() const override {
    return {{"up_proj", d_, U_, false}, {"down_proj", F_, d_, true}};
  }
  // Kept: h = up(x) [BT, U], a = act(h) [BT, F].
  int64_t activation_floats(int64_t batch, int64_t T) const override {
    return batch * T * (U_ + F_);
  }
  // da [BT, F], dh [BT, U].
  int64_t scratch_floats(int64_t batch, int64_t T) const override {
    return batch * T * (U_ + F_);
  }
  void forward(const MixerCall& c, const float* x, float* out) override {
    const int64_t BT = int64_t(c.B) * c.T;
    float* h = c.acts;
    float* a = h + BT * U_;
    c.linears[0].forward(x, h, BT, *c.ctx);
    {
      Scope s(Cat::kActivation);
      if (swiglu_)
        swiglu_forward(a, h, BT, F_);
      else
        squared_relu_forward(a, h, BT * F_);
    }
    c.linears[1].forward(a, out, BT, *c.ctx);
  }
  void backward(const MixerCall& c, const float* x, const float* dout, float* dx) override {
    (void)x;
    const int64_t BT = int64_t(c.B) * c.T;
    const float* h = c.acts;
    float* da = c.scratch;
    float* dh = da + BT * F_;
    std::memset(da, 0, sizeof(float) * BT * F_);
    c.linears[1].backward(dout, da, BT, *c.ctx);
    std::memset(dh, 0, sizeof(float) * BT * U_);
    {
      Scope s(Cat::kActivation);
      if (swiglu_)
        swiglu_backward(dh, da, h, BT, F_);
      else
        squared_relu_backward(dh, da, h, BT * F_);
    }
    std::memset(dx, 0, sizeof(float) * BT * d_);
    c.linears[0].backward(dh, dx, BT, *c.ctx);
  }

 private:
  int64_t d_, F_;
  bool swiglu_;
  int64_t U_;
};
}  // namespace

namespace {
std::unique_ptr<Mixer> make_mlp(const ModelConfig& c) { return std::make_unique<MlpMixer>(c); }

// SwiGLU's fused up_proj [2F, d] is HF's gate_proj (rows 0..F) and up_proj (rows F..2F).
std::vector<HfPiece> hf_mlp(const std::string& m, const float* v, int64_t rows, int64_t cols,
                            const ModelConfig& cfg) {
  if (m == "up_proj" && cfg.mlp == "swiglu") {
    const int64_t F = rows / 2;
    return {{"gate_proj.weight", {F, cols}, std::vector<float>(v, v + F * cols)},
            {"up_proj.weight", {F, cols}, std::vector<float>(v + F * cols, v + 2 * F * cols)}};
  }
  if (m == "up_proj" || m == "down_proj")
    return {{m + ".weight", {rows, cols}, std::vector<float>(v, v + rows * cols)}};
  return {};
}
}  // namespace

MixerKind mlp_mixer_kind() {
  MixerKind k;
  k.symbol = '-';
  k.name = "MLP";
  k.key = "mlp";
  k.linears = {"up_proj", "down_proj"};
  k.make = make_mlp;  // model.mlp's values are the parser's
  k.hf_llama_module = "mlp.";
  k.hf_llama_norm = "post_attention_layernorm.weight";
  k.hf = hf_mlp;
  return k;
}

}  // namespace fp4::nn
