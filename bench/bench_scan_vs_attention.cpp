// The SSD scan against the attention of the same config, in one process, interleaved
// (the target: "never slower than the attention of the same config"; docs/performance.md "The
// scan against the attention of the same config"). The machine this runs on is shared and
// noisy, so the two are timed alternately (A S S A per repetition) and the figure that counts
// is the median over repetitions of the per-repetition ratio scan / attention (each ratio from
// timings taken within a fraction of a second), next to the medians of each, both in wall-clock
// time and in the process's CPU time.
//
// Shapes: configs/nemotron-h-tiny.toml, laid out as the model lays them out
// (src/nn/mixer_mamba2.cpp, src/nn/mixer_attention.cpp):
//   scan:      B = 16, T = 256, H = 8, P = 64, G = 1, N = 64, Q = 64; x, B, C column slices of
//              the conv output xBC [B·T, 640], dt a column slice of in_proj's output
//              [B·T, 1160]; fwd = ssd_scan_forward, bwd = ssd_scan_backward;
//   attention: B = 16, T = 256, 4 query heads and 2 KV heads of 64 (q [B·T, 256], k, v
//              [B·T, 128]); fwd = attention_forward, bwd = attention_backward.
// The accumulating gradients are zeroed outside the timed region (as the mixers memset them
// before each backward). --batch B changes B of both (e.g. 1: every operand hot in cache).
//
//   ./build/bench_scan_vs_attention [--reps 15] [--threads 1,2] [--batch 16]
//   ./build/bench_scan_vs_attention --checksum
//
// --checksum prints FNV-1a hashes of every output of the fast scan (y, the workspace, dx, dB,
// dC, d_dt and the three parameter gradients) for a few shapes (the config's, T % Q != 0,
// P and N not multiples of 16, G = 2) and every kernel variant the CPU runs, at 1, 2 and 3
// threads, and of the scalar twin: comparing two builds' output shows whether a change kept
// the scan's results bit for bit.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "fp4/nn/layers.h"
#include "fp4/nn/ssm.h"

using namespace fp4::nn;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

struct ScanData {
  SsdDims d;
  int64_t ld, lddt;
  size_t R;
  std::vector<float> xbc, zx, dt_bias, A_log, D, dy, y, ws, dxbc, dzx, g1, g2, g3;
  explicit ScanData(SsdDims dd, uint32_t seed = 1)
      : d(dd), ld(d.H * d.P + 2 * d.G * d.N), lddt(2 * d.H * d.P + 2 * d.G * d.N + d.H),
        R(static_cast<size_t>(d.B * d.T)) {
    xbc = randn(R * ld, seed);
    zx = randn(R * lddt, seed + 1, 0.5f);
    dt_bias = randn(d.H, seed + 2, 0.5f, -2.0f);
    A_log = randn(d.H, seed + 3, 0.5f, 1.0f);
    D = randn(d.H, seed + 4);
    dy = randn(R * d.H * d.P, seed + 5);
    y.assign(R * d.H * d.P, 0.0f);
    ws.assign(static_cast<size_t>(ssd_workspace_floats(d)), 0.0f);
    dxbc.assign(R * ld, 0.0f);
    dzx.assign(R * lddt, 0.0f);
    g1.assign(d.H, 0.0f), g2.assign(d.H, 0.0f), g3.assign(d.H, 0.0f);
  }
  const float* dt() const { return zx.data() + lddt - d.H; }
  void zero_grads() {
    std::fill(dxbc.begin(), dxbc.end(), 0.0f);
    std::fill(dzx.begin(), dzx.end(), 0.0f);
    std::fill(g1.begin(), g1.end(), 0.0f);
    std::fill(g2.begin(), g2.end(), 0.0f);
    std::fill(g3.begin(), g3.end(), 0.0f);
  }
  bool twin = false;  // run the scalar twins (ssd_scan_*_ref) instead
  void fwd() {
    const float* x = xbc.data();
    (twin ? ssd_scan_forward_ref : ssd_scan_forward)(
        y.data(), ws.data(), x, ld, x + d.H * d.P, ld, x + d.H * d.P + d.G * d.N, ld, dt(),
        lddt, dt_bias.data(), A_log.data(), D.data(), d);
  }
  void bwd() {
    const float* x = xbc.data();
    float* dx = dxbc.data();
    (twin ? ssd_scan_backward_ref : ssd_scan_backward)(
        dx, dx + d.H * d.P, dx + d.H * d.P + d.G * d.N, dzx.data() + lddt - d.H, g1.data(),
        g2.data(), g3.data(), dy.data(), ws.data(), x, ld, x + d.H * d.P, ld,
        x + d.H * d.P + d.G * d.N, ld, dt(), lddt, dt_bias.data(), A_log.data(), D.data(), d);
  }
};

