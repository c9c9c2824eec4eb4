// Bit-for-bit twin test of the causal attention kernels (src/nn/attention.cpp) against their
// plain scalar reference (src/nn/attention_ref.cpp, fp4::nn::detail::attention_*_ref).
// Every micro-kernel variant this CPU can run (AVX-512, AVX2, baseline SSE2 "scalar twin"),
// forced with detail::set_attention_isa, with 1, 2 and 3 OpenMP threads, must reproduce the
// reference's forward output, att probabilities, and backward dq, dk, dv (accumulated onto
// random initial gradients) and scratch (dS) exactly (memcmp), on random normal inputs over
// many shapes (T not a multiple of the micro-kernel's row block (8 on AVX-512, 4 otherwise) or
// of its 16/32-column block, T = 1 and T = 300, head sizes 1 to 100, so hd is not a multiple
// of 16 or needs a 16-column tail after 32-column blocks, several B·H) and on adversarial
// inputs: logits of ±1e4 (exp underflows), tied scores, exact and signed zeros, subnormals, a
// single huge element, infinities (which must not leak across the causal mask), and scores
// chosen so that the softmax's exp sees ~33k distinct arguments across [−110, 0] (the
// vector exp must match internal::exp_scalar bit for bit).
// Grouped-query attention (Hkv < H key/value heads, k/v rows of stride Hkv·hd): the same
// twin checks for Hkv ∈ {H, H/2, 1}; GQA equals MHA on k/v heads replicated per query head
// (dk/dv: the replicated heads' gradients summed in ascending head order); with Hkv = H both
// kernels reproduce a frozen copy of the pre-GQA [B, T, C] reference (LegacyMhaTwin below)
// bit for bit, so the Llama-style model's numbers are unchanged; bad arguments throw.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/nn/layers.h"
#include "support/variant_set.h"

using namespace fp4::nn;
using detail::AttentionIsa;

namespace {

struct Shape {
  int64_t B, T, H, Hkv, hd;
  int64_t Cq() const { return H * hd; }     // row stride of q, out, dq, dout
  int64_t Ckv() const { return Hkv * hd; }  // row stride of k, v, dk, dv
  size_t act() const { return static_cast<size_t>(B * T * Cq()); }
  size_t act_kv() const { return static_cast<size_t>(B * T * Ckv()); }
  size_t att() const { return static_cast<size_t>(B * H * T * T); }
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " Hkv=" + std::to_string(Hkv) + " hd=" + std::to_string(hd);
  }
};

// Multi-head shape from (B, T, H, hd) (Hkv = H), grouped-query from (B, T, H, Hkv, hd).
Shape shape(int64_t B, int64_t T, int64_t H, int64_t hd) { return Shape{B, T, H, H, hd}; }
Shape gshape(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd) {
  return Shape{B, T, H, Hkv, hd};
}

struct Inputs {
  std::vector<float> q, k, v, dout;
  std::vector<float> dq0, dk0, dv0;  // initial gradients (backward accumulates onto them)
};

struct Outputs {
  std::vector<float> out, att, dq, dk, dv, scratch;
};

