// The hybrid (Nemotron-H) model: finite-difference gradients of the Mamba-2 and GQA attention
// mixers through the Mixer interface (every parameter, every element) and of a whole hybrid
// model (a random subset of every parameter tensor); the Mamba-2 parameter shapes and
// initialisation against the definitions of mamba_ssm Mamba2 / HF NemotronHMamba2Mixer
// written out here; thread-count independence of a hybrid training step (FP32 and two FP4
// recipes); the Llama pattern "*-*-" bit-identical to n_layers = 2; config errors naming the key.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fp4/nn/run_config.h"
#include "fp4/base/error.h"
#include "fp4/nn/linear.h"
#include "fp4/nn/mixer.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"
#include "support/step_test_setup.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {

// Sets the OpenMP team size for the scope.
struct TeamSize {
  int saved = omp_get_max_threads();
  explicit TeamSize(int n) { omp_set_num_threads(n); }
  ~TeamSize() { omp_set_num_threads(saved); }
};

// One block's mixer driven through the Mixer interface as Model drives it: its params() in
// buffers of their own, its linears() as FP32-mode Linears bound to weight / gradient
// buffers and to one shared LinearWorkspace, activation and scratch buffers of the sizes the
// mixer asks for.
struct MixerRig {
  ModelConfig cfg;
  int B, T;
  Recipe recipe;  // default: FP32
  nn::StepContext ctx;
  std::unique_ptr<nn::Mixer> mixer;
  std::vector<nn::MixerParam> pinfo;
  std::vector<nn::MixerLinear> linfo;
  std::vector<std::vector<float>> p, g, w, dw;
  std::vector<nn::Linear> lin;
  std::shared_ptr<nn::LinearWorkspace> ws = std::make_shared<nn::LinearWorkspace>();
  std::vector<float> acts, scratch, y, dx;
  std::vector<const float*> pp;
  std::vector<float*> gp;

  MixerRig(char symbol, const ModelConfig& c, int B_, int T_) : cfg(c), B(B_), T(T_) {
    mixer = nn::make_mixer(symbol, cfg);
    pinfo = mixer->params();
    linfo = mixer->linears();
    for (const auto& q : pinfo) {
      p.emplace_back(q.rows * q.cols, 0.f);
      g.emplace_back(q.rows * q.cols, 0.f);
    }
    lin.reserve(linfo.size());
    for (size_t i = 0; i < linfo.size(); ++i) {
      w.emplace_back(linfo[i].in * linfo[i].out, 0.f);
      dw.emplace_back(linfo[i].in * linfo[i].out, 0.f);
      lin.emplace_back(int(i), linfo[i].in, linfo[i].out,
                       LinearPlan::uniform(recipe, LinearMode::FP32));
    }
    for (size_t i = 0; i < lin.size(); ++i) {
      lin[i].bind(w[i].data(), dw[i].data());
      lin[i].bind_workspace(ws);
    }
    for (size_t i = 0; i < p.size(); ++i) {
      pp.push_back(p[i].data());
      gp.push_back(g[i].data());
    }
    acts.assign(mixer->activation_floats(B, T), 0.f);
    scratch.assign(std::max<int64_t>(1, mixer->scratch_floats(B, T)), 0.f);
    y.assign(int64_t(B) * T * cfg.d_model, 0.f);
    dx.assign(y.size(), 0.f);
  }
  nn::MixerCall call() {
    nn::MixerCall c;
    c.B = B;
    c.T = T;
    c.params = pp.data();
    c.grads = gp.data();
    c.linears = lin.data();
    c.acts = acts.data();
    c.scratch = scratch.data();
    c.workspace = ws.get();
    c.ctx = &ctx;
    return c;
  }
  // L = Σ r ⊙ y of an FP32 forward, accumulated in double.
  double loss(const std::vector<float>& x, const std::vector<float>& r) {
    mixer->forward(call(), x.data(), y.data());
    double L = 0.0;
    for (size_t i = 0; i < y.size(); ++i) L += double(r[i]) * double(y[i]);
    return L;
  }
  // dL/dx into dx, parameter and weight gradients from zero.
  void gradients(const std::vector<float>& x, const std::vector<float>& r) {
    for (auto& v : g) std::fill(v.begin(), v.end(), 0.f);
    for (auto& v : dw) std::fill(v.begin(), v.end(), 0.f);
    mixer->forward(call(), x.data(), y.data());
    std::fill(dx.begin(), dx.end(), 123.f);  // backward must overwrite it
    mixer->backward(call(), x.data(), r.data(), dx.data());
  }
  int param_index(const std::string& name) const {
    for (size_t i = 0; i < pinfo.size(); ++i)
      if (pinfo[i].name == name) return int(i);
    return -1;
  }
};

