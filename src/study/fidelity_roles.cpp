// The per-linear roles' building blocks (docs/fidelity.md "Per-linear roles"): the Capture
// observer of a pass's operands, the replay of one linear alone, and the role tensors' moments
// accumulated one draw at a time. fidelity_run.cpp puts them together per batch.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "fidelity_internal.h"

namespace fp4::fidelity_detail {

Capture::Capture(nn::Model& m) : m_(m), ops_(m.linears().size()) {
  for (size_t i = 0; i < m.linears().size(); ++i) {
    index_[&m.linears()[i]] = i;
    m.linears()[i].set_observer(this);
  }
}

Capture::~Capture() {
  for (auto& lin : m_.linears()) lin.set_observer(nullptr);
}

void Capture::forward_done(const nn::Linear& lin, const float* X, const float* Y, int64_t M) {
  Ops& o = ops_.at(index_.at(&lin));
  o.X.assign(X, X + M * lin.in());
  o.Y.assign(Y, Y + M * lin.out());
  o.M = M;
  ++o.forwards;
}

void Capture::backward_start(const nn::Linear& lin, const float* dY, int64_t M) {
  Ops& o = ops_.at(index_.at(&lin));
  o.dY.assign(dY, dY + M * lin.out());
  ++o.backwards;
}

void Capture::clear() {
  for (Ops& o : ops_) o.forwards = o.backwards = 0;
}

const Capture::Ops& Capture::at(size_t i, const std::string& name) const {
  const Ops& o = ops_.at(i);
  if (o.forwards != 1 || o.backwards != 1)
    throw std::logic_error(
        "fidelity: linear " + name + " ran " + std::to_string(o.forwards) + " forward and " +
        std::to_string(o.backwards) +
        " backward calls in one pass; per-linear roles need exactly one of each");
  return o;
}

RoleTensors replay(const nn::Linear& lin, const std::array<TensorReference, nn::kRoleCount>& refs,
                   const float* X, const float* dY, int64_t M, const nn::StepContext& ctx) {
  const int64_t K = lin.in(), N = lin.out();
  nn::Linear rep(lin.id(), K, N, lin.plan());
  std::vector<float> W(lin.weight(), lin.weight() + N * K);
  RoleTensors t;
  t.Y.resize(size_t(M * N));
  t.dX.assign(size_t(M * K), 0.f);
  t.dW.assign(size_t(N * K), 0.f);
  rep.bind(W.data(), t.dW.data());
  for (int r = 0; r < nn::kRoleCount; ++r) rep.reference(static_cast<nn::Role>(r)) = refs[size_t(r)];
  rep.forward(X, t.Y.data(), M, ctx);
  rep.backward(dY, t.dX.data(), M, ctx);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

ReferenceState reference_state(const nn::Model& m) {
  ReferenceState s(m.linears().size());
  for (size_t i = 0; i < s.size(); ++i)
    for (int r = 0; r < nn::kRoleCount; ++r)
      s[i][size_t(r)] = m.linears()[i].reference(static_cast<nn::Role>(r));
  return s;
}

void StreamMoments::add(const float* x, const float* ref, size_t n) {
  if (m.draws == 0) {
    sum.assign(n, 0.0);
    for (size_t i = 0; i < n; ++i) m.ref_sq += double(ref[i]) * ref[i];
  }
  double e = 0, dt = 0, es = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = x[i], g = ref[i];
    e += (v - g) * (v - g);
    dt += v * g;
    es += v * v;
    sum[i] += v;
  }
  m.err_sq.push_back(e);
  m.dot.push_back(dt);
  m.est_sq.push_back(es);
  ++m.draws;
}

DrawMoments StreamMoments::finish(const float* ref) {
  const double R = m.draws;
  double me = 0, mm = 0, es = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    const double mean = sum[i] / R, g = ref[i];
    me += (mean - g) * (mean - g);
    mm += mean * mean;
  }
  for (double v : m.est_sq) es += v;
  m.mean_err_sq = me;
  m.spread_sq = std::max(0.0, es - R * mm);
  return m;
}

void add_moments(DrawMoments& acc, const DrawMoments& m) {
  if (acc.draws == 0) {
    acc = m;
    return;
  }
  acc.ref_sq += m.ref_sq;
  for (size_t d = 0; d < acc.err_sq.size(); ++d) {
    acc.err_sq[d] += m.err_sq[d];
    acc.dot[d] += m.dot[d];
    acc.est_sq[d] += m.est_sq[d];
  }
  acc.mean_err_sq += m.mean_err_sq;
  acc.spread_sq += m.spread_sq;
}

}  // namespace fp4::fidelity_detail