std::vector<float> randn(size_t n, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

Inputs random_inputs(const Shape& s, uint32_t seed) {
  std::mt19937 g(seed);
  Inputs in;
  in.q = randn(s.act(), g);
  in.k = randn(s.act_kv(), g);
  in.v = randn(s.act_kv(), g);
  in.dout = randn(s.act(), g);
  in.dq0 = randn(s.act(), g);
  in.dk0 = randn(s.act_kv(), g);
  in.dv0 = randn(s.act_kv(), g);
  return in;
}

// A quiet NaN with a payload no kernel produces: any element left unwritten shows up.
float sentinel() {
  const uint32_t bits = 0x7FC0BEEFu;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The GQA signatures (…, B, T, H, Hkv, hd).
using FwdFn = void (*)(float*, float*, const float*, const float*, const float*, int64_t,
                       int64_t, int64_t, int64_t, int64_t);
using BwdFn = void (*)(float*, float*, float*, float*, const float*, const float*,
                       const float*, const float*, const float*, int64_t, int64_t, int64_t,
                       int64_t, int64_t);

// Runs forward, then backward on `att_in` (the reference's probabilities, so that both sides
// of a comparison see identical backward inputs even if their forwards differed).
Outputs run(FwdFn fwd, BwdFn bwd, const Shape& s, const Inputs& in,
            const std::vector<float>* att_in) {
  Outputs o;
  o.out.assign(s.act(), sentinel());
  o.att.assign(s.att(), sentinel());
  o.scratch.assign(s.att(), sentinel());
  o.dq = in.dq0;
  o.dk = in.dk0;
  o.dv = in.dv0;
  fwd(o.out.data(), o.att.data(), in.q.data(), in.k.data(), in.v.data(), s.B, s.T, s.H, s.Hkv,
      s.hd);
  const std::vector<float>& att = att_in ? *att_in : o.att;
  bwd(o.dq.data(), o.dk.data(), o.dv.data(), o.scratch.data(), in.dout.data(), in.q.data(),
      in.k.data(), in.v.data(), att.data(), s.B, s.T, s.H, s.Hkv, s.hd);
  return o;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

void expect_same_bits(const char* name, const std::vector<float>& got,
                      const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << name;
  if (std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0) return;
  size_t first = got.size(), count = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(want[i])) {
      if (first == got.size()) first = i;
      ++count;
    }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: %zu of %zu elements differ; first at %zu: got %a (0x%08x), "
                "reference %a (0x%08x)", name, count, got.size(), first,
                static_cast<double>(got[first]), bits(got[first]),
                static_cast<double>(want[first]), bits(want[first]));
  ADD_FAILURE() << buf;
}

struct Variant {
  AttentionIsa isa;
  const char* name;
  bool emulated;  // selected by FP4_TEST_VARIANTS=emulated (tests/support/variant_set.h)
};
constexpr Variant kVariants[] = {{AttentionIsa::kAvx512, "avx512", false},
                                 {AttentionIsa::kAvx2, "avx2", false},
                                 {AttentionIsa::kScalarTwin, "sse2 (scalar twin)", false},
                                 {AttentionIsa::kEmu16, "emu16 (AVX-512 body emulated)", true}};

class AttentionTwin : public ::testing::Test {
 protected:
  void SetUp() override { saved_threads_ = omp_get_max_threads(); }
  void TearDown() override {
    detail::set_attention_isa(AttentionIsa::kAuto);
    omp_set_num_threads(saved_threads_);
  }

  // Reference once, then every supported variant with 1, 2 and 3 threads, all bit for bit.
  // Returns the reference outputs for extra checks.
  Outputs check(const std::string& what, const Shape& s, const Inputs& in) {
    SCOPED_TRACE(what + " [" + s.str() + "]");
    const Outputs ref =
        run(detail::attention_forward_ref, detail::attention_backward_ref, s, in, nullptr);
    int ran = 0;
    for (const Variant& var : kVariants) {
      if (!fp4::test::variant_selected(var.emulated)) continue;
      if (!detail::set_attention_isa(var.isa)) continue;  // CPU lacks it
      ++ran;
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(std::string(var.name) + ", " + std::to_string(threads) + " thread(s)");
        omp_set_num_threads(threads);
        const Outputs got = run(attention_forward, attention_backward, s, in, &ref.att);
        expect_same_bits("out", got.out, ref.out);
        expect_same_bits("att", got.att, ref.att);
        expect_same_bits("dq", got.dq, ref.dq);
        expect_same_bits("dk", got.dk, ref.dk);
        expect_same_bits("dv", got.dv, ref.dv);
        expect_same_bits("scratch", got.scratch, ref.scratch);
      }
    }
    detail::set_attention_isa(AttentionIsa::kAuto);
    EXPECT_GE(ran, 1);  // the baseline (native) and emu16 (emulated) variants run everywhere
    return ref;
  }

  // The adversarial cases run on these shapes (the last MHA and GQA ones are big enough for
  // the parallel path).
  std::vector<Shape> adversarial_shapes() const {
    return {shape(1, 1, 1, 8),         shape(2, 5, 3, 8),         shape(1, 17, 1, 64),
            shape(2, 37, 2, 24),       shape(2, 37, 2, 64),       shape(1, 77, 2, 48),
            gshape(2, 5, 4, 2, 8),     gshape(1, 17, 4, 1, 24),   gshape(2, 37, 4, 2, 24)};
  }

  // Builds inputs for every adversarial shape with `make` and checks them.
  void check_adversarial(const std::string& what,
                         const std::function<void(const Shape&, Inputs&, std::mt19937&)>& make) {
    uint32_t seed = 1000;
    for (const Shape& s : adversarial_shapes()) {
      Inputs in = random_inputs(s, seed);
      std::mt19937 g(seed + 1);
      seed += 17;
      make(s, in, g);
      check(what, s, in);
    }
  }

  int saved_threads_ = 1;
};