std::vector<float> normal(size_t n, float sd, uint32_t seed) {
  std::mt19937 r(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(r);
  return v;
}

void fill_uniform(float* v, size_t n, float lo, float hi, std::mt19937& r) {
  std::uniform_real_distribution<float> u(lo, hi);
  for (size_t i = 0; i < n; ++i) v[i] = u(r);
}

// Overwrites v's elements in place (Linears hold pointers to the buffers).
void set(std::vector<float>& v, const std::vector<float>& src) {
  ASSERT_EQ(v.size(), src.size());
  std::copy(src.begin(), src.end(), v.begin());
}

// The indices to check of a tensor of n elements: all of them when n ≤ max_checks, else a
// fixed random subset of max_checks distinct ones.
std::vector<int64_t> check_indices(int64_t n, int max_checks, uint32_t seed) {
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (n <= max_checks) return idx;
  std::mt19937 r(seed);
  std::shuffle(idx.begin(), idx.end(), r);
  idx.resize(max_checks);
  std::sort(idx.begin(), idx.end());
  return idx;
}

struct FdStats {
  double worst = 0.0;  // max over checked elements of |fd − g| / tolerance
  double max_abs_g = 0.0;
  int checked = 0;
};

// Finite differences of `loss` w.r.t. v[i] for the chosen elements, against the analytic
// gradient g[i]; tolerance rel·|g| + abs. Richardson-extrapolated central differences:
// D(h) = (L(v + h) − L(v − h)) / (step actually taken), fd = (4·D(h) − D(2h)) / 3, whose
// truncation error is O(h⁴) instead of O(h²). That lets h be large enough that the FP32
// noise of the forward (L ≈ 30 summed from FP32 outputs, noise of a few 1e-6 whose bits
// depend on the GEMM kernels' summation order) divided by h stays far below `abs`: with a
// plain central difference at h = 2e-3 it did not (q_proj element 227 of the attention
// test failed on oneDNN's AVX-512 sgemm with a correct gradient).
FdStats fd_check(const std::string& name, float* v, const float* g, int64_t n,
                 const std::function<double()>& loss, float h, double rel, double abs,
                 int max_checks, uint32_t seed) {
  FdStats st;
  for (int64_t i : check_indices(n, max_checks, seed)) {
    const float s = v[i];
    auto central = [&](float step) {
      v[i] = s + step;
      const double lp = loss();
      v[i] = s - step;
      const double lm = loss();
      v[i] = s;
      return (lp - lm) / (double(s + step) - double(s - step));  // the step s ± h in float
    };
    const double fd = (4.0 * central(h) - central(2.0f * h)) / 3.0;
    const double tol = rel * std::fabs(g[i]) + abs;
    EXPECT_NEAR(fd, g[i], tol) << name << " element " << i;
    st.worst = std::max(st.worst, std::fabs(fd - g[i]) / tol);
    st.max_abs_g = std::max(st.max_abs_g, double(std::fabs(g[i])));
    ++st.checked;
  }
  return st;
}

// The FD tests run at one OpenMP thread: thousands of tiny forwards, where a team of two on a
// loaded 2-core machine spends ~100× the time in barriers. The results do not depend on the
// thread count (HybridThreads below, tests/nn/test_ssm.cpp).
// ------------------------------------------------------------------ Mamba-2 mixer
struct MambaShape {
  int d, H, P, G, N, W, Q, B, T;
};

ModelConfig mamba_config(const MambaShape& s) {
  ModelConfig c;
  c.d_model = s.d;
  c.mamba_num_heads = s.H;
  c.mamba_head_dim = s.P;
  c.mamba_n_groups = s.G;
  c.mamba_state_size = s.N;
  c.mamba_conv_kernel = s.W;
  c.mamba_chunk_size = s.Q;
  return c;
}

class Mamba2MixerGrad : public ::testing::TestWithParam<MambaShape> {};

// Every parameter (conv1d, conv1d_bias, dt_bias, A_log, D, norm), both linear weights
// (in_proj, out_proj) and the input x, every element. Parameters are drawn away from the
// initialisation so that every path carries signal: Δ = softplus(dt + dt_bias) ~ 0.3 .. 1.5
// (the init's Δ ≤ 0.1 would make the dt_bias / A_log gradients tiny), A = −exp(A_log) with
// A_log = log(h + 1) ± 0.3, D and the norm weight ~ U(0.5, 1.5), conv U(−0.5, 0.5), weights
// N(0, 0.3) (so in_proj's outputs are O(1) for x ~ N(0, 1)).
//
// Step and tolerance: FP32 forward, L accumulated in double. y is O(1) and carries a few ulp
// of FP32 rounding (≈ 1e-7 relative) that change between the two evaluations in no smooth
// way; over ≈ 200 outputs with r ~ N(0, 1) that is ≈ sqrt(200)·1e-7 ≈ 1.5e-6 of noise in L,
// ≈ 4e-4 in the FD quotient at h = 2e-3. The truncation error h²/6·L''' is ≈ 1e-6 for
// O(1) third derivatives. Tolerance 1e-2·|g| + 1.5e-3 is ~4× the noise and small next to the
// gradients (max |g| per tensor is O(0.1 .. 10); a wrong factor, sign or missing term fails).
TEST_P(Mamba2MixerGrad, EveryParameterAndInputMatchFiniteDifferences) {
  const TeamSize team(1);  // FD at one thread (see above)
  const MambaShape s = GetParam();
  ASSERT_LT(s.Q, s.T);
  ASSERT_NE(s.T % s.Q, 0);
  MixerRig rig('M', mamba_config(s), s.B, s.T);
  std::mt19937 r(11 + s.G);
  auto& P = rig.p;
  const int iconv = rig.param_index("conv1d"), icb = rig.param_index("conv1d_bias"),
            idtb = rig.param_index("dt_bias"), ialog = rig.param_index("A_log"),
            iD = rig.param_index("D"), inorm = rig.param_index("norm");
  ASSERT_GE(std::min({iconv, icb, idtb, ialog, iD, inorm}), 0);
  fill_uniform(P[iconv].data(), P[iconv].size(), -0.5f, 0.5f, r);
  fill_uniform(P[icb].data(), P[icb].size(), -0.5f, 0.5f, r);
  fill_uniform(P[idtb].data(), P[idtb].size(), -0.5f, 1.0f, r);
  for (int h = 0; h < s.H; ++h) {
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    P[ialog][h] = std::log(float(h + 1)) + u(r);
  }
  fill_uniform(P[iD].data(), P[iD].size(), 0.5f, 1.5f, r);
  fill_uniform(P[inorm].data(), P[inorm].size(), 0.5f, 1.5f, r);
  for (size_t i = 0; i < rig.w.size(); ++i) set(rig.w[i], normal(rig.w[i].size(), 0.3f, 20 + i));
  std::vector<float> x = normal(rig.y.size(), 1.f, 5);
  const std::vector<float> rw = normal(rig.y.size(), 1.f, 6);
  rig.gradients(x, rw);
  const std::vector<std::vector<float>> g = rig.g, dw = rig.dw;
  const std::vector<float> dx = rig.dx;
  auto loss = [&] { return rig.loss(x, rw); };
  const float h = 1e-2f;
  const double rel = 1e-2, abs = 1.5e-3;
  const int all = 1 << 30;  // every element
  std::string summary;
  auto note = [&](const std::string& n, const FdStats& st) {
    summary += n + ": " + std::to_string(st.checked) + " el, max|g| " +
               std::to_string(st.max_abs_g) + ", worst err/tol " + std::to_string(st.worst) + "\n";
    // Signal: each tensor's gradient must be well above the tolerance somewhere.
    EXPECT_GT(st.max_abs_g, 10 * abs) << n << " has no gradient signal to check";
  };
  for (size_t i = 0; i < P.size(); ++i)
    note(rig.pinfo[i].name, fd_check(rig.pinfo[i].name, P[i].data(), g[i].data(),
                                     int64_t(P[i].size()), loss, h, rel, abs, all, 1));
  for (size_t i = 0; i < rig.w.size(); ++i)
    note(rig.linfo[i].kind, fd_check(rig.linfo[i].kind, rig.w[i].data(), dw[i].data(),
                                     int64_t(rig.w[i].size()), loss, h, rel, abs, all, 2));
  note("x", fd_check("x", x.data(), dx.data(), int64_t(x.size()), loss, h, rel, abs, all, 3));
  std::printf("%s", summary.c_str());
}

// chunk Q < T, T not a multiple of Q; G = 1 and 2; d 8 .. 16, H 2 .. 4.
INSTANTIATE_TEST_SUITE_P(Shapes, Mamba2MixerGrad,
                         ::testing::Values(MambaShape{12, 2, 4, 1, 4, 4, 3, 2, 7},
                                           MambaShape{16, 4, 4, 2, 4, 4, 4, 2, 10},
                                           MambaShape{8, 4, 4, 2, 4, 4, 2, 2, 5}),
                         [](const auto& info) {
                           const MambaShape& s = info.param;
                           return "d" + std::to_string(s.d) + "_H" + std::to_string(s.H) + "_G" +
                                  std::to_string(s.G) + "_Q" + std::to_string(s.Q) + "_T" +
                                  std::to_string(s.T);
                         });

// Shapes of the parameters and linears against the Mamba-2 definitions (mamba_ssm Mamba2:
// d_in_proj = 2·d_inner + 2·ngroups·d_state + nheads; conv_dim = d_inner + 2·ngroups·d_state,
// conv1d weight [conv_dim, 1, d_conv]; dt_bias, A_log, D [nheads]; RMSNormGated weight
// [d_inner]; out_proj d_inner → d_model), and the Model's names and storage order.
TEST(Mamba2Mixer, ParamsAndLinearsHaveTheMamba2Shapes) {
  const MambaShape s{16, 4, 4, 2, 4, 4, 3, 1, 8};
  const ModelConfig c = mamba_config(s);
  const auto m = nn::make_mixer('M', c);
  EXPECT_EQ(m->symbol(), 'M');
  const int64_t d_inner = s.H * s.P, conv_dim = d_inner + 2 * s.G * s.N,
                d_in_proj = 2 * d_inner + 2 * s.G * s.N + s.H;
  EXPECT_EQ(d_inner, c.mamba_d_inner());
  struct Want {
    const char* name;
    int64_t rows, cols;
    bool decay;
    nn::ParamInit init;
  };
  const std::vector<Want> want = {{"conv1d", conv_dim, s.W, true, nn::ParamInit::kCustom},
                                  {"conv1d_bias", 1, conv_dim, false, nn::ParamInit::kCustom},
                                  {"dt_bias", 1, s.H, false, nn::ParamInit::kCustom},
                                  {"A_log", 1, s.H, false, nn::ParamInit::kCustom},
                                  {"D", 1, s.H, false, nn::ParamInit::kOnes},
                                  {"norm", 1, d_inner, false, nn::ParamInit::kOnes}};
  const auto ps = m->params();
  ASSERT_EQ(ps.size(), want.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(ps[i].name, want[i].name);
    EXPECT_EQ(ps[i].rows, want[i].rows) << want[i].name;
    EXPECT_EQ(ps[i].cols, want[i].cols) << want[i].name;
    EXPECT_EQ(ps[i].weight_decay, want[i].decay) << want[i].name;
    EXPECT_EQ(ps[i].init, want[i].init) << want[i].name;
  }
  const auto ls = m->linears();
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0].kind, "in_proj");
  EXPECT_EQ(ls[0].in, s.d);
  EXPECT_EQ(ls[0].out, d_in_proj);
  EXPECT_FALSE(ls[0].output_projection);
  EXPECT_EQ(ls[1].kind, "out_proj");
  EXPECT_EQ(ls[1].in, d_inner);
  EXPECT_EQ(ls[1].out, s.d);
  EXPECT_TRUE(ls[1].output_projection);
  // Block parameter count: norm + the above + the two weights.
  EXPECT_EQ(nn::block_param_count('M', c),
            s.d + conv_dim * s.W + conv_dim + 3 * s.H + d_inner + d_in_proj * s.d + s.d * d_inner);

  // In a model: layers.N.norm, then layers.N.mixer.<param>, then the weights [out, in].
  ModelConfig mc = c;
  mc.vocab_size = 16;
  mc.pattern = "M";
  nn::Model model(mc, Recipe{}, 1, 8);
  const auto& infos = model.param_infos();
  std::vector<std::string> names;
  for (const auto& i : infos) names.push_back(i.name);
  const std::vector<std::string> want_names = {
      "embeddings",        "layers.0.norm",         "layers.0.mixer.conv1d",
      "layers.0.mixer.conv1d_bias", "layers.0.mixer.dt_bias", "layers.0.mixer.A_log",
      "layers.0.mixer.D",  "layers.0.mixer.norm",   "layers.0.mixer.in_proj",
      "layers.0.mixer.out_proj",    "norm_f",       "lm_head"};
  EXPECT_EQ(names, want_names);
  EXPECT_EQ(infos[8].rows, d_in_proj);
  EXPECT_EQ(infos[8].cols, s.d);
  EXPECT_EQ(infos[9].rows, s.d);
  EXPECT_EQ(infos[9].cols, d_inner);
  EXPECT_EQ(model.linear_name(0), "layers.0.mixer.in_proj");
  EXPECT_EQ(model.linear_name(1), "layers.0.mixer.out_proj");
}

