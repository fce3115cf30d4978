// AVX-512 kernel (16 float lanes); this file alone is compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c.
#include <immintrin.h>

#include "aligned_floats.h"
#include "kernel.h"

namespace {

struct Ops {
  using F = __m512;
  static constexpr int V = 16;
  static float half(uint16_t h) { return _cvtsh_ss(h); }  // F16C
  static void halves16(const uint16_t* in, float* out) {
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in))));
  }
  // `count` float16 values widened, 16 at a time (the last ones masked).
  static void halves(const uint16_t* in, int64_t count, float* out) {
    int64_t i = 0;
    for (; i + 16 <= count; i += 16) halves16(in + i, out + i);
    if (i < count) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (count - i)) - 1);
      _mm512_mask_storeu_ps(out + i, mask, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, in + i)));
    }
  }
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F splat(float s) { return _mm512_set1_ps(s); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  // A group's 16 possible 4-bit weights (q * scale + bias for q = 0..15) sit in one register: a nibble
  // decodes with one permute, which reads only the low 4 bits of each lane (no mask, no conversion).
  struct Group {
    F table, scale, bias;
  };
  static Group group(float s, float b) {
    const F scale = splat(s), bias = splat(b);
    const F q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return {_mm512_fmadd_ps(q, scale, bias), scale, bias};
  }
  static void nibbles(const Group& g, const uint8_t* p, F& lo, F& hi) {
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_permutexvar_ps(q, g.table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), g.table);
  }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  // The sums of 16 vectors in one vector, each by the very additions `hsum` makes (halves of 256, 128, 64 bits,
  // then the last pair), so each sum has the same bits as hsum's; four rounds of pairwise shuffles and adds in
  // place of 16 reductions. Lane L of the result is the sum of v[kSums16Input[L]]; a caller puts column L's
  // vector at index kSums16Input[L] to get the sums in column order.
  static F sums16(const F* v) {
    F t[8], u[4], w[2];
    for (int i = 0; i < 8; ++i)
      t[i] = add(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i)
      u[i] = add(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88), _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i)
      w[i] = add(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44), _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    return add(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
  }
  // Where sums16 takes the vector whose sum lands in lane L.
  static constexpr int kSums16Input[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  static void in_register(F& v) { __asm__("" : "+v"(v)); }
  template <int HALF>
  static F nibble_half(const Group& g, const uint8_t* p) {
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_permutexvar_ps(HALF == 0 ? q : _mm512_srli_epi32(q, 4), g.table);
  }
  static F bytes(const Group& g, const uint8_t* p) {
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), g.scale, g.bias);
  }
};

#define MLXD_SPLIT_TILES 1
#include "kernel_tiles.inc"

}  // namespace

namespace mlxd_qmm {
void kernel_avx512(const Problem& p, int n0, int n1) {
  kernel_entry(p, n0, n1);
}
}  // namespace mlxd_qmm