TEST_F(AttentionTwin, VariantsAvailable) {
  // Informational: which variants this CPU exercises (the baseline one always must).
  std::string avail;
  for (const Variant& var : kVariants)
    if (detail::set_attention_isa(var.isa)) avail += std::string(" ") + var.name;
  std::printf("attention variants tested on this CPU:%s\n", avail.c_str());
  EXPECT_TRUE(detail::set_attention_isa(AttentionIsa::kScalarTwin));
}

TEST_F(AttentionTwin, RandomNormalShapes) {
  uint32_t seed = 1;
  for (int64_t T : {1, 5, 16, 17, 37})
    for (int64_t hd : {8, 24, 64})
      for (auto [B, H] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}, {3, 2}}) {
        const Shape s = shape(B, T, H, hd);
        check("random normal", s, random_inputs(s, seed++));
      }
  // Odd head sizes (hd not a multiple of 4/8/16) and a longer sequence.
  check("random normal", shape(1, 23, 2, 5), random_inputs(shape(1, 23, 2, 5), seed++));
  check("random normal", shape(1, 70, 1, 16), random_inputs(shape(1, 70, 1, 16), seed++));
  // Row / column block edges of the 8 × 32 (AVX-512) and 4 × 16 micro-kernels: T a multiple
  // of 8 but not 16, one past / short of a block, hd = 48 and 100 (32-column blocks plus a
  // 16-column tail), hd = 1, and a long sequence.
  for (int64_t T : {8, 9, 24, 31, 33, 40, 63, 65})
    for (int64_t hd : {1, 48, 100}) {
      const Shape s = shape(1, T, 2, hd);
      check("block edges", s, random_inputs(s, seed++));
    }
  check("long sequence", shape(1, 300, 2, 64), random_inputs(shape(1, 300, 2, 64), seed++));
  check("long sequence", shape(2, 300, 1, 40), random_inputs(shape(2, 300, 1, 40), seed++));
}

TEST_F(AttentionTwin, ExpArguments) {
  // hd = 1 (scale 1), q = 1 and k[token 0] = 0, other k in [−110, 0]: s[i, j] = k[j] exactly
  // (fma(1, x, +0) = x), every row max is 0 and the softmax evaluates exp(k[j]) for each j,
  // so the att rows expose exp on 128 heads × 255 arguments: uniform over [−110, 0] (exp
  // underflows to subnormals below about −87.3 and to 0 below −104), with a few exact
  // arguments mixed in (−0, subnormals, −104, just above −104, −87.33, −1e-8).
  const Shape s = shape(1, 256, 128, 1);
  Inputs in = random_inputs(s, 4242);
  std::mt19937 g(4243);
  std::uniform_real_distribution<float> u(-110.0f, 0.0f);
  std::fill(in.q.begin(), in.q.end(), 1.0f);
  for (float& x : in.k) x = u(g);
  const float specials[] = {-0.0f, -1e-40f, -1e-8f, -104.0f, -103.99999f, -87.33655f, -87.5f,
                            -1.0f, -0.5f, -88.7f};
  for (int64_t h = 0; h < s.H; ++h) {
    in.k[static_cast<size_t>(h)] = 0.0f;  // token 0: the row max
    for (size_t n = 0; n < std::size(specials); ++n)
      in.k[static_cast<size_t>((1 + 7 * n + h) * s.Ckv() + h)] = specials[n];
  }
  check("exp arguments", s, in);
}

TEST_F(AttentionTwin, HugeLogitsUnderflow) {
  // q, k ~ N(0, 100²): scores ~ ±1e4, so exp(s − m) underflows to +0 for almost every j and
  // the backward sees exact zeros in P (and signed zeros in dS).
  check_adversarial("huge logits", [](const Shape& s, Inputs& in, std::mt19937& g) {
    in.q = randn(s.act(), g, 100.0f);
    in.k = randn(s.act_kv(), g, 100.0f);
  });
}

TEST_F(AttentionTwin, TiedScores) {
  // All rows of q equal and all rows of k equal: every score in a row is the same value
  // (exact ties for the max, P uniform 1/(i+1)).
  check_adversarial("tied scores", [](const Shape& s, Inputs& in, std::mt19937& g) {
    const size_t Cq = static_cast<size_t>(s.Cq()), Ckv = static_cast<size_t>(s.Ckv());
    const auto qrow = randn(Cq, g), krow = randn(Ckv, g);
    for (size_t t = 0; t < static_cast<size_t>(s.B * s.T); ++t) {
      for (size_t c = 0; c < Cq; ++c) in.q[t * Cq + c] = qrow[c];
      for (size_t c = 0; c < Ckv; ++c) in.k[t * Ckv + c] = krow[c];
    }
  });
  // Zero queries: every score is exactly 0 (ties at 0, max 0).
  check_adversarial("zero queries", [](const Shape&, Inputs& in, std::mt19937&) {
    std::fill(in.q.begin(), in.q.end(), 0.0f);
  });
}