// Initialisation: A_log = log(1 .. H) (HF NemotronH A = arange(1, H + 1)); conv weights and
// bias U(±1/sqrt(W)) (PyTorch Conv1d default with fan_in = W); dt_bias = softplus⁻¹(dt) with
// dt ∈ [dt_min, dt_max] log-uniform, or dt_init_floor when that is larger (mamba_ssm).
TEST(Mamba2Mixer, InitialisationFollowsMambaSsm) {
  for (const float floor : {1e-4f, 0.02f}) {
    MambaShape s{16, 64, 4, 2, 8, 4, 8, 1, 8};  // 64 heads: many dt draws
    ModelConfig c = mamba_config(s);
    c.mamba_dt_min = 1e-3f;
    c.mamba_dt_max = 0.1f;
    c.mamba_dt_init_floor = floor;
    const auto m = nn::make_mixer('M', c);
    const auto ps = m->params();
    std::mt19937_64 rng(9);
    std::vector<std::vector<float>> v(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      v[i].assign(ps[i].rows * ps[i].cols, -777.f);
      if (ps[i].init == nn::ParamInit::kCustom) m->init_param(i, v[i].data(), rng);
    }
    // A_log[h] = log(h + 1), within 1 ulp of the float of the exact value.
    for (int h = 0; h < s.H; ++h)
      EXPECT_NEAR(v[3][h], std::log(double(h + 1)), 2e-7 * std::max(1.0, std::log(h + 1.0)))
          << "A_log[" << h << "]";
    // conv1d and conv1d_bias within ±1/sqrt(W), and spread over that range (not a constant).
    const double bound = 1.0 / std::sqrt(double(s.W));
    for (int k : {0, 1}) {
      double lo = 1e9, hi = -1e9;
      for (float x : v[k]) {
        EXPECT_LE(std::fabs(x), bound * (1 + 1e-6)) << ps[k].name;
        lo = std::min(lo, double(x));
        hi = std::max(hi, double(x));
      }
      EXPECT_LT(lo, -0.7 * bound) << ps[k].name;
      EXPECT_GT(hi, 0.7 * bound) << ps[k].name;
    }
    // softplus(dt_bias) (in double) ∈ [max(dt_min, floor), dt_max]; with the floor above
    // dt_min some heads sit exactly on it.
    int at_floor = 0;
    for (int h = 0; h < s.H; ++h) {
      const double dt = std::log1p(std::exp(double(v[2][h])));
      EXPECT_GE(dt, std::max<double>(c.mamba_dt_min, floor) * (1 - 1e-5)) << h;
      EXPECT_LE(dt, c.mamba_dt_max * (1 + 1e-5)) << h;
      if (std::fabs(dt - floor) < 1e-5 * floor) ++at_floor;
    }
    if (floor > c.mamba_dt_min) {
      // P(dt < 0.02) = log(20)/log(100) ≈ 0.65 of 64 heads.
      EXPECT_GT(at_floor, 20);
    } else {
      EXPECT_EQ(at_floor, 0);
    }
  }
  // Through Model::init: A_log = log(1..H), D = 1, norm = 1.
  ModelConfig mc = mamba_config({8, 3, 4, 1, 4, 4, 4, 1, 8});
  mc.vocab_size = 16;
  mc.pattern = "M-";
  mc.mlp_hidden = 8;
  nn::Model model(mc, Recipe{}, 1, 8);
  model.init(1);
  for (const auto& i : model.param_infos()) {
    const float* p = model.params().data() + i.offset;
    if (i.name == "layers.0.mixer.A_log") {
      for (int h = 0; h < 3; ++h) EXPECT_NEAR(p[h], std::log(double(h + 1)), 2e-7);
    }
    if (i.name == "layers.0.mixer.D" || i.name == "layers.0.mixer.norm") {
      for (int64_t k = 0; k < i.size; ++k) EXPECT_EQ(p[k], 1.f) << i.name;
    }
  }
}

