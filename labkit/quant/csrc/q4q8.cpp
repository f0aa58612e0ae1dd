// labkit's int4 x int8 product: the kernel llama.cpp writes, written to be read.
//
//   y[m, n] = sum over blocks b of   dw[n,b] * dx[m,b] * sum_i qw[n,b,i] * qx[m,b,i]
//                                  + mw[n,b] * sx[m,b]
//
// Weights: GGUF's Q4_1 blocks of 32 (codes 0..15, a float16 step dw and minimum mw). Q4_0 runs
// through the same route with mw = -8 dw: not exact, since the offset goes through the fp16 sx
// (all-zero Q4_0 weights give outputs up to ~3e-4 where ggml_vec_dot_q4_0_q8_0, which subtracts
// 8 in integers, gives 0). Activations: each input row quantized once per pass to int8 per
// block of 32 (llama.cpp's Q8_1: dx = max|x| / 127, q = roundf(x * (1 / d)) with the float32 d,
// halves away from zero as ggml's reference quantize_row_q8_1_ref; its x86 SIMD quantizer rounds
// ties to even; sx = dx * sum q; dx and sx rounded to float16 as the block stores them).
//
// Layout. Weight rows are packed in groups of 16 (ROWS). For one group and one block the 16
// rows' 16 bytes (byte j holds code j in its low nibble, code j + 16 in its high one, as the file
// stores them) are interleaved in 4 chunks of 64 bytes: chunk c holds bytes 4c..4c+3 of row 0,
// then of row 1, ... so one 512-bit register holds 4 bytes of each of the 16 rows, one 32-bit
// lane per row. Unpacking a chunk (AND 0x0F, and shift right by 4) gives codes 4c..4c+3 and
// 16+4c..16+4c+3 of every row; each meets the 4 activation codes at the same offsets,
// broadcast to every lane, in one int8 dot-product instruction (vpdpbusd: 4 products of an
// unsigned and a signed byte added into each 32-bit lane). A block is unpacked once per pass
// and used for every input row (up to MAX_M at a time), which is what keeps a pass of k rows
// from costing k single-row passes.
//
// Exact by construction. The integer sums are exact. The float work for one output (m, n) is,
// block after block, acc = acc + isum * (dw * dx); acc = acc + mw * sx: the same IEEE single
// operations in the same order on every path (the file is built with -ffp-contract=off, so no
// multiply-add is fused), so a row's result does not depend on the other rows of the pass or on
// the instruction set, and `labkit.quant.q4q8.reference` (plain torch) equals it bit for bit.
#include "blocks.h"

#include <immintrin.h>

namespace labkit_kernels {
namespace {

constexpr int64_t GROUP_BYTES = ROWS * BLOCK / 2;  // 256 bytes of codes per group and block

// One group of 16 output rows for input rows m0 .. m0 + mc - 1, plain C++.
void group_portable(const Args& a, int64_t g, int64_t m0, int64_t mc) {
  float acc[MAX_M][ROWS] = {};
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* c = a.codes + (g * a.nb + b) * GROUP_BYTES;
    const c10::Half* dw = a.dw + (g * a.nb + b) * ROWS;
    const c10::Half* mw = a.mw + (g * a.nb + b) * ROWS;
    for (int64_t m = 0; m < mc; ++m) {
      const int64_t row = m0 + m;
      const int8_t* xq = a.q + row * a.K + b * BLOCK;
      const float d = a.dx[row * a.nb + b], s = a.sx[row * a.nb + b];
      for (int64_t r = 0; r < ROWS; ++r) {
        int32_t isum = 0;
        for (int64_t ch = 0; ch < 4; ++ch) {
          for (int64_t t = 0; t < 4; ++t) {
            const uint8_t byte = c[ch * 64 + r * 4 + t];
            const int64_t i = 4 * ch + t;
            isum += (byte & 0x0F) * xq[i] + (byte >> 4) * xq[i + 16];
          }
        }
        acc[m][r] = acc[m][r] + static_cast<float>(isum) * (static_cast<float>(dw[r]) * d);
        acc[m][r] = acc[m][r] + static_cast<float>(mw[r]) * s;
      }
    }
  }
  for (int64_t m = 0; m < mc; ++m)
    for (int64_t r = 0; r < ROWS; ++r) a.out[(m0 + m) * a.n_out + g * ROWS + r] = acc[m][r];
}

// The same with AVX2: 8 rows per 256-bit register, two halves per group; vpmaddubsw multiplies
// unsigned codes by signed activations into int16 pairs (a block's 16 products per pair stay
// under 15 * 127 * 16 = 30480, so the int16 sums cannot saturate), vpmaddwd adds the pairs.
__attribute__((target("avx2,f16c"))) void group_avx2(const Args& a, int64_t g, int64_t m0, int64_t mc) {
  __m256 acc[MAX_M][2];
  for (int64_t m = 0; m < mc; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* c = a.codes + (g * a.nb + b) * GROUP_BYTES;
    __m256i w[2][8];
    __m256 dw[2], mw[2];
    for (int h = 0; h < 2; ++h) {
      for (int ch = 0; ch < 4; ++ch) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + ch * 64 + h * 32));
        w[h][2 * ch] = _mm256_and_si256(raw, low);
        w[h][2 * ch + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      }
      dw[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.dw + (g * a.nb + b) * ROWS + 8 * h)));
      mw[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.mw + (g * a.nb + b) * ROWS + 8 * h)));
    }
    for (int64_t m = 0; m < mc; ++m) {
      const int64_t row = m0 + m;
      const int8_t* xq = a.q + row * a.K + b * BLOCK;
      const __m256 d = _mm256_set1_ps(a.dx[row * a.nb + b]), s = _mm256_set1_ps(a.sx[row * a.nb + b]);
      for (int h = 0; h < 2; ++h) {
        __m256i s16 = _mm256_setzero_si256();
        for (int ch = 0; ch < 4; ++ch) {
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[h][2 * ch], _mm256_set1_epi32(load4(xq + 4 * ch))));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[h][2 * ch + 1], _mm256_set1_epi32(load4(xq + 16 + 4 * ch))));
        }
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
        acc[m][h] = _mm256_add_ps(acc[m][h], _mm256_mul_ps(isum, _mm256_mul_ps(dw[h], d)));
        acc[m][h] = _mm256_add_ps(acc[m][h], _mm256_mul_ps(mw[h], s));
      }
    }
  }
  for (int64_t m = 0; m < mc; ++m)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(a.out + (m0 + m) * a.n_out + g * ROWS + 8 * h, acc[m][h]);
}

