// What the block kernels share: the instruction-set paths, the activations' int8 codes, the arguments.
// Plain C++ with no torch in it: ops.cpp is the torch layer over it, and tests/kernels/test_blocks.cpp drives the
// same code with no torch at all, natively and for ARM under qemu (make test-arm).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__aarch64__)
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#endif

namespace labkit_kernels {

constexpr int64_t BLOCK = 32;  // codes per block, weights and activations alike
constexpr int64_t ROWS = 16;   // output rows per packed group
constexpr int64_t MAX_M = 16;  // input rows per unpack of a block

// The paths, in labkit.quant.native.PATHS's order. A path is compiled only for its architecture.
enum Path : int64_t { PORTABLE = 0, AVX2 = 1, AVX512_VNNI = 2, NEON_DOTPROD = 3 };
constexpr int64_t N_PATHS = 4;

inline bool cpu_has(int64_t path) {
  if (path == PORTABLE) return true;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (path == AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (path == AVX512_VNNI)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
#elif defined(__aarch64__)
  if (path == NEON_DOTPROD) {  // Armv8.2's SDOT (vdotq_s32): 4 int8 products added into each int32 lane
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int has = 0;
    size_t size = sizeof(has);
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &has, &size, nullptr, 0) == 0 && has;
#endif
  }
#endif
  return false;
}

// IEEE float16 <-> float32, bit for bit what c10::Half (and ggml's GGML_FP16_TO_FP32 / GGML_FP32_TO_FP16) give:
// the weights' steps are stored as float16 bits (uint16_t), and the activations' dx, sx rounded through float16.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0 && man == 0) {
    bits = sign;
  } else if (exp == 0) {  // subnormal: shift the mantissa up to a leading 1
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3FF) << 13);
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {  // round to nearest, ties to even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000, abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<uint16_t>(sign | (abs > 0x7F800000u ? 0x7E00 : 0x7C00));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00);  // from 65520 up: rounds to inf
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal, a multiple of 2^-24 (the product by 2^24 is exact)
    float a;
    std::memcpy(&a, &abs, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t h = (((abs >> 23) - 112) << 10) | ((abs & 0x7FFFFF) >> 13);
  const uint32_t rest = abs & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is the right answer
  return static_cast<uint16_t>(sign | h);
}

inline float to_half_and_back(float v) { return half_to_float(float_to_half(v)); }

// Q8_1 codes of x [M, K]: q [M, K] int8, dx and sx [M, K / 32] (float16 values held in float), and
// each block's integer sum of codes xsum [M, K / 32]. Returns -1, or the index m * nb + b of the first block
// that holds NaN or inf (the torch layer says so; codes of such a block would be meaningless).
inline int64_t quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* dx, float* sx, int32_t* xsum) {
  const int64_t nb = K / BLOCK;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * BLOCK;
      float amax = 0.0f;
      bool finite = true;
      for (int64_t i = 0; i < BLOCK; ++i) {
        finite = finite && std::isfinite(xb[i]);
        amax = std::max(amax, std::fabs(xb[i]));
      }
      if (!finite) return m * nb + b;
      const float d = amax / 127.0f;
      const float id = d > 0.0f ? 1.0f / d : 0.0f;
      int32_t sum = 0;
      for (int64_t i = 0; i < BLOCK; ++i) {
        // halves away from zero, as ggml's reference quantizer (quantize_row_q8_1_ref: id = 1/d, roundf);
        // llama.cpp's x86 SIMD quantizer (quantize_row_q8_1) rounds ties to even with id = 127/amax, so its
        // codes can differ from these by one on exact ties
        int32_t r = static_cast<int32_t>(std::roundf(xb[i] * id));
        r = std::min(127, std::max(-127, r));
        q[m * K + b * BLOCK + i] = static_cast<int8_t>(r);
        sum += r;
      }
      // dx and sx rounded to fp16 as Q8_1's block stores them (llama.cpp has the same limits): a block whose
      // d*sum(q) passes 65,504 makes sx inf (every output of the row -inf or NaN), amax above ~8.3e6 makes dx
      // inf, and below ~1e-4 dx is fp16-subnormal (percent-level error; 0 under ~3.8e-6). Not checked here.
      dx[m * nb + b] = to_half_and_back(d);
      sx[m * nb + b] = to_half_and_back(d * static_cast<float>(sum));
      xsum[m * nb + b] = sum;
    }
  }
  return -1;
}

struct Args {
  const uint8_t* codes;    // [groups, nb, chunks, ROWS, 4]
  const uint16_t* dw;      // [groups, nb, ROWS] float16 bits
  const uint16_t* mw;      // [groups, nb, ROWS] float16 bits (Q4_1), unused for Q8_0
  const int8_t* q;         // [M, K]
  const float* dx;         // [M, nb]
  const float* sx;         // [M, nb]
  const int32_t* xsum;     // [M, nb]
  float* out;              // [M, groups * ROWS]
  int64_t M, K, nb, n_out;
  const float* dw32 = nullptr;  // float32 steps and minimums in place of dw, mw (the int4 kernel: a K-quant's
  const float* mw32 = nullptr;  // d·sc and dmin·m, exact in float32, not in float16), same layout
};

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// One group of 16 output rows g, input rows m0 .. m0 + mc - 1 (mc <= MAX_M), on `path`.
void q4_group(int64_t path, const Args& a, int64_t g, int64_t m0, int64_t mc);  // Q4_1 x Q8_1 (q4q8.cpp)
void q8_group(int64_t path, const Args& a, int64_t g, int64_t m0, int64_t mc);  // Q8_0 x Q8_0 (q8q8.cpp)

}  // namespace labkit_kernels