// ------------------------------------------------------------------ GQA attention mixer
class AttentionMixerGrad : public ::testing::TestWithParam<bool> {};

// x and every weight (q/k/v/o_proj), every element; 4 query heads on 2 KV heads, head dim 4.
// Step and tolerance as the Mamba-2 test (same noise argument: FP32 forward of O(1) outputs,
// L in double).
TEST_P(AttentionMixerGrad, XAndEveryWeightMatchFiniteDifferences) {
  const TeamSize team(1);  // FD at one thread (see above)
  ModelConfig c;
  c.d_model = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.rope = GetParam();
  const int B = 2, T = 5;
  MixerRig rig('*', c, B, T);
  ASSERT_EQ(rig.linfo.size(), 4u);
  const char* kinds[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  const int64_t hd = 4, q = 4 * hd, kv = 2 * hd;
  const int64_t ins[4] = {16, 16, 16, q}, outs[4] = {q, kv, kv, 16};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(rig.linfo[i].kind, kinds[i]);
    EXPECT_EQ(rig.linfo[i].in, ins[i]);
    EXPECT_EQ(rig.linfo[i].out, outs[i]);
  }
  EXPECT_TRUE(rig.pinfo.empty());
  for (size_t i = 0; i < rig.w.size(); ++i) set(rig.w[i], normal(rig.w[i].size(), 0.4f, 30 + i));
  std::vector<float> x = normal(rig.y.size(), 1.f, 7);
  const std::vector<float> rw = normal(rig.y.size(), 1.f, 8);
  rig.gradients(x, rw);
  const std::vector<std::vector<float>> dw = rig.dw;
  const std::vector<float> dx = rig.dx;
  auto loss = [&] { return rig.loss(x, rw); };
  const float h = 1e-2f;
  const double rel = 1e-2, abs = 1.5e-3;
  for (size_t i = 0; i < rig.w.size(); ++i) {
    const FdStats st = fd_check(kinds[i], rig.w[i].data(), dw[i].data(),
                                int64_t(rig.w[i].size()), loss, h, rel, abs, 1 << 30, 2);
    std::printf("%-7s %d el, max|g| %.3g, worst err/tol %.3f\n", kinds[i], st.checked,
                st.max_abs_g, st.worst);
    EXPECT_GT(st.max_abs_g, 10 * abs) << kinds[i];
  }
  const FdStats st = fd_check("x", x.data(), dx.data(), int64_t(x.size()), loss, h, rel, abs,
                              1 << 30, 3);
  std::printf("x       %d el, max|g| %.3g, worst err/tol %.3f\n", st.checked, st.max_abs_g,
              st.worst);
  EXPECT_GT(st.max_abs_g, 10 * abs);
}