TEST_F(AttentionTwin, ExactAndSignedZeros) {
  // About half of every input is +0 or −0 (including the initial gradients), and negative
  // values so products are −0: exercises the +0 accumulator start and −0 + +0 = +0.
  check_adversarial("signed zeros", [](const Shape&, Inputs& in, std::mt19937& g) {
    std::uniform_int_distribution<int> pick(0, 3);
    for (auto* vec : {&in.q, &in.k, &in.v, &in.dout, &in.dq0, &in.dk0, &in.dv0})
      for (float& x : *vec) {
        const int p = pick(g);
        if (p == 0) x = 0.0f;
        if (p == 1) x = -0.0f;
      }
  });
  // Entirely zero v and dout, −0 initial gradients: every product is ±0.
  check_adversarial("all-zero v/dout", [](const Shape&, Inputs& in, std::mt19937&) {
    std::fill(in.v.begin(), in.v.end(), -0.0f);
    std::fill(in.dout.begin(), in.dout.end(), 0.0f);
    std::fill(in.dq0.begin(), in.dq0.end(), -0.0f);
    std::fill(in.dk0.begin(), in.dk0.end(), -0.0f);
    std::fill(in.dv0.begin(), in.dv0.end(), -0.0f);
  });
}

TEST_F(AttentionTwin, Subnormals) {
  // Values around 1e-39 (subnormal): products underflow to ±0, sums of subnormals stay
  // subnormal. Mixed with ordinary values in v/dout so outputs are a blend of both.
  check_adversarial("subnormals", [](const Shape& s, Inputs& in, std::mt19937& g) {
    in.q = randn(s.act(), g, 1e-39f);
    in.k = randn(s.act_kv(), g, 1e-39f);
    in.v = randn(s.act_kv(), g, 1e-39f);
    in.dout = randn(s.act(), g, 1e-39f);
    in.dq0 = randn(s.act(), g, 1e-39f);
    std::uniform_int_distribution<size_t> idx(0, s.act_kv() - 1);
    for (int n = 0; n < 8; ++n) in.v[idx(g)] = 1.0f;
  });
  // Subnormal v and dout against ordinary q, k: P ordinary, P·v subnormal or ±0.
  check_adversarial("subnormal v/dout", [](const Shape& s, Inputs& in, std::mt19937& g) {
    in.v = randn(s.act_kv(), g, 1e-41f);
    in.dout = randn(s.act(), g, 1e-41f);
  });
}

TEST_F(AttentionTwin, OneHugeElement) {
  // A single huge element in one input (finite results): the row it lands in is one-hot,
  // and large-magnitude terms dominate (and absorb) the others in the sums.
  for (int which = 0; which < 4; ++which) {
    const char* names[] = {"huge q element", "huge k element", "huge v element",
                           "huge dout element"};
    check_adversarial(names[which], [which](const Shape&, Inputs& in, std::mt19937& g) {
      std::vector<float>* target[] = {&in.q, &in.k, &in.v, &in.dout};
      std::uniform_int_distribution<size_t> idx(0, target[which]->size() - 1);
      const float big[] = {3e17f, -3e17f, 1e30f, -1e30f};
      (*target[which])[idx(g)] = big[which];
    });
  }
}

TEST_F(AttentionTwin, InfinitiesStayCausal) {
  // ±inf in v / k / q / dout of one token j: bit-identical (the NaNs produced are all the
  // default NaN), and rows i < j of the same (b, h) stay finite: the kernel never adds the
  // masked 0 · inf above the diagonal.
  for (const Shape& s : adversarial_shapes()) {
    if (s.T < 3) continue;
    for (int which = 0; which < 4; ++which) {
      Inputs in = random_inputs(s, 77 + which);
      const int64_t j = s.T - 1 - (s.T > 4 ? 2 : 0);  // not the first row of its 4-row block
      const float inf = std::numeric_limits<float>::infinity();
      std::vector<float>* target[] = {&in.v, &in.k, &in.q, &in.dout};
      const int64_t ld = which < 2 ? s.Ckv() : s.Cq();
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t c = 0; c < ld; c += 3)
          (*target[which])[(b * s.T + j) * ld + c] = c % 2 ? -inf : inf;
      const char* names[] = {"v", "k", "q", "dout"};
      const Outputs ref =
          check(std::string("inf in ") + names[which] + " at token " + std::to_string(j), s, in);
      // Causality of the reference (and so of every variant that matched it): rows before
      // token j never see it in out or dq, and rows after it get no dk (inf q) / dv (inf
      // dout) contribution from it.
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t t = 0; t < s.T; ++t) {
          for (int64_t c = 0; c < s.Cq() && t < j; ++c) {
            const size_t e = static_cast<size_t>((b * s.T + t) * s.Cq() + c);
            ASSERT_TRUE(std::isfinite(ref.out[e])) << "out row " << t << ", inf token " << j;
            ASSERT_TRUE(std::isfinite(ref.dq[e])) << "dq row " << t << ", inf token " << j;
          }
          // inf v / k at j reach every later row, but not their dk (inf q) / dv (inf dout).
          for (int64_t c = 0; c < s.Ckv() && t > j && which >= 2; ++c) {
            const size_t e = static_cast<size_t>((b * s.T + t) * s.Ckv() + c);
            ASSERT_TRUE(std::isfinite(ref.dk[e])) << "dk row " << t << ", inf token " << j;
            ASSERT_TRUE(std::isfinite(ref.dv[e])) << "dv row " << t << ", inf token " << j;
          }
        }
    }
  }
}

