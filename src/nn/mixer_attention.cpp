// '*' blocks: grouped-query causal self-attention (Nemotron-H NemotronHAttention; Llama with
// RoPE). q_proj: d → H·hd, k_proj, v_proj: d → Hkv·hd, o_proj: H·hd → d, no biases; RoPE on
// q and k when model.rope (Llama), none for Nemotron-H (HF NemotronHAttention applies no
// positional embedding). Attention itself: fp4/nn/layers.h attention_forward/backward.
#include <algorithm>
#include <cstring>
#include <string>

#include "fp4/base/error.h"
#include "fp4/nn/layers.h"
#include "fp4/nn/mixer.h"
#include "fp4/base/profile.h"
#include "mixers.h"

namespace fp4::nn {
using prof::Cat;
using prof::Scope;

namespace {
// A LinearWorkspace shared-input scope for the lifetime of the object (closed on exceptions).
struct SharedInput {
  LinearWorkspace& ws;
  SharedInput(LinearWorkspace& w, const float* X) : ws(w) { ws.begin_shared_input(X); }
  ~SharedInput() { ws.end_shared_input(); }
  SharedInput(const SharedInput&) = delete;
  SharedInput& operator=(const SharedInput&) = delete;
};

class AttentionMixer final : public Mixer {
 public:
  explicit AttentionMixer(const ModelConfig& c)
      : d_(c.d_model), H_(c.n_heads), Hkv_(c.kv_heads()), hd_(c.attn_head_dim()),
        rope_(c.rope), theta_(c.rope_theta) {}
  char symbol() const override { return '*'; }
  std::vector<MixerLinear> linears() const override {
    const int64_t q = H_ * hd_, kv = Hkv_ * hd_;
    return {{"q_proj", d_, q, false}, {"k_proj", d_, kv, false}, {"v_proj", d_, kv, false},
            {"o_proj", q, d_, true}};
  }
  // Kept: q, k, v (after RoPE), y [BT, ·], att [B, H, T, T].
  int64_t activation_floats(int64_t batch, int64_t T) const override {
    const int64_t BT = batch * T;
    return BT * (2 * H_ * hd_ + 2 * Hkv_ * hd_) + batch * H_ * T * T;
  }
  // dq, dy [BT, H·hd]; dk, dv [BT, Hkv·hd]; the attention backward's [B, H, T, T].
  int64_t scratch_floats(int64_t batch, int64_t T) const override {
    const int64_t BT = batch * T;
    return BT * (2 * H_ * hd_ + 2 * Hkv_ * hd_) + attention_scratch_floats(batch, T, H_);
  }
  struct Acts {
    float *q, *k, *v, *y, *att;
  };
  Acts acts(float* p, int64_t B, int64_t T) const {
    const int64_t BT = B * T;
    Acts a;
    a.q = p;
    a.k = a.q + BT * H_ * hd_;
    a.v = a.k + BT * Hkv_ * hd_;
    a.y = a.v + BT * Hkv_ * hd_;
    a.att = a.y + BT * H_ * hd_;
    return a;
  }
  void forward(const MixerCall& c, const float* x, float* out) override {
    const int64_t B = c.B, T = c.T, BT = B * T;
    const Acts A = acts(c.acts, B, T);
    Linear* lin = c.linears;
    {  // q, k, v read the same unchanged x: it may be quantized (and its amax taken) once
      SharedInput shared(*c.workspace, x);
      lin[0].forward(x, A.q, BT, *c.ctx);
      lin[1].forward(x, A.k, BT, *c.ctx);
      lin[2].forward(x, A.v, BT, *c.ctx);
    }
    if (rope_) {
      Scope s(Cat::kRope);
      rope_forward(A.q, B, T, H_, hd_, theta_);
      rope_forward(A.k, B, T, Hkv_, hd_, theta_);
    }
    {
      Scope s(Cat::kAttention);
      // FLOPs actually done: QKᵀ and PV over the causal triangle, T(T+1)/2 dot products of
      // length hd each, per (batch, head).
      prof::add_flops(Cat::kAttention, 2.0 * 2.0 * B * H_ * (T * (T + 1) / 2) * hd_);
      attention_forward(A.y, A.att, A.q, A.k, A.v, B, T, H_, Hkv_, hd_);
    }
    lin[3].forward(A.y, out, BT, *c.ctx);
  }
  void backward(const MixerCall& c, const float* x, const float* dout, float* dx) override {
    (void)x;
    const int64_t B = c.B, T = c.T, BT = B * T, q = H_ * hd_, kv = Hkv_ * hd_;
    const Acts A = acts(c.acts, B, T);
    Linear* lin = c.linears;
    float* dy = c.scratch;
    float* dq = dy + BT * q;
    float* dk = dq + BT * q;
    float* dv = dk + BT * kv;
    float* ds = dv + BT * kv;
    std::memset(dy, 0, sizeof(float) * BT * q);
    lin[3].backward(dout, dy, BT, *c.ctx);
    std::memset(dq, 0, sizeof(float) * BT * q);
    std::memset(dk, 0, sizeof(float) * BT * kv);
    std::memset(dv, 0, sizeof(float) * BT * kv);
    {
      Scope s(Cat::kAttention);
      prof::add_flops(Cat::kAttention, 4.0 * 2.0 * B * H_ * (T * (T + 1) / 2) * hd_);  // dP, dQ, dK, dV
      attention_backward(dq, dk, dv, ds, dy, A.q, A.k, A.v, A.att, B, T, H_, Hkv_, hd_);
    }
    if (rope_) {
      Scope s(Cat::kRope);
      rope_backward(dq, B, T, H_, hd_, theta_);
      rope_backward(dk, B, T, Hkv_, hd_, theta_);
    }
    std::memset(dx, 0, sizeof(float) * BT * d_);
    lin[0].backward(dq, dx, BT, *c.ctx);
    lin[1].backward(dk, dx, BT, *c.ctx);
    lin[2].backward(dv, dx, BT, *c.ctx);
  }
  // PaLM: QKᵀ and PV, 2·T·(H·hd) FLOPs each per token forward over the full T × T square,
  // ×3 with backward: 12·(H·hd)·T.
  double extra_flops_per_token(int64_t T) const override {
    return 12.0 * double(H_ * hd_) * double(T);
  }
  // Over the causal triangle the kernel computes: per token (T + 1)/2 query-key pairs ×
  // 2 FLOPs × H·hd × 2 products (QKᵀ, PV) × 3 (forward + backward) = 6·(H·hd)·(T + 1).
  double causal_flops_per_token(int64_t T) const override {
    return 6.0 * double(H_ * hd_) * double(T + 1);
  }