// RoPE changes the result (so the rope = true run tests the RoPE backward).
TEST(AttentionMixer, RopeChangesTheOutput) {
  const TeamSize team(1);
  ModelConfig c;
  c.d_model = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  std::vector<float> y[2];
  for (int k = 0; k < 2; ++k) {
    c.rope = k == 1;
    MixerRig rig('*', c, 1, 6);
    for (size_t i = 0; i < rig.w.size(); ++i) set(rig.w[i], normal(rig.w[i].size(), 0.4f, 30 + i));
    const std::vector<float> x = normal(rig.y.size(), 1.f, 7);
    rig.loss(x, x);
    y[k] = rig.y;
  }
  // Token 0 has rotation angle 0: equal there; later tokens differ.
  EXPECT_EQ(0, std::memcmp(y[0].data(), y[1].data(), 16 * sizeof(float)));
  EXPECT_NE(0, std::memcmp(y[0].data() + 16, y[1].data() + 16, 5 * 16 * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Rope, AttentionMixerGrad, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "rope" : "no_rope"; });

// ------------------------------------------------------------------ whole hybrid model
ModelConfig hybrid_model(const std::string& pattern) {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 16;
  m.pattern = pattern;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.rope = false;
  m.mlp_hidden = 24;
  m.init_std = 0.3f;  // gradients well above the FD noise
  m.mamba_num_heads = 4;
  m.mamba_head_dim = 4;
  m.mamba_n_groups = 2;
  m.mamba_state_size = 4;
  m.mamba_conv_kernel = 4;
  m.mamba_chunk_size = 5;
  return m;
}

std::vector<int32_t> tokens32(size_t n, int V, uint32_t seed) {
  std::vector<int32_t> t(n);
  std::mt19937 g(seed);
  for (auto& x : t) x = static_cast<int32_t>(g() % uint32_t(V));
  return t;
}

// Pattern "M*-M-" (Mamba-2, GQA attention without RoPE, MLP), vocab 64, T = 12 (chunk 5: chunks
// of 5, 5, 2), B = 2, fp32 recipe: FD of the mean cross-entropy w.r.t. 8 random elements of
// every parameter tensor against Model::backward. The Mamba-2 parameters are redrawn after
// init (Δ ~ 0.3 .. 1.5 instead of ≤ 0.1) so that dt_bias and A_log carry signal.
// Step 3e-3 and tolerance 2e-2·|g| + 1e-4 (as tests/nn/test_model.cpp): the loss is a double
// mean of FP32 logits' cross-entropies, noise ≈ 1e-7 relative of a loss ≈ 4, ≈ 7e-5 in the
// FD quotient at h = 1e-3 (measured), ≈ 2.5e-5 at 3e-3; h = 1e-2 is too coarse for the
// Mamba-2 D (truncation error h²/6·L''' measured ≈ 4e-4 on a gradient of 9e-3).
TEST(HybridModel, EveryParameterTensorMatchesFiniteDifferences) {
  const TeamSize team(1);  // FD at one thread (see above)
  const ModelConfig mc = hybrid_model("M*-M-");
  const int B = 2, T = 12;
  nn::Model model(mc, Recipe{}, B, T);
  model.init(3);
  auto& p = model.params();
  std::mt19937 r(4);
  for (const auto& i : model.param_infos()) {
    float* v = p.data() + i.offset;
    const std::string n = i.name.substr(i.name.rfind('.') + 1);
    if (n == "dt_bias") fill_uniform(v, i.size, -0.5f, 1.0f, r);
    if (n == "D" || (n == "norm" && i.name.find("mixer") != std::string::npos))
      fill_uniform(v, i.size, 0.5f, 1.5f, r);
    if (n == "A_log")
      for (int64_t h = 0; h < i.size; ++h) v[h] += std::uniform_real_distribution<float>(-.3f, .3f)(r);
  }
  const std::vector<int32_t> in = tokens32(B * T, mc.vocab_size, 1),
                             tg = tokens32(B * T, mc.vocab_size, 2);
  nn::StepContext ctx;
  model.zero_grad();
  model.forward(in.data(), tg.data(), B, ctx);
  model.backward(ctx);
  const std::vector<float> g = model.grads();
  auto loss = [&] { return model.forward(in.data(), tg.data(), B, ctx); };
  int tensors = 0;
  for (const auto& info : model.param_infos()) {
    const FdStats st = fd_check(info.name, p.data() + info.offset, g.data() + info.offset,
                                info.size, loss, 3e-3f, 2e-2, 1e-4, 8, 100 + tensors);
    ++tensors;
    std::printf("%-28s max|g| %.3g, worst err/tol %.3f\n", info.name.c_str(), st.max_abs_g,
                st.worst);
    EXPECT_EQ(st.checked, std::min<int64_t>(8, info.size));
  }
  EXPECT_EQ(tensors, 1 + (1 + 6 + 2) * 2 + (1 + 4) + (1 + 2) * 2 + 2);
}

// Max over elements of |a − b| / (1 + |b|), for n floats.
double max_rel_diff(const float* a, const float* b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])) / (1.0 + std::fabs(double(b[i]))));
  return m;
}