TEST_F(AttentionTwin, GroupedQueryShapes) {
  // Hkv ∈ {H, H/2, 1} with T not a multiple of 16 (nor of 4/8), odd head sizes, several B;
  // the (2, 37, 8, ·, 24) and (1, 100, 4, 1, 64) shapes take the parallel path.
  uint32_t seed = 5000;
  for (int64_t T : {1, 5, 17, 37})
    for (int64_t hd : {5, 24})
      for (auto [B, H] : {std::pair<int64_t, int64_t>{1, 2}, {2, 4}, {3, 6}})
        for (int64_t Hkv : {H, H / 2, int64_t{1}}) {
          const Shape s = gshape(B, T, H, Hkv, hd);
          check("grouped-query", s, random_inputs(s, seed++));
        }
  for (int64_t Hkv : {8, 4, 2, 1}) {
    const Shape s = gshape(2, 37, 8, Hkv, 24);
    check("grouped-query, parallel", s, random_inputs(s, seed++));
  }
  check("grouped-query, long", gshape(1, 100, 4, 1, 64),
        random_inputs(gshape(1, 100, 4, 1, 64), seed++));
  check("grouped-query, block edges", gshape(1, 33, 4, 2, 48),
        random_inputs(gshape(1, 33, 4, 2, 48), seed++));
}

// Every shape class a model config can produce (the twin tests once had no head_dim below 16
// with GQA, the hybrid test configs' shape): head_dim below 16, equal to it, and not a multiple
// of any vector width (4, 8, 16 lanes); GQA ratios 1, 2, 4; T around every row block (kMR = 4
// and 8), the 16-column groups and the 32-column main blocks of the AVX-512 kernel; B = 1 and
// 2. Includes the shapes of tests/nn/test_hybrid.cpp's attention mixer (B 2, T 5, H 4, Hkv 2,
// hd 4) and hybrid model (T 12, 9). Every variant, including the emulated AVX-512 body.
TEST_F(AttentionTwin, ModelShapeClasses) {
  uint32_t seed = 9000;
  for (int64_t hd : {2, 4, 12, 16, 20})
    for (int64_t G : {1, 2, 4})
      for (int64_t T : {1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33})
        for (int64_t B : {1, 2}) {
          const Shape s = gshape(B, T, 4, 4 / G, hd);
          check("model shape class", s, random_inputs(s, seed++));
        }
}

// k/v [B, T, Hkv·hd] → [B, T, H·hd], KV head h / (H / Hkv) copied to query head h.
std::vector<float> repeat_kv(const std::vector<float>& x, const Shape& s) {
  std::vector<float> r(s.act());
  const int64_t G = s.H / s.Hkv;
  for (int64_t t = 0; t < s.B * s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t c = 0; c < s.hd; ++c)
        r[static_cast<size_t>(t * s.Cq() + h * s.hd + c)] =
            x[static_cast<size_t>(t * s.Ckv() + (h / G) * s.hd + c)];
  return r;
}

