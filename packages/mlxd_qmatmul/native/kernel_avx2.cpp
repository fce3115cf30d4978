// AVX2 + FMA kernel (8 float lanes); this file alone is compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include "kernel.h"

namespace {

struct Ops {
  using F = __m256;
  static constexpr int V = 8;
  static float half(uint16_t h) { return _cvtsh_ss(h); }  // F16C
  static void halves16(const uint16_t* in, float* out) {
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in))));
    _mm256_storeu_ps(out + 8, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 8))));
  }
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F splat(float s) { return _mm256_set1_ps(s); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  struct Group {
    F scale, bias;
  };
  static Group group(float s, float b) { return {splat(s), splat(b)}; }
  static void nibbles(const Group& g, const uint8_t* p, F& lo, F& hi) {
    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15))), g.scale, g.bias);
    hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), g.scale, g.bias);
  }
  static F bytes(const Group& g, const uint8_t* p) {
    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), g.scale, g.bias);
  }
};

#include "kernel_tiles.inc"

}  // namespace

namespace mlxd_qmm {
void kernel_avx2(const Problem& p, int n0, int n1) {
  kernel_entry(p, n0, n1);
}
}  // namespace mlxd_qmm