// Causality and sequence independence of the hybrid model (the Mamba-2 conv and scan must not
// read across sequence starts nor from later tokens). Bit for bit where the GEMM shapes are
// the same: changing the token at (b = 1, t = 7) leaves every logit of sequence 0 and of tokens
// 0..6 of sequence 1 bit-identical and changes token 7's; changing every token of sequence 0
// leaves sequence 1's logits bit-identical.
// Where the shapes differ (sequence 1 alone, B = 1; a forward with T = 9 < seq_len = 12) the
// logits agree to FP32 rounding only: fp4::sgemm's bits depend on the thread count never, but
// a row's bits may depend on M, the number of rows computed with it (oneDNN picks kernels and
// blocking by shape; see fp4/gemm/gemm.h). A leak across sequences or from later tokens would be
// O(1); the bound 1e-5 is ~100 ulp of the O(1) logits. (This test asserted bit-identity
// there at first: it failed on oneDNN's AVX-512 sgemm and passed on AVX2 by luck of
// the shapes.) The scan's own prefix property is bit-exact: SsmScan.PrefixOfLongerT.
TEST(HybridModel, CausalPerSequenceAndShorterT) {
  const TeamSize team(1);
  const ModelConfig mc = hybrid_model("M*-M-");
  const int B = 2, T = 12, V = mc.vocab_size;
  nn::Model model(mc, Recipe{}, B, T);
  model.init(3);
  std::vector<int32_t> in = tokens32(B * T, V, 1);
  nn::StepContext ctx;
  ctx.training = false;
  model.forward(in.data(), nullptr, B, ctx);
  const std::vector<float> ref(model.logits(), model.logits() + int64_t(B) * T * V);
  in[T + 7] = (in[T + 7] + 1) % V;
  model.forward(in.data(), nullptr, B, ctx);
  const float* l = model.logits();
  EXPECT_EQ(0, std::memcmp(l, ref.data(), sizeof(float) * (T + 7) * V));
  EXPECT_NE(0, std::memcmp(l + (T + 7) * V, ref.data() + (T + 7) * V, sizeof(float) * V));
  const std::vector<float> changed(l, l + int64_t(B) * T * V);
  {  // every token of sequence 0 changed: sequence 1 bit-identical, sequence 0 changed
    std::vector<int32_t> other = in;
    for (int t = 0; t < T; ++t) other[t] = (other[t] + 1 + t) % V;
    model.forward(other.data(), nullptr, B, ctx);
    EXPECT_EQ(0, std::memcmp(model.logits() + T * V, changed.data() + T * V,
                             sizeof(float) * T * V));
    EXPECT_NE(0, std::memcmp(model.logits(), changed.data(), sizeof(float) * T * V));
  }
  model.forward(in.data() + T, nullptr, 1, ctx);  // sequence 1 alone
  const double d1 = max_rel_diff(model.logits(), changed.data() + T * V, int64_t(T) * V);
  std::printf("B = 1 against the second of B = 2: max rel diff %.3g\n", d1);
  EXPECT_LE(d1, 1e-5);
  // T = 9 on rows of 9 tokens: sequences in[0..9), in[12..21).
  const int Ts = 9;
  std::vector<int32_t> shorter;
  for (int b = 0; b < B; ++b) shorter.insert(shorter.end(), in.begin() + b * T, in.begin() + b * T + Ts);
  model.forward(shorter.data(), nullptr, B, ctx, Ts);
  for (int b = 0; b < B; ++b) {
    const double d = max_rel_diff(model.logits() + int64_t(b) * Ts * V,
                                  changed.data() + int64_t(b) * T * V, int64_t(Ts) * V);
    std::printf("T = 9 against the first 9 tokens of T = 12, sequence %d: max rel diff %.3g\n",
                b, d);
    EXPECT_LE(d, 1e-5) << "sequence " << b;
  }
}