TEST_F(AttentionTwin, GqaEqualsReplicatedKvHeads) {
  // GQA is MHA with every KV head repeated for the query heads of its group (HF transformers'
  // repeat_kv): out, att, dq and scratch are the MHA ones bit for bit; dk/dv of KV head g are
  // dk0 + (MHA gradient of query head g·G) + (… g·G + 1) + …, added in that order, each MHA
  // gradient taken from a zero start. Checked for the twin and every variant (1–3 threads).
  uint32_t seed = 7000;
  for (const Shape& s : {gshape(2, 5, 4, 2, 8), gshape(1, 37, 6, 2, 24),
                         gshape(2, 37, 8, 1, 24), gshape(1, 19, 3, 1, 7)}) {
    SCOPED_TRACE(s.str());
    const Inputs in = random_inputs(s, seed++);
    const Shape m = shape(s.B, s.T, s.H, s.hd);
    Inputs rep = in;
    rep.k = repeat_kv(in.k, s);
    rep.v = repeat_kv(in.v, s);
    rep.dk0.assign(s.act(), 0.0f);
    rep.dv0.assign(s.act(), 0.0f);
    const Outputs mha =
        run(detail::attention_forward_ref, detail::attention_backward_ref, m, rep, nullptr);
    std::vector<float> want_dk = in.dk0, want_dv = in.dv0;
    const int64_t G = s.H / s.Hkv;
    for (int64_t h = 0; h < s.H; ++h)  // ascending query head
      for (int64_t t = 0; t < s.B * s.T; ++t)
        for (int64_t c = 0; c < s.hd; ++c) {
          const size_t kv = static_cast<size_t>(t * s.Ckv() + (h / G) * s.hd + c);
          const size_t qh = static_cast<size_t>(t * s.Cq() + h * s.hd + c);
          want_dk[kv] += mha.dk[qh];
          want_dv[kv] += mha.dv[qh];
        }
    const Outputs ref = check("GQA vs replicated", s, in);  // every variant equals the twin
    expect_same_bits("out", ref.out, mha.out);
    expect_same_bits("att", ref.att, mha.att);
    expect_same_bits("dq", ref.dq, mha.dq);
    expect_same_bits("scratch", ref.scratch, mha.scratch);
    expect_same_bits("dk", ref.dk, want_dk);
    expect_same_bits("dv", ref.dv, want_dv);
  }
}

// Frozen copy of the scalar twin as it was before grouped-query attention (attention_ref.cpp
// at commit a76c33d: [B, T, C] with C = H·hd for q, k, v alike; detail::exp_ref is the
// internal::exp_scalar it called), kept only to pin that the GQA kernels at Hkv = H give the
// old bits, so the Llama-style model's numbers do not change. Do not "fix" it to match.
float legacy_tree16(float* p, bool max) {
  auto op = [max](float a, float b) { return max ? (b > a ? b : a) : a + b; };
  for (int i = 0; i < 8; ++i) p[i] = op(p[i], p[i + 8]);
  for (int i = 0; i < 4; ++i) p[i] = op(p[i], p[i + 4]);
  for (int i = 0; i < 2; ++i) p[i] = op(p[i], p[i + 2]);
  return op(p[0], p[1]);
}
void legacy_forward(float* out, float* att, const float* q, const float* k, const float* v,
                    int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T * C + h * hd;
      const float *Q = q + off, *K = k + off, *V = v + off;
      float* O = out + off;
      float* P = att + (b * H + h) * T * T;
      for (int64_t i = 0; i < T; ++i) {
        float* p = P + i * T;
        for (int64_t j = 0; j <= i; ++j) {
          float acc = 0.0f;
          for (int64_t c = 0; c < hd; ++c) acc = std::fma(Q[i * C + c], K[j * C + c], acc);
          p[j] = acc;
        }
        float part[16];
        std::fill(part, part + 16, -std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j <= i; ++j) {
          p[j] *= scale;
          float& mp = part[j % 16];
          mp = p[j] > mp ? p[j] : mp;
        }
        const float m = legacy_tree16(part, true);
        std::fill(part, part + 16, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = detail::exp_ref(p[j] - m);
          part[j % 16] += p[j];
        }
        const float inv = 1.0f / legacy_tree16(part, false);
        for (int64_t j = 0; j <= i; ++j) p[j] *= inv;
        for (int64_t j = i + 1; j < T; ++j) p[j] = 0.0f;
        for (int64_t c = 0; c < hd; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j <= i; ++j) acc = std::fma(p[j], V[j * C + c], acc);
          O[i * C + c] = acc;
        }
      }
    }
}
void legacy_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                     const float* q, const float* k, const float* v, const float* att,
                     int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hd = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T * C + h * hd;
      const float *Q = q + off, *K = k + off, *V = v + off, *dO = dout + off;
      float *dQ = dq + off, *dK = dk + off, *dV = dv + off;
      const float* P = att + (b * H + h) * T * T;
      float* dS = scratch + (b * H + h) * T * T;
      for (int64_t i = 0; i < T; ++i) {
        const float* p = P + i * T;
        float* g = dS + i * T;
        for (int64_t j = 0; j <= i; ++j) {
          float acc = 0.0f;
          for (int64_t c = 0; c < hd; ++c) acc = std::fma(dO[i * C + c], V[j * C + c], acc);
          g[j] = acc;
        }
        float part[16] = {};
        for (int64_t j = 0; j <= i; ++j) part[j % 16] = std::fma(p[j], g[j], part[j % 16]);
        const float dot = legacy_tree16(part, false);
        for (int64_t j = 0; j <= i; ++j) g[j] = p[j] * (g[j] - dot) * scale;
        for (int64_t j = i + 1; j < T; ++j) g[j] = 0.0f;
      }
      for (int64_t i = 0; i < T; ++i)
        for (int64_t c = 0; c < hd; ++c) {
          float acc = 0.0f;
          for (int64_t j = 0; j <= i; ++j) acc = std::fma(dS[i * T + j], K[j * C + c], acc);
          dQ[i * C + c] += acc;
        }
      for (int64_t j = 0; j < T; ++j)
        for (int64_t c = 0; c < hd; ++c) {
          float acc_k = 0.0f, acc_v = 0.0f;
          for (int64_t i = j; i < T; ++i) {
            acc_k = std::fma(dS[i * T + j], Q[i * C + c], acc_k);
            acc_v = std::fma(P[i * T + j], dO[i * C + c], acc_v);
          }
          dK[j * C + c] += acc_k;
          dV[j * C + c] += acc_v;
        }
    }
}

