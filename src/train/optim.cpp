// AdamW, WSD schedule, global-norm clipping.
#include <algorithm>
#include <cmath>

#include "fp4/nn/layers.h"
#include "fp4/train/train.h"

namespace fp4 {

double wsd_lr(const TrainConfig& c, int step) {
  const double peak = c.lr;
  if (c.warmup_steps > 0 && step <= c.warmup_steps) return peak * step / c.warmup_steps;
  const int decay = static_cast<int>(std::ceil(c.decay_fraction * c.steps));
  const int decay_start = c.steps - decay;  // steps decay_start+1 .. steps decay
  if (decay <= 0 || step <= decay_start) return peak;
  const double frac = double(step - decay_start) / decay;  // (0, 1]
  return peak * (1.0 - frac * (1.0 - c.min_lr_ratio));
}

// The sum of squares and the scaling are nn::detail kernels (layers_fast.cpp: Highway,
// threaded, canonical sum order); the _ref twins below use their scalar twins (layers_ref.cpp).
double clip_grad_norm(float* g, int64_t n, double max_norm) {
  const double norm = std::sqrt(nn::detail::sum_squares(g, n));
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm))
    nn::detail::scale_inplace(g, n, static_cast<float>(max_norm / norm));
  return norm;
}

namespace detail {
double clip_grad_norm_ref(float* g, int64_t n, double max_norm) {
  const double norm = std::sqrt(nn::detail::sum_squares_ref(g, n));
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm))
    nn::detail::scale_inplace_ref(g, n, static_cast<float>(max_norm / norm));
  return norm;
}
}  // namespace detail

nn::detail::AdamWCoeffs AdamW::coeffs(double lr, int t) const {
  const double b1 = c_.beta1, b2 = c_.beta2;
  nn::detail::AdamWCoeffs k{};
  k.b1 = static_cast<float>(b1);
  k.b2 = static_cast<float>(b2);
  k.omb1 = 1.f - k.b1;
  k.omb2 = 1.f - k.b2;
  k.bc1 = static_cast<float>(1.0 - std::pow(b1, t));
  k.bc2 = static_cast<float>(1.0 - std::pow(b2, t));
  k.lr = static_cast<float>(lr);
  k.eps = static_cast<float>(c_.eps);
  k.wd = 0.f;
  return k;
}

void AdamW::step(float* params, const float* grads, const std::vector<nn::ParamInfo>& infos,
                 double lr, int t) {
  nn::detail::AdamWCoeffs k = coeffs(lr, t);
  for (const auto& p : infos) {
    k.wd = p.weight_decay ? static_cast<float>(c_.weight_decay) : 0.f;
    nn::detail::adamw_update(params + p.offset, grads + p.offset, m_.data() + p.offset,
                             v_.data() + p.offset, p.size, k);
  }
}

void AdamW::step_ref(float* params, const float* grads,
                     const std::vector<nn::ParamInfo>& infos, double lr, int t) {
  nn::detail::AdamWCoeffs k = coeffs(lr, t);
  for (const auto& p : infos) {
    k.wd = p.weight_decay ? static_cast<float>(c_.weight_decay) : 0.f;
    nn::detail::adamw_update_ref(params + p.offset, grads + p.offset, m_.data() + p.offset,
                                 v_.data() + p.offset, p.size, k);
  }
}

}  // namespace fp4