// ------------------------------------------------------------------ thread-count independence
struct StepOut {
  double loss = 0;
  std::vector<float> grads;
};

StepOut run_step(const ModelConfig& mc, const Recipe& recipe, int B, int T, int threads) {
  const TeamSize team(threads);
  nn::Model model(mc, recipe, B, T);
  model.init(5);
  const std::vector<int32_t> in = tokens32(B * T, mc.vocab_size, 3),
                             tg = tokens32(B * T, mc.vocab_size, 4);
  nn::StepContext ctx;
  ctx.step = 1;
  ctx.seed = 8;
  model.zero_grad();
  StepOut o;
  o.loss = model.forward(in.data(), tg.data(), B, ctx);
  model.backward(ctx);
  // A second step (held references, per-thread buffers in use) on the same weights.
  ctx.step = 2;
  o.loss += 1e3 * model.forward(tg.data(), in.data(), B, ctx);
  model.backward(ctx);
  o.grads = model.grads();
  return o;
}

class HybridThreads : public ::testing::TestWithParam<const char*> {};

// Forward + backward of a hybrid model at 1, 2 and 3 OpenMP threads: bit-identical loss and
// gradients. 32 tokens per step (a multiple of 16 for nvfp4-te's RHT); d_model 32, Mamba-2
// with 4 heads of 8, G = 2, chunk 5 over T = 16.
TEST_P(HybridThreads, LossAndGradsBitIdenticalAt1To3Threads) {
  const std::string name = GetParam();
  const Recipe recipe = name == "fp32" ? Recipe{} : fp4::testing::shipped_recipe(name);
  ModelConfig mc = hybrid_model("M*-M-");
  mc.d_model = 32;
  mc.mlp_hidden = 64;
  mc.mamba_head_dim = 8;
  mc.mamba_state_size = 8;
  mc.init_std = 0.02f;
  const int B = 2, T = 16;
  const StepOut ref = run_step(mc, recipe, B, T, 1);
  ASSERT_TRUE(std::isfinite(ref.loss));
  for (int t : {2, 3}) {
    const StepOut o = run_step(mc, recipe, B, T, t);
    EXPECT_EQ(0, std::memcmp(&o.loss, &ref.loss, sizeof(double))) << t << " threads: " << o.loss
                                                                  << " vs " << ref.loss;
    ASSERT_EQ(o.grads.size(), ref.grads.size());
    EXPECT_EQ(0, std::memcmp(o.grads.data(), ref.grads.data(), o.grads.size() * sizeof(float)))
        << t << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, HybridThreads,
                         ::testing::Values("fp32", "ue5m3-b16", "nvfp4-te", "ue5m3-b16@decoded"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-' || c == '@') c = '_';
                           return s;
                         });

// ------------------------------------------------------------------ Llama pattern
// pattern = "*-*-" is the Llama model of n_layers = 2, bit for bit (loss and gradients), with
// the same parameter names and layout; for the FP32 and an FP4 recipe.
TEST(HybridModel, ExplicitLlamaPatternEqualsTwoLayers) {
  for (const char* name : {"fp32", "ue5m3-b16"}) {
    const Recipe recipe = std::string(name) == "fp32" ? Recipe{} : fp4::testing::shipped_recipe(name);
    ModelConfig a = hybrid_model("*-*-");
    a.d_model = 32;
    a.mlp_hidden = 64;
    a.rope = true;
    a.init_std = 0.02f;
    ModelConfig b = a;
    b.pattern.clear();
    b.n_layers = 2;
    ASSERT_EQ(b.block_pattern(), "*-*-");
    const StepOut x = run_step(a, recipe, 2, 16, 1), y = run_step(b, recipe, 2, 16, 1);
    EXPECT_EQ(0, std::memcmp(&x.loss, &y.loss, sizeof(double))) << name;
    ASSERT_EQ(x.grads.size(), y.grads.size());
    EXPECT_EQ(0, std::memcmp(x.grads.data(), y.grads.data(), x.grads.size() * sizeof(float)))
        << name;
    nn::Model ma(a, recipe, 1, 16), mb(b, recipe, 1, 16);
    ASSERT_EQ(ma.param_infos().size(), mb.param_infos().size());
    for (size_t i = 0; i < ma.param_infos().size(); ++i) {
      EXPECT_EQ(ma.param_infos()[i].name, mb.param_infos()[i].name);
      EXPECT_EQ(ma.param_infos()[i].offset, mb.param_infos()[i].offset);
    }
  }
}

// ------------------------------------------------------------------ config errors
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("fp4_hybrid_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
};

std::string error_of(const fs::path& f) {
  try {
    load_run_config(f);
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a UserError) ") + e.what();
  }
  return "(no error)";
}