TEST_F(AttentionTwin, LegacyMhaBitsUnchanged) {
  // Hkv = H: the GQA twin, every variant (1–3 threads, via check) and the [B, T, C] wrappers
  // reproduce the pre-GQA reference bit for bit, on random and adversarial (huge logits,
  // signed zeros) inputs, including shapes on the parallel path.
  uint32_t seed = 9000;
  for (const Shape& s : {shape(1, 1, 1, 8), shape(2, 17, 3, 24), shape(3, 37, 2, 5),
                         shape(2, 37, 4, 64), shape(1, 70, 2, 48)})
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE(s.str() + " inputs " + std::to_string(kind));
      Inputs in = random_inputs(s, seed++);
      std::mt19937 g(seed);
      if (kind == 1) {
        in.q = randn(s.act(), g, 100.0f);
        in.k = randn(s.act_kv(), g, 100.0f);
      } else if (kind == 2) {
        std::uniform_int_distribution<int> pick(0, 3);
        for (auto* vec : {&in.q, &in.k, &in.v, &in.dout, &in.dq0, &in.dk0, &in.dv0})
          for (float& x : *vec) {
            const int p = pick(g);
            if (p == 0) x = 0.0f;
            if (p == 1) x = -0.0f;
          }
      }
      Outputs old;
      old.out.assign(s.act(), sentinel());
      old.att.assign(s.att(), sentinel());
      old.scratch.assign(s.att(), sentinel());
      old.dq = in.dq0;
      old.dk = in.dk0;
      old.dv = in.dv0;
      const int64_t C = s.Cq();
      legacy_forward(old.out.data(), old.att.data(), in.q.data(), in.k.data(), in.v.data(), s.B,
                     s.T, C, s.H);
      legacy_backward(old.dq.data(), old.dk.data(), old.dv.data(), old.scratch.data(),
                      in.dout.data(), in.q.data(), in.k.data(), in.v.data(), old.att.data(), s.B,
                      s.T, C, s.H);
      const Outputs ref = check("legacy MHA", s, in);
      expect_same_bits("out", ref.out, old.out);
      expect_same_bits("att", ref.att, old.att);
      expect_same_bits("dq", ref.dq, old.dq);
      expect_same_bits("dk", ref.dk, old.dk);
      expect_same_bits("dv", ref.dv, old.dv);
      expect_same_bits("scratch", ref.scratch, old.scratch);
      // The [B, T, C] wrappers (as src/nn/model.cpp calls them), fast and twin.
      for (bool twin : {false, true}) {
        Outputs w;
        w.out.assign(s.act(), sentinel());
        w.att.assign(s.att(), sentinel());
        w.scratch.assign(s.att(), sentinel());
        w.dq = in.dq0;
        w.dk = in.dk0;
        w.dv = in.dv0;
        if (twin) {
          detail::attention_forward_ref(w.out.data(), w.att.data(), in.q.data(), in.k.data(),
                                        in.v.data(), s.B, s.T, C, s.H);
          detail::attention_backward_ref(w.dq.data(), w.dk.data(), w.dv.data(), w.scratch.data(),
                                         in.dout.data(), in.q.data(), in.k.data(), in.v.data(),
                                         w.att.data(), s.B, s.T, C, s.H);
        } else {
          attention_forward(w.out.data(), w.att.data(), in.q.data(), in.k.data(), in.v.data(),
                            s.B, s.T, C, s.H);
          attention_backward(w.dq.data(), w.dk.data(), w.dv.data(), w.scratch.data(),
                             in.dout.data(), in.q.data(), in.k.data(), in.v.data(),
                             w.att.data(), s.B, s.T, C, s.H);
        }
        SCOPED_TRACE(twin ? "MHA wrapper, twin" : "MHA wrapper, fast");
        expect_same_bits("out", w.out, old.out);
        expect_same_bits("att", w.att, old.att);
        expect_same_bits("dq", w.dq, old.dq);
        expect_same_bits("dk", w.dk, old.dk);
        expect_same_bits("dv", w.dv, old.dv);
        expect_same_bits("scratch", w.scratch, old.scratch);
      }
    }
}

