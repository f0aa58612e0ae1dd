// What the block kernels share: the instruction-set paths, the activations' int8 codes, the arguments.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace labkit_kernels {

constexpr int64_t BLOCK = 32;  // codes per block, weights and activations alike
constexpr int64_t ROWS = 16;   // output rows per packed group
constexpr int64_t MAX_M = 16;  // input rows per unpack of a block

enum Path : int64_t { PORTABLE = 0, AVX2 = 1, AVX512_VNNI = 2 };

inline bool cpu_has(int64_t path) {
  if (path == PORTABLE) return true;
  __builtin_cpu_init();
  if (path == AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (path == AVX512_VNNI)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
  return false;
}

inline float to_half_and_back(float v) { return static_cast<float>(c10::Half(v)); }

// Q8_1 codes of x [M, K]: q [M, K] int8, dx and sx [M, K / 32] (float16 values held in float), and
// each block's integer sum of codes xsum [M, K / 32].
inline void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* dx, float* sx, int32_t* xsum) {
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
      TORCH_CHECK_VALUE(finite, "x contains NaN or inf (row ", m, ", block ", b,
                        "); 8-bit activation codes need finite inputs");
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
}

struct Args {
  const uint8_t* codes;    // [groups, nb, chunks, ROWS, 4]
  const c10::Half* dw;     // [groups, nb, ROWS]
  const c10::Half* mw;     // [groups, nb, ROWS] (Q4_1), unused for Q8_0
  const int8_t* q;         // [M, K]
  const float* dx;         // [M, nb]
  const float* sx;         // [M, nb]
  const int32_t* xsum;     // [M, nb]
  float* out;              // [M, groups * ROWS]
  int64_t M, K, nb, n_out;
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