// A [model] table from key lines.
std::string model_toml(const std::vector<std::string>& lines) {
  std::string s = "[model]\nvocab_size = 256\nd_model = 32\nn_heads = 4\nmlp_hidden = 64\n";
  for (const auto& l : lines) s += l + "\n";
  return s + "[train]\nsteps = 10\nwarmup_steps = 2\n";
}

TEST(HybridConfig, ErrorsNameTheKey) {
  TempDir tmp;
  // The valid base: loads, with the pattern and the Mamba-2 keys.
  const std::vector<std::string> base = {"pattern = \"M*-\"", "n_kv_heads = 2",
                                         "mamba_num_heads = 4", "mamba_head_dim = 8",
                                         "mamba_n_groups = 2"};
  const RunConfig ok = load_run_config(tmp.write("ok.toml", model_toml(base)));
  EXPECT_EQ(ok.model.block_pattern(), "M*-");
  EXPECT_EQ(ok.model.n_kv_heads, 2);
  EXPECT_EQ(ok.model.mamba_num_heads, 4);
  // The resolved TOML reloads to the same config.
  EXPECT_EQ(run_config_to_toml(run_config_from_text(run_config_to_toml(ok), "x")),
            run_config_to_toml(ok));

  struct Case {
    std::vector<std::string> lines;
    std::string key;
  };
  const std::vector<Case> cases = {
      {{"pattern = \"M*x\"", "mamba_num_heads = 4"}, "model.pattern"},
      {{"pattern = \"\""}, "model.pattern"},
      {{"pattern = \"M*-\"", "n_layers = 2", "mamba_num_heads = 4"}, "model.n_layers"},
      {{"pattern = \"M*-\""}, "model.mamba_num_heads"},
      {{"pattern = \"M-\"", "mamba_num_heads = 3", "mamba_n_groups = 2"}, "model.mamba_n_groups"},
      {{"pattern = \"*-\"", "n_kv_heads = 3"}, "model.n_kv_heads"},
      {{"n_layers = 2", "n_kv_heads = 3"}, "model.n_kv_heads"},  // Llama-style GQA too
  };
  int k = 0;
  for (const Case& c : cases) {
    const fs::path f = tmp.write("bad" + std::to_string(k++) + ".toml", model_toml(c.lines));
    const std::string e = error_of(f);
    EXPECT_NE(e.find(c.key), std::string::npos) << c.lines[0] << ": " << e;
    EXPECT_EQ(e.find("(no error)"), std::string::npos) << c.lines[0];
    EXPECT_EQ(e.find("(not a UserError)"), std::string::npos) << e;
  }
  // A pattern without 'M' needs no Mamba-2 keys; one without '*' no valid attention heads.
  EXPECT_NO_THROW(load_run_config(tmp.write("m.toml", model_toml({"pattern = \"*-\""}))));
  EXPECT_NO_THROW(load_run_config(
      tmp.write("n.toml", model_toml({"pattern = \"M-\"", "n_kv_heads = 3", "mamba_num_heads = 2"}))));
}

}  // namespace