TEST_F(AttentionTwin, BadArgumentsThrow) {
  // Same argument checks in the kernels and the twins (GQA and [B, T, C] forms); B = 0 is a
  // no-op without checks.
  std::vector<float> buf(4096, 0.0f);
  float* p = buf.data();
  struct Bad {
    int64_t T, H, Hkv, hd;
    const char* why;  // must appear in the message
  };
  const char* kMul = "H must be a multiple of Hkv";
  const char* kKv = "Hkv (key/value heads) must be > 0";
  const Bad bad[] = {{2, 4, 3, 8, kMul},
                     {2, 3, 2, 8, kMul},
                     {2, 2, 4, 8, kMul},
                     {2, 4, 0, 8, kKv},
                     {2, 4, -2, 8, kKv},
                     {2, 0, 1, 8, "H (query heads) must be > 0"},
                     {2, 4, 2, 0, "hd (head size) must be > 0"},
                     {0, 4, 2, 8, "T must be > 0"},
                     {-1, 4, 2, 8, "T must be > 0"}};
  auto expect_invalid = [](const std::function<void()>& f, const char* fn, const char* arg) {
    try {
      f();
      ADD_FAILURE() << fn << " did not throw (expected: " << arg << ")";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(fn), std::string::npos) << msg;
      EXPECT_NE(msg.find(arg), std::string::npos) << msg;
    }
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE("T=" + std::to_string(b.T) + " H=" + std::to_string(b.H) + " Hkv=" +
                 std::to_string(b.Hkv) + " hd=" + std::to_string(b.hd));
    expect_invalid([&] { attention_forward(p, p, p, p, p, 1, b.T, b.H, b.Hkv, b.hd); },
                   "attention_forward", b.why);
    expect_invalid(
        [&] { attention_backward(p, p, p, p, p, p, p, p, p, 1, b.T, b.H, b.Hkv, b.hd); },
        "attention_backward", b.why);
    expect_invalid(
        [&] { detail::attention_forward_ref(p, p, p, p, p, 1, b.T, b.H, b.Hkv, b.hd); },
        "attention_forward_ref", b.why);
    expect_invalid(
        [&] {
          detail::attention_backward_ref(p, p, p, p, p, p, p, p, p, 1, b.T, b.H, b.Hkv, b.hd);
        },
        "attention_backward_ref", b.why);
  }
  // [B, T, C] wrappers: C % H != 0, H = 0, C = 0.
  for (auto [C, H] : {std::pair<int64_t, int64_t>{6, 4}, {8, 0}, {0, 2}}) {
    expect_invalid([&] { attention_forward(p, p, p, p, p, 1, 2, C, H); }, "attention_forward",
                   "C % H == 0");
    expect_invalid([&] { attention_backward(p, p, p, p, p, p, p, p, p, 1, 2, C, H); },
                   "attention_backward", "C % H == 0");
    expect_invalid([&] { detail::attention_forward_ref(p, p, p, p, p, 1, 2, C, H); },
                   "attention_forward_ref", "C % H == 0");
    expect_invalid([&] { detail::attention_backward_ref(p, p, p, p, p, p, p, p, p, 1, 2, C, H); },
                   "attention_backward_ref", "C % H == 0");
  }
  // B ≤ 0: nothing happens, no checks, no memory touched.
  attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 2, 4, 3, 8);
  attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                     nullptr, 0, 2, 4, 3, 8);
  detail::attention_forward_ref(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 2, 8, 2);
  detail::attention_backward_ref(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, nullptr, 0, 2, 8, 2);
  detail::attention_forward_ref(nullptr, nullptr, nullptr, nullptr, nullptr, -1, 2, 4, 2, 8);
  detail::attention_backward_ref(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, nullptr, -1, 2, 4, 2, 8);
}

}  // namespace