// One block's 32 integer products for the 16 rows: 8 vpdpbusd in two independent chains.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline __m512i isum512(const __m512i* w, const int8_t* xq,
                                                                              __m512i zero) {
  __m512i lo = zero, hi = zero;
  for (int ch = 0; ch < 4; ++ch) {
    lo = _mm512_dpbusd_epi32(lo, w[2 * ch], _mm512_set1_epi32(load4(xq + 4 * ch)));
    hi = _mm512_dpbusd_epi32(hi, w[2 * ch + 1], _mm512_set1_epi32(load4(xq + 16 + 4 * ch)));
  }
  return _mm512_add_epi32(lo, hi);
}

// acc + isum * (dw * dx), then + mw * sx: the fixed order of float operations.
__attribute__((target("avx512f"))) inline __m512 scale512(__m512 acc, __m512i isum, __m512 dw, __m512 mw, float dx,
                                                          float sx) {
  acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(dx))));
  return _mm512_add_ps(acc, _mm512_mul_ps(mw, _mm512_set1_ps(sx)));
}

// The same with AVX-512 VNNI: the 16 rows in one register, vpdpbusd adds 4 products per lane.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void group_avx512(const Args& a, int64_t g, int64_t m0,
                                                                         int64_t mc) {
  __m512 acc[MAX_M];
  for (int64_t m = 0; m < mc; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* c = a.codes + (g * a.nb + b) * GROUP_BYTES;
    __m512i w[8];
    for (int ch = 0; ch < 4; ++ch) {
      const __m512i raw = _mm512_loadu_si512(c + ch * 64);
      w[2 * ch] = _mm512_and_si512(raw, low);
      w[2 * ch + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.dw + (g * a.nb + b) * ROWS)));
    const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.mw + (g * a.nb + b) * ROWS)));
    // two input rows at a time: their dot-product chains are independent, so the core overlaps them
    const __m512i zero = _mm512_setzero_si512();
    int64_t m = 0;
    for (; m + 1 < mc; m += 2) {
      const __m512i s0 = isum512(w, a.q + (m0 + m) * a.K + b * BLOCK, zero);
      const __m512i s1 = isum512(w, a.q + (m0 + m + 1) * a.K + b * BLOCK, zero);
      acc[m] = scale512(acc[m], s0, dw, mw, a.dx[(m0 + m) * a.nb + b], a.sx[(m0 + m) * a.nb + b]);
      acc[m + 1] = scale512(acc[m + 1], s1, dw, mw, a.dx[(m0 + m + 1) * a.nb + b], a.sx[(m0 + m + 1) * a.nb + b]);
    }
    if (m < mc) {
      const __m512i s0 = isum512(w, a.q + (m0 + m) * a.K + b * BLOCK, zero);
      acc[m] = scale512(acc[m], s0, dw, mw, a.dx[(m0 + m) * a.nb + b], a.sx[(m0 + m) * a.nb + b]);
    }
  }
  for (int64_t m = 0; m < mc; ++m) _mm512_storeu_ps(a.out + (m0 + m) * a.n_out + g * ROWS, acc[m]);
}

}  // namespace

void q4_group(int64_t path, const Args& a, int64_t g, int64_t m0, int64_t mc) {
  if (path == AVX512_VNNI) return group_avx512(a, g, m0, mc);
  if (path == AVX2) return group_avx2(a, g, m0, mc);
  group_portable(a, g, m0, mc);
}

}  // namespace labkit_kernels
