// The block kernels' arithmetic with no torch: every path this CPU runs against a plain reference written here,
// bit for bit, on random and adversarial blocks. Built and run by scripts/test_arm.sh (make test-arm): natively,
// and cross-compiled for ARM under qemu (-cpu max: the NEON dot product; -cpu cortex-a53: portable only).
#include "../../labkit/quant/csrc/blocks.h"

#include <cstdio>
#include <random>
#include <vector>

using namespace labkit_kernels;

namespace {

const char* NAMES[N_PATHS] = {"portable", "avx2", "avx512-vnni", "neon-dotprod"};

struct Case {
  const char* what;
  int64_t M, groups, nb;
  int kind;  // 0 random, 1 activation ties (.5 steps), 2 all zero, 3 all equal, 4 extremes, 5 tiny steps
};

// y[m, n] as the header comment of q4q8.cpp / q8q8.cpp states it, written from the formula
float reference(bool q4, const std::vector<uint8_t>& codes, const std::vector<float>& dw,
                const std::vector<float>& mw, const std::vector<int8_t>& q, const std::vector<float>& dx,
                const std::vector<float>& sx, int64_t nb, int64_t K, int64_t m, int64_t n) {
  const int64_t g = n / ROWS, r = n % ROWS;
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int64_t i = 0; i < BLOCK; ++i) {
      int32_t w;
      if (q4) {  // byte j of a row holds code j (low nibble) and code j + 16 (high); chunk c holds bytes 4c..4c+3
        const int64_t j = i % 16, byte = ((g * nb + b) * 4 + j / 4) * 64 + r * 4 + j % 4;
        w = i < 16 ? (codes[byte] & 0x0F) : (codes[byte] >> 4);
      } else {
        const int64_t byte = ((g * nb + b) * 8 + i / 4) * 64 + r * 4 + i % 4;
        w = static_cast<int8_t>(codes[byte]);
      }
      isum += w * q[m * K + b * BLOCK + i];
    }
    const int64_t s = (g * nb + b) * ROWS + r;
    acc = acc + static_cast<float>(isum) * (dw[s] * dx[m * nb + b]);
    if (q4) acc = acc + mw[s] * sx[m * nb + b];
  }
  return acc;
}

