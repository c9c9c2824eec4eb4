// '-' blocks: the MLP. up_proj: d → F (squared ReLU, Nemotron-H and Primer's relu²) or
// d → 2F (SwiGLU, gate and value fused in one linear), down_proj: F → d, no biases.
#include "fp4/nn/layers.h"
#include "fp4/nn/mixer.h"
#include "fp4/base/profile.h"
#include "mixers.h"

#include <cstring>

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

std::unique_ptr<Mixer> make_mlp_mixer(const ModelConfig& c) { return std::make_unique<MlpMixer>(c); }

}  // namespace fp4::nn
