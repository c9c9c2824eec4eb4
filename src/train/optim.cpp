// AdamW, WSD schedule, global-norm clipping.
#include <algorithm>
#include <cmath>

#include "fp4/train.h"

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

double clip_grad_norm(float* g, int64_t n, double max_norm) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    const int64_t e = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < e; ++i) s += double(g[i]) * g[i];
    part[c] = s;
  }
  double total = 0;
  for (double p : part) total += p;  // fixed order
  const double norm = std::sqrt(total);
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) {
    const float s = static_cast<float>(max_norm / norm);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) g[i] *= s;
  }
  return norm;
}

void AdamW::step(float* params, const float* grads, const std::vector<nn::ParamInfo>& infos,
                 double lr, int t) {
  const double b1 = c_.beta1, b2 = c_.beta2;
  const float bc1 = static_cast<float>(1.0 - std::pow(b1, t));
  const float bc2 = static_cast<float>(1.0 - std::pow(b2, t));
  const float flr = static_cast<float>(lr), eps = static_cast<float>(c_.eps);
  const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
  for (const auto& p : infos) {
    const float wd = p.weight_decay ? static_cast<float>(c_.weight_decay) : 0.f;
    float* w = params + p.offset;
    const float* g = grads + p.offset;
    float* m = m_.data() + p.offset;
    float* v = v_.data() + p.offset;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < p.size; ++i) {
      m[i] = fb1 * m[i] + (1.f - fb1) * g[i];
      v[i] = fb2 * v[i] + (1.f - fb2) * g[i] * g[i];
      const float mh = m[i] / bc1, vh = v[i] / bc2;
      w[i] -= flr * (mh / (std::sqrt(vh) + eps) + wd * w[i]);
    }
  }
}

}  // namespace fp4