int run_case(const Case& c, std::mt19937& rng) {
  const int64_t K = c.nb * BLOCK, n_out = c.groups * ROWS;
  std::vector<float> x(c.M * K);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int64_t i = 0; i < c.M * K; ++i) {
    const int64_t blk = i / BLOCK;
    x[i] = c.kind == 0 ? u(rng)
         : c.kind == 1 ? (i % BLOCK == 0 ? 127.0f : static_cast<float>(static_cast<int>(i % 7) - 3) + 0.5f)
         : c.kind == 2 ? 0.0f
         : c.kind == 3 ? 1.25f
         : c.kind == 4 ? ((i + blk) % 2 ? 3.0e4f : -3.0e4f)
                       : u(rng) * 1e-6f;
  }
  int fails = 0;
  for (int q4 = 0; q4 < 2; ++q4) {
    const int64_t bytes = c.groups * c.nb * (q4 ? 4 : 8) * 64;
    std::vector<uint8_t> codes(bytes);
    std::vector<uint16_t> dw(c.groups * c.nb * ROWS), mw(dw.size());
    for (auto& v : codes) v = c.kind == 4 ? (q4 ? 0xF0 : 0x81) : c.kind == 2 ? 0 : static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> step(0.001f, 0.05f);
    for (size_t i = 0; i < dw.size(); ++i) {
      dw[i] = float_to_half(c.kind == 5 ? 3.0e-7f : step(rng));
      mw[i] = float_to_half(c.kind == 2 ? 0.0f : -step(rng) * 8.0f);
    }
    std::vector<int8_t> q(c.M * K);
    std::vector<float> dx(c.M * c.nb), sx(c.M * c.nb);
    std::vector<int32_t> xsum(c.M * c.nb);
    if (quantize_rows(x.data(), c.M, K, q.data(), dx.data(), sx.data(), xsum.data()) >= 0) {
      std::printf("FAIL %s: finite input reported as not finite\n", c.what);
      return 1;
    }
    // the steps as float16 bits, and (the int4 kernel) as float32 values float16 cannot hold (a K-quant's d·sc)
    std::vector<float> dwf(dw.size()), mwf(mw.size()), dw32(dw.size()), mw32(mw.size());
    for (size_t i = 0; i < dw.size(); ++i) {
      dwf[i] = half_to_float(dw[i]);
      mwf[i] = half_to_float(mw[i]);
      dw32[i] = dwf[i] * 1.0009765625f * static_cast<float>(1 + i % 63);  // 1 + 2^-10: off the float16 grid
      mw32[i] = mwf[i] * 0.9990234375f;
    }
    for (int f32 = 0; f32 < (q4 ? 2 : 1); ++f32) {
      for (int64_t path = 0; path < N_PATHS; ++path) {
        if (!cpu_has(path)) continue;
        std::vector<float> out(c.M * n_out, -1.0f);
        Args a{codes.data(), dw.data(), mw.data(), q.data(), dx.data(), sx.data(), xsum.data(), out.data(),
               c.M, K, c.nb, n_out};
        if (f32) {
          a.dw32 = dw32.data();
          a.mw32 = mw32.data();
          a.dw = a.mw = nullptr;
        }
        for (int64_t g = 0; g < c.groups; ++g)
          for (int64_t m0 = 0; m0 < c.M; m0 += MAX_M)
            (q4 ? q4_group : q8_group)(path, a, g, m0, std::min(MAX_M, c.M - m0));
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = 0; n < n_out; ++n) {
            const float want = reference(q4, codes, f32 ? dw32 : dwf, f32 ? mw32 : mwf, q, dx, sx, c.nb, K, m, n);
            const float got = out[m * n_out + n];
            if (std::memcmp(&want, &got, 4) != 0 && fails++ < 5)
              std::printf("FAIL %s %s%s path %s: y[%ld, %ld] = %.9g, reference %.9g\n", c.what, q4 ? "Q4_1" : "Q8_0",
                          f32 ? " (float32 steps)" : "", NAMES[path], static_cast<long>(m), static_cast<long>(n), got,
                          want);
          }
      }
    }
  }
  return fails;
}

int halves() {  // every finite float16 goes to float and back to itself; ties round to even
  int fails = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    if (float_to_half(half_to_float(static_cast<uint16_t>(h))) != h) ++fails;
  }
  const float tie = half_to_float(0x3C00) + std::ldexp(1.0f, -11);  // 1 + half a step: to even (1.0)
  if (float_to_half(tie) != 0x3C00 || float_to_half(65520.0f) != 0x7C00 || float_to_half(65519.0f) != 0x7BFF) ++fails;
  if (fails) std::printf("FAIL float16 conversions: %d\n", fails);
  return fails;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  const Case cases[] = {{"random", 5, 3, 4, 0},        {"a pass of 40 rows", 40, 2, 3, 0},
                        {"ties", 3, 2, 2, 1},          {"all zero", 4, 1, 2, 2},
                        {"all equal", 17, 2, 2, 3},    {"extremes", 16, 2, 8, 4},
                        {"tiny steps", 2, 1, 4, 5},    {"one row", 1, 4, 6, 0}};
  int fails = halves(), paths = 0;
  for (const Case& c : cases) fails += run_case(c, rng);
  std::printf("paths on this CPU:");
  for (int64_t p = 0; p < N_PATHS; ++p)
    if (cpu_has(p)) {
      std::printf(" %s", NAMES[p]);
      ++paths;
    }
  std::printf("\n%s: %zu cases x 3 kernels (Q4_1, Q4 with float32 steps, Q8_0) x %d paths, float16 conversions\n",
              fails ? "FAILED" : "ok",
              sizeof(cases) / sizeof(cases[0]), paths);
  return fails ? 1 : 0;
}
