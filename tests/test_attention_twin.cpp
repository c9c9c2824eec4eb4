// Bit-for-bit twin test of the causal attention kernels (src/nn/attention.cpp) against their
// plain scalar reference (src/nn/attention_ref.cpp, fp4::nn::detail::attention_*_ref).
// Every micro-kernel variant this CPU can run (AVX-512, AVX2, baseline SSE2 "scalar twin"),
// forced with detail::set_attention_isa, with 1 and 2 OpenMP threads, must reproduce the
// reference's forward output, att probabilities, and backward dq, dk, dv (accumulated onto
// random initial gradients) and scratch (dS) exactly (memcmp), on random normal inputs over
// many shapes (T not a multiple of the micro-kernel's row block (8 on AVX-512, 4 otherwise) or
// of its 16/32-column block, T = 1 and T = 300, head sizes 1 to 100, so hd is not a multiple
// of 16 or needs a 16-column tail after 32-column blocks, several B·H) and on adversarial
// inputs: logits of ±1e4 (exp underflows), tied scores, exact and signed zeros, subnormals, a
// single huge element, infinities (which must not leak across the causal mask), and scores
// chosen so that the softmax's exp sees ~33k distinct arguments across [−110, 0] (the
// vector exp must match internal::exp_scalar bit for bit).
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

using namespace fp4::nn;
using detail::AttentionIsa;

namespace {

struct Shape {
  int64_t B, T, C, H;
  size_t act() const { return static_cast<size_t>(B * T * C); }
  size_t att() const { return static_cast<size_t>(B * H * T * T); }
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " hd=" + std::to_string(C / H);
  }
};

// Shape from (B, T, H, hd).
Shape shape(int64_t B, int64_t T, int64_t H, int64_t hd) { return Shape{B, T, H * hd, H}; }

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
  in.k = randn(s.act(), g);
  in.v = randn(s.act(), g);
  in.dout = randn(s.act(), g);
  in.dq0 = randn(s.act(), g);
  in.dk0 = randn(s.act(), g);
  in.dv0 = randn(s.act(), g);
  return in;
}

// A quiet NaN with a payload no kernel produces: any element left unwritten shows up.
float sentinel() {
  const uint32_t bits = 0x7FC0BEEFu;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

using FwdFn = void (*)(float*, float*, const float*, const float*, const float*, int64_t,
                       int64_t, int64_t, int64_t);
using BwdFn = void (*)(float*, float*, float*, float*, const float*, const float*,
                       const float*, const float*, const float*, int64_t, int64_t, int64_t,
                       int64_t);

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
  fwd(o.out.data(), o.att.data(), in.q.data(), in.k.data(), in.v.data(), s.B, s.T, s.C, s.H);
  const std::vector<float>& att = att_in ? *att_in : o.att;
  bwd(o.dq.data(), o.dk.data(), o.dv.data(), o.scratch.data(), in.dout.data(), in.q.data(),
      in.k.data(), in.v.data(), att.data(), s.B, s.T, s.C, s.H);
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
};
constexpr Variant kVariants[] = {{AttentionIsa::kAvx512, "avx512"},
                                 {AttentionIsa::kAvx2, "avx2"},
                                 {AttentionIsa::kScalarTwin, "sse2 (scalar twin)"}};

class AttentionTwin : public ::testing::Test {
 protected:
  void SetUp() override { saved_threads_ = omp_get_max_threads(); }
  void TearDown() override {
    detail::set_attention_isa(AttentionIsa::kAuto);
    omp_set_num_threads(saved_threads_);
  }

