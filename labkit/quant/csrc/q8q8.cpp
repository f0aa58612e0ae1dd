// labkit's int8 x int8 product: GGUF's Q8_0 weights (SmolLM2's tied embedding, read as its LM head).
//
//   y[m, n] = sum over blocks b of dw[n,b] * dx[m,b] * sum_i qw[n,b,i] * qx[m,b,i]
//
// Weights: blocks of 32 int8 codes and a float16 step, as the file stores them. Activations: the
// same Q8 codes as the int4 kernel's (blocks.h). Layout: for one group of 16 rows and one block,
// 8 chunks of 64 bytes, chunk c holding bytes 4c..4c+3 of each of the 16 rows (one 32-bit lane
// per row). Both operands are signed here, and the int8 dot-product instructions multiply an
// unsigned byte by a signed one:
//   AVX-512 VNNI  w + 128 is a byte in 0..255 (flip the top bit): sum (w + 128) x = sum w x + 128 sum x,
//                 and sum x (the block's integer sum of activation codes) is known, so subtract it;
//   AVX2          |w| times x with w's sign moved onto x (vpsignb): each int16 pair stays under
//                 2 * 128 * 127 = 32512, so vpmaddubsw cannot saturate; vpmaddwd widens each chunk.
// Float work per block, in block order, for every path: acc = acc + isum * (dw * dx), so the result
// equals `labkit.quant.q4q8.reference_q8` bit for bit and does not depend on the other rows.
#include "blocks.h"

#include <immintrin.h>

namespace labkit_kernels {
namespace {

constexpr int64_t CHUNKS = BLOCK / 4;               // 8 chunks of 4 codes per row and block
constexpr int64_t GROUP_BYTES = ROWS * BLOCK;       // 512 bytes of codes per group and block

void group_portable(const Args& a, int64_t g, int64_t m0, int64_t mc) {
  float acc[MAX_M][ROWS] = {};
  for (int64_t b = 0; b < a.nb; ++b) {
    const int8_t* c = reinterpret_cast<const int8_t*>(a.codes) + (g * a.nb + b) * GROUP_BYTES;
    const c10::Half* dw = a.dw + (g * a.nb + b) * ROWS;
    for (int64_t m = 0; m < mc; ++m) {
      const int64_t row = m0 + m;
      const int8_t* xq = a.q + row * a.K + b * BLOCK;
      const float d = a.dx[row * a.nb + b];
      for (int64_t r = 0; r < ROWS; ++r) {
        int32_t isum = 0;
        for (int64_t ch = 0; ch < CHUNKS; ++ch)
          for (int64_t t = 0; t < 4; ++t) isum += c[ch * 64 + r * 4 + t] * xq[4 * ch + t];
        acc[m][r] = acc[m][r] + static_cast<float>(isum) * (static_cast<float>(dw[r]) * d);
      }
    }
  }
  for (int64_t m = 0; m < mc; ++m)
    for (int64_t r = 0; r < ROWS; ++r) a.out[(m0 + m) * a.n_out + g * ROWS + r] = acc[m][r];
}

__attribute__((target("avx2,f16c"))) void group_avx2(const Args& a, int64_t g, int64_t m0, int64_t mc) {
  __m256 acc[MAX_M][2];
  for (int64_t m = 0; m < mc; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* c = a.codes + (g * a.nb + b) * GROUP_BYTES;
    __m256i w[2][CHUNKS], wabs[2][CHUNKS];
    __m256 dw[2];
    for (int h = 0; h < 2; ++h) {
      for (int ch = 0; ch < CHUNKS; ++ch) {
        w[h][ch] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + ch * 64 + h * 32));
        wabs[h][ch] = _mm256_abs_epi8(w[h][ch]);
      }
      dw[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.dw + (g * a.nb + b) * ROWS + 8 * h)));
    }
    for (int64_t m = 0; m < mc; ++m) {
      const int64_t row = m0 + m;
      const int8_t* xq = a.q + row * a.K + b * BLOCK;
      const __m256 d = _mm256_set1_ps(a.dx[row * a.nb + b]);
      for (int h = 0; h < 2; ++h) {
        __m256i isum = _mm256_setzero_si256();
        for (int ch = 0; ch < CHUNKS; ++ch) {
          const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(load4(xq + 4 * ch)), w[h][ch]);
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[h][ch], x), ones));
        }
        acc[m][h] = _mm256_add_ps(acc[m][h], _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw[h], d)));
      }
    }
  }
  for (int64_t m = 0; m < mc; ++m)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(a.out + (m0 + m) * a.n_out + g * ROWS + 8 * h, acc[m][h]);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void group_avx512(const Args& a, int64_t g, int64_t m0,
                                                                         int64_t mc) {
  __m512 acc[MAX_M];
  for (int64_t m = 0; m < mc; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* c = a.codes + (g * a.nb + b) * GROUP_BYTES;
    __m512i w[CHUNKS];
    for (int ch = 0; ch < CHUNKS; ++ch) w[ch] = _mm512_xor_si512(_mm512_loadu_si512(c + ch * 64), top);  // w + 128
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.dw + (g * a.nb + b) * ROWS)));
    for (int64_t m = 0; m < mc; ++m) {
      const int64_t row = m0 + m;
      const int8_t* xq = a.q + row * a.K + b * BLOCK;
      __m512i lo = _mm512_set1_epi32(-128 * a.xsum[row * a.nb + b]), hi = _mm512_setzero_si512();
      for (int ch = 0; ch < CHUNKS; ch += 2) {
        lo = _mm512_dpbusd_epi32(lo, w[ch], _mm512_set1_epi32(load4(xq + 4 * ch)));
        hi = _mm512_dpbusd_epi32(hi, w[ch + 1], _mm512_set1_epi32(load4(xq + 4 * ch + 4)));
      }
      const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
      acc[m] = _mm512_add_ps(acc[m], _mm512_mul_ps(isum, _mm512_mul_ps(dw, _mm512_set1_ps(a.dx[row * a.nb + b]))));
    }
  }
  for (int64_t m = 0; m < mc; ++m) _mm512_storeu_ps(a.out + (m0 + m) * a.n_out + g * ROWS, acc[m]);
}

}  // namespace

void q8_group(int64_t path, const Args& a, int64_t g, int64_t m0, int64_t mc) {
  if (path == AVX512_VNNI) return group_avx512(a, g, m0, mc);
  if (path == AVX2) return group_avx2(a, g, m0, mc);
  group_portable(a, g, m0, mc);
}

}  // namespace labkit_kernels