int64_t g_batch = 16;  // B of both (--batch)
struct AttnData {
  int64_t B = g_batch, T = 256, H = 4, Hkv = 2, hd = 64;
  size_t act = static_cast<size_t>(B * T * H * hd), kv = static_cast<size_t>(B * T * Hkv * hd);
  std::vector<float> q = randn(act, 11), k = randn(kv, 12), v = randn(kv, 13),
                     dout = randn(act, 14), out = std::vector<float>(act),
                     att = std::vector<float>(attention_scratch_floats(B, T, H)),
                     scratch = std::vector<float>(attention_scratch_floats(B, T, H)),
                     dq = std::vector<float>(act), dk = std::vector<float>(kv),
                     dv = std::vector<float>(kv);
  void zero_grads() {
    std::fill(dq.begin(), dq.end(), 0.0f);
    std::fill(dk.begin(), dk.end(), 0.0f);
    std::fill(dv.begin(), dv.end(), 0.0f);
  }
  void fwd() {
    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, Hkv, hd);
  }
  void bwd() {
    attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), q.data(),
                       k.data(), v.data(), att.data(), B, T, H, Hkv, hd);
  }
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t fnv(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int checksum() {
  const SsdDims shapes[] = {{16, 256, 8, 64, 1, 64, 64},
                            {2, 200, 4, 64, 2, 32, 64},
                            {2, 77, 4, 40, 2, 24, 32},
                            {1, 50, 2, 17, 1, 33, 7}};
  const struct {
    detail::SsmIsa isa;
    const char* name;
  } variants[] = {{detail::SsmIsa::kAvx512, "avx512"},
                  {detail::SsmIsa::kAvx2, "avx2"},
                  {detail::SsmIsa::kBase, "base"},
                  {detail::SsmIsa::kEmu16, "emu16"},
                  {detail::SsmIsa::kBase, "twin"}};
  for (const SsdDims& d : shapes)
    for (const auto& var : variants) {
      if (!detail::set_ssm_isa(var.isa)) continue;
      for (int th = 1; th <= 3; ++th) {
        omp_set_num_threads(th);
        ScanData s(d, 7);
        s.twin = std::strcmp(var.name, "twin") == 0;
        if (s.twin && th > 1) continue;
        // accumulate onto non-zero initial gradients (as the tests do)
        s.dxbc = randn(s.dxbc.size(), 21);
        s.dzx = randn(s.dzx.size(), 22);
        s.g1 = randn(d.H, 23), s.g2 = randn(d.H, 24), s.g3 = randn(d.H, 25);
        s.fwd();
        s.bwd();
        std::printf("B=%ld T=%ld H=%ld P=%ld G=%ld N=%ld Q=%ld %-6s threads=%d  y %016lx ws %016lx "
                    "dxbc %016lx d_dt %016lx dA %016lx dD %016lx dbias %016lx\n",
                    (long)d.B, (long)d.T, (long)d.H, (long)d.P, (long)d.G, (long)d.N, (long)d.Q,
                    var.name, th, (unsigned long)fnv(s.y), (unsigned long)fnv(s.ws),
                    (unsigned long)fnv(s.dxbc), (unsigned long)fnv(s.dzx),
                    (unsigned long)fnv(s.g1), (unsigned long)fnv(s.g2), (unsigned long)fnv(s.g3));
      }
    }
  detail::reset_ssm_isa();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  int64_t bsz = 16;
  std::vector<int> threads = {1, 2};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--checksum") return checksum();
    if (a == "--batch" && i + 1 < argc) {
      bsz = std::atoi(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads.clear();
      for (const char* p = argv[++i]; *p;) {
        threads.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--threads 1,2] [--batch B] | --checksum\n",
                   argv[0]);
      return 2;
    }
  }
  g_batch = bsz;
  ScanData s(SsdDims{bsz, 256, 8, 64, 1, 64, 64});
  AttnData at;
  // Each measurement: wall-clock ms and the process's CPU ms (CLOCK_PROCESS_CPUTIME_ID, all
  // threads; on a loaded machine the CPU time is the steadier figure at 1 thread, since it
  // does not count the time slices given to other processes; at 2 threads it also counts the
  // OpenMP threads' spin-waits).
  struct Tm {
    double wall, cpu;
  };
  auto stamp = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return Tm{now_ms(), 1e3 * static_cast<double>(ts.tv_sec) +
                            1e-6 * static_cast<double>(ts.tv_nsec)};
  };
  for (const int th : threads) {
    omp_set_num_threads(th);
    // [0] wall, [1] cpu; f = forward, b = backward, per block
    std::vector<double> sf[2], sb[2], st[2], af[2], ab[2], att[2], ratio[2];
    auto run = [&](auto& m, std::vector<double>* f, std::vector<double>* b,
                   std::vector<double>* fb) {
      m.zero_grads();
      const Tm t0 = stamp();
      m.fwd();
      const Tm t1 = stamp();
      m.bwd();
      const Tm t2 = stamp();
      const double v[2][2] = {{t1.wall - t0.wall, t2.wall - t1.wall},
                              {t1.cpu - t0.cpu, t2.cpu - t1.cpu}};
      for (int k = 0; k < 2; ++k) {
        f[k].push_back(v[k][0]), b[k].push_back(v[k][1]), fb[k].push_back(v[k][0] + v[k][1]);
      }
    };
    {  // warm-up (page faults, thread scratch), not recorded
      std::vector<double> w[2], x[2], y[2];
      run(s, w, x, y), run(at, w, x, y);
    }
    for (int r = 0; r < reps; ++r) {  // A S S A
      run(at, af, ab, att);
      run(s, sf, sb, st);
      run(s, sf, sb, st);
      run(at, af, ab, att);
      for (int k = 0; k < 2; ++k) {
        const size_t n = st[k].size();
        ratio[k].push_back((st[k][n - 1] + st[k][n - 2]) / (att[k][n - 1] + att[k][n - 2]));
      }
    }
    std::printf("threads=%d reps=%d (medians over %d runs each, ms per block)\n", th, reps,
                2 * reps);
    for (int k = 0; k < 2; ++k) {
      std::printf(" %s\n", k == 0 ? "wall-clock" : "process CPU time");
      std::printf("  scan       fwd %7.2f  bwd %7.2f  fwd+bwd %7.2f\n", median(sf[k]),
                  median(sb[k]), median(st[k]));
      std::printf("  attention  fwd %7.2f  bwd %7.2f  fwd+bwd %7.2f\n", median(af[k]),
                  median(ab[k]), median(att[k]));
      std::sort(ratio[k].begin(), ratio[k].end());
      std::printf("  scan / attention (fwd+bwd): median of per-repetition ratios %.3f "
                  "(min %.3f, max %.3f); ratio of medians %.3f\n",
                  median(ratio[k]), ratio[k].front(), ratio[k].back(),
                  median(st[k]) / median(att[k]));
    }
  }
  return 0;
}