  // Reference once, then every supported variant with 1 and 2 threads, all bit for bit.
  // Returns the reference outputs for extra checks.
  Outputs check(const std::string& what, const Shape& s, const Inputs& in) {
    SCOPED_TRACE(what + " [" + s.str() + "]");
    const Outputs ref =
        run(detail::attention_forward_ref, detail::attention_backward_ref, s, in, nullptr);
    int ran = 0;
    for (const Variant& var : kVariants) {
      if (!detail::set_attention_isa(var.isa)) continue;  // CPU lacks it
      ++ran;
      for (int threads : {1, 2}) {
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
    EXPECT_GE(ran, 1);  // the baseline variant runs everywhere
    return ref;
  }

  // The adversarial cases run on these shapes (the last is big enough for the parallel path).
  std::vector<Shape> adversarial_shapes() const {
    return {shape(1, 1, 1, 8), shape(2, 5, 3, 8),   shape(1, 17, 1, 64), shape(2, 37, 2, 24),
            shape(2, 37, 2, 64), shape(1, 77, 2, 48)};
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
      in.k[static_cast<size_t>((1 + 7 * n + h) * s.C + h)] = specials[n];
  }
  check("exp arguments", s, in);
}

TEST_F(AttentionTwin, HugeLogitsUnderflow) {
  // q, k ~ N(0, 100²): scores ~ ±1e4, so exp(s − m) underflows to +0 for almost every j and
  // the backward sees exact zeros in P (and signed zeros in dS).
  check_adversarial("huge logits", [](const Shape& s, Inputs& in, std::mt19937& g) {
    in.q = randn(s.act(), g, 100.0f);
    in.k = randn(s.act(), g, 100.0f);
  });
}

TEST_F(AttentionTwin, TiedScores) {
  // All rows of q equal and all rows of k equal: every score in a row is the same value
  // (exact ties for the max, P uniform 1/(i+1)).
  check_adversarial("tied scores", [](const Shape& s, Inputs& in, std::mt19937& g) {
    const auto qrow = randn(static_cast<size_t>(s.C), g), krow = randn(static_cast<size_t>(s.C), g);
    for (size_t t = 0; t < static_cast<size_t>(s.B * s.T); ++t)
      for (size_t c = 0; c < static_cast<size_t>(s.C); ++c) {
        in.q[t * s.C + c] = qrow[c];
        in.k[t * s.C + c] = krow[c];
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
    in.k = randn(s.act(), g, 1e-39f);
    in.v = randn(s.act(), g, 1e-39f);
    in.dout = randn(s.act(), g, 1e-39f);
    in.dq0 = randn(s.act(), g, 1e-39f);
    std::uniform_int_distribution<size_t> idx(0, s.act() - 1);
    for (int n = 0; n < 8; ++n) in.v[idx(g)] = 1.0f;
  });
  // Subnormal v and dout against ordinary q, k: P ordinary, P·v subnormal or ±0.
  check_adversarial("subnormal v/dout", [](const Shape& s, Inputs& in, std::mt19937& g) {
    in.v = randn(s.act(), g, 1e-41f);
    in.dout = randn(s.act(), g, 1e-41f);
  });
}

TEST_F(AttentionTwin, OneHugeElement) {
  // A single huge element in one input (finite results): the row it lands in is one-hot,
  // and large-magnitude terms dominate (and absorb) the others in the sums.
  for (int which = 0; which < 4; ++which) {
    const char* names[] = {"huge q element", "huge k element", "huge v element",
                           "huge dout element"};
    check_adversarial(names[which], [which](const Shape& s, Inputs& in, std::mt19937& g) {
      std::uniform_int_distribution<size_t> idx(0, s.act() - 1);
      std::vector<float>* target[] = {&in.q, &in.k, &in.v, &in.dout};
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
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t c = 0; c < s.C; c += 3)
          (*target[which])[(b * s.T + j) * s.C + c] = c % 2 ? -inf : inf;
      const char* names[] = {"v", "k", "q", "dout"};
      const Outputs ref =
          check(std::string("inf in ") + names[which] + " at token " + std::to_string(j), s, in);
      // Causality of the reference (and so of every variant that matched it): rows before
      // token j never see it in out or dq, and rows after it get no dk (inf q) / dv (inf
      // dout) contribution from it.
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t t = 0; t < s.T; ++t)
          for (int64_t c = 0; c < s.C; ++c) {
            const size_t e = static_cast<size_t>((b * s.T + t) * s.C + c);
            if (t < j) {
              ASSERT_TRUE(std::isfinite(ref.out[e])) << "out row " << t << ", inf token " << j;
              ASSERT_TRUE(std::isfinite(ref.dq[e])) << "dq row " << t << ", inf token " << j;
            } else if (t > j && which >= 2) {  // inf v / k at j reach every later row
              ASSERT_TRUE(std::isfinite(ref.dk[e])) << "dk row " << t << ", inf token " << j;
              ASSERT_TRUE(std::isfinite(ref.dv[e])) << "dv row " << t << ", inf token " << j;
            }
          }
    }
  }
}

TEST_F(AttentionTwin, ReferenceContract) {
  // Same argument checks as the kernels; B = 0 is a no-op.
  std::vector<float> buf(64, 0.0f);
  EXPECT_THROW(detail::attention_forward_ref(buf.data(), buf.data(), buf.data(), buf.data(),
                                             buf.data(), 1, 2, 6, 4),
               std::invalid_argument);
  EXPECT_THROW(detail::attention_backward_ref(buf.data(), buf.data(), buf.data(), buf.data(),
                                              buf.data(), buf.data(), buf.data(), buf.data(),
                                              buf.data(), 1, 2, 6, 4),
               std::invalid_argument);
  detail::attention_forward_ref(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 2, 8, 2);
  detail::attention_backward_ref(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, nullptr, 0, 2, 8, 2);
}

}  // namespace
