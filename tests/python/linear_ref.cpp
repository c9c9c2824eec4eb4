// fp4_linear_ref: the C++ Linear (fp4/nn/linear.h) run directly, as the model runs it, for the
// bit-exactness test of fp4train.torch.Linear (tests/python/test_torch_linear.py): an
// independent harness, not the Python binding.
// Usage: fp4_linear_ref RECIPE.toml M K N LAYER SEED STEPS DIR
// Reads DIR/{x,w,dy}_<s>.f32 (raw float32: X [M, K], W [N, K], dY [M, N]) for steps s = 1..STEPS;
// at each step binds W, runs forward(X) and backward(dY) with StepContext{step s, seed} and
// writes DIR/{y,dx,dw}_<s>.ref.f32 (dX and dW start from zero each step).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "fp4/nn/linear.h"
#include "fp4/recipe/recipe.h"

namespace {
std::vector<float> read_f32(const std::string& f, size_t n) {
  std::vector<float> v(n);
  std::ifstream in(f, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float))))
    throw std::runtime_error("cannot read " + std::to_string(n) + " floats from " + f);
  return v;
}
void write_f32(const std::string& f, const float* p, size_t n) {
  std::ofstream out(f, std::ios::binary);
  out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + f);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 9) {
    std::cerr << "usage: fp4_linear_ref RECIPE.toml M K N LAYER SEED STEPS DIR\n";
    return 2;
  }
  try {
    const fp4::Recipe r = fp4::load_recipe_file(argv[1]);
    const int64_t M = std::atoll(argv[2]), K = std::atoll(argv[3]), N = std::atoll(argv[4]);
    const int layer = std::atoi(argv[5]);
    const uint64_t seed = std::strtoull(argv[6], nullptr, 10);
    const int steps = std::atoi(argv[7]);
    const std::string dir = argv[8];
    std::vector<float> W(static_cast<size_t>(N * K)), dW(W.size()), Y(static_cast<size_t>(M * N)),
        dX(static_cast<size_t>(M * K));
    fp4::nn::Linear lin(layer, K, N, fp4::LinearPlan::uniform(r, r.mode));
    lin.bind(W.data(), dW.data());
    for (int s = 1; s <= steps; ++s) {
      const std::string t = "_" + std::to_string(s);
      const std::vector<float> X = read_f32(dir + "/x" + t + ".f32", static_cast<size_t>(M * K));
      const std::vector<float> Ws = read_f32(dir + "/w" + t + ".f32", W.size());
      std::copy(Ws.begin(), Ws.end(), W.begin());  // into the bound buffer (its address stays)
      const std::vector<float> dY = read_f32(dir + "/dy" + t + ".f32", Y.size());
      fp4::nn::StepContext ctx;
      ctx.step = s;
      ctx.seed = seed;
      lin.forward(X.data(), Y.data(), M, ctx);
      std::fill(dX.begin(), dX.end(), 0.f);
      std::fill(dW.begin(), dW.end(), 0.f);
      lin.backward(dY.data(), dX.data(), M, ctx);
      write_f32(dir + "/y" + t + ".ref.f32", Y.data(), Y.size());
      write_f32(dir + "/dx" + t + ".ref.f32", dX.data(), dX.size());
      write_f32(dir + "/dw" + t + ".ref.f32", dW.data(), dW.size());
    }
  } catch (const std::exception& e) {
    std::cerr << "fp4_linear_ref: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