 private:
  int64_t d_, H_, Hkv_, hd_;
  bool rope_;
  float theta_;
};
}  // namespace

namespace {
void check_attention(const ModelConfig& m, const ConfigFail& fail) {
  if (m.n_heads < 1) fail("model.n_heads (" + std::to_string(m.n_heads) + ") must be >= 1");
  if (m.head_dim == 0 && m.d_model % m.n_heads != 0)
    fail("model.d_model (" + std::to_string(m.d_model) + ") must be divisible by model.n_heads (" +
         std::to_string(m.n_heads) + "), or set model.head_dim");
  if (m.n_heads % m.kv_heads() != 0)
    fail("model.n_heads (" + std::to_string(m.n_heads) + ") must be a multiple of "
         "model.n_kv_heads (" + std::to_string(m.kv_heads()) + ")");
  if (m.rope && m.attn_head_dim() % 2 != 0)
    fail("head dimension " + std::to_string(m.attn_head_dim()) +
         (m.head_dim ? " (model.head_dim)" : " (d_model/n_heads)") +
         " must be even for RoPE (or set model.rope = false)");
}

std::unique_ptr<Mixer> make_attention(const ModelConfig& c) {
  return std::make_unique<AttentionMixer>(c);
}

// Rows of a [heads·hd, cols] projection reordered per head from fp4train's interleaved RoPE
// pairs to HF's halves: HF row j of a head = fp4train row 2j (j < hd/2), 2(j − hd/2) + 1.
std::vector<float> rope_rows_to_hf(const float* w, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> out(heads * hd * cols);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < hd; ++j) {
      const int64_t src = j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1;
      const float* s = w + (h * hd + src) * cols;
      std::copy(s, s + cols, out.begin() + (h * hd + j) * cols);
    }
  return out;
}

std::vector<HfPiece> hf_attention(const std::string& m, const float* v, int64_t rows, int64_t cols,
                                  const ModelConfig& cfg) {
  if ((m == "q_proj" || m == "k_proj") && cfg.rope) {
    const int64_t hd = cfg.attn_head_dim();
    return {{m + ".weight", {rows, cols}, rope_rows_to_hf(v, rows / hd, hd, cols)}};
  }
  if (m == "q_proj" || m == "k_proj" || m == "v_proj" || m == "o_proj")
    return {{m + ".weight", {rows, cols}, std::vector<float>(v, v + rows * cols)}};
  return {};
}
}  // namespace

MixerKind attention_mixer_kind() {
  MixerKind k;
  k.symbol = '*';
  k.name = "attention";
  k.key = "attention";
  k.linears = {"q_proj", "k_proj", "v_proj", "o_proj"};
  k.check = check_attention;
  k.make = make_attention;
  k.hf_llama_module = "self_attn.";
  k.hf_llama_norm = "input_layernorm.weight";
  k.hf = hf_attention;
  return k;
}

}  // namespace fp4::nn
