// vector_math.h's AVX2 + FMA forms; this file alone (of vector_math) is compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "vector_math.h"

namespace mlxd_qmm::detail {

namespace {

// mlx/backend/cpu/simd/math.h's exp, eight floats at a time.
__m256 exp8(__m256 in) {
  __m256 x = _mm256_mul_ps(in, _mm256_set1_ps(1.442695f));
  const __m256 ipart = _mm256_floor_ps(_mm256_add_ps(x, _mm256_set1_ps(0.5f)));
  const __m256 fpart = _mm256_sub_ps(x, ipart);
  x = _mm256_set1_ps(1.535336188319500e-4f);
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(1.339887440266574e-3f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(9.618437357674640e-3f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(5.550332471162809e-2f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(2.402264791363012e-1f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(6.931472028550421e-1f));
  x = _mm256_fmadd_ps(x, fpart, _mm256_set1_ps(1.000000000000000f));
  const __m256i epart = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(ipart), _mm256_set1_epi32(127)), 23);
  __m256 result = _mm256_mul_ps(_mm256_castsi256_ps(epart), x);
  result = _mm256_blendv_ps(result, in, _mm256_cmp_ps(in, in, _CMP_UNORD_Q));
  result = _mm256_blendv_ps(result, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                            _mm256_cmp_ps(in, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
  result = _mm256_blendv_ps(result, _mm256_setzero_ps(), _mm256_cmp_ps(in, _mm256_set1_ps(-88.0f), _CMP_LT_OQ));
  return result;
}

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace

float largest_avx2(const float* x, int64_t n) {
  // four registers of eight lanes, each lane keeping what std::max(top, x) keeps: max(x, top) gives its second
  // operand, the top so far, where x is NaN (or equal)
  const __m256 lowest = _mm256_set1_ps(std::numeric_limits<float>::lowest());
  __m256 top[4] = {lowest, lowest, lowest, lowest};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) top[j] = _mm256_max_ps(_mm256_loadu_ps(x + i + 8 * j), top[j]);
  }
  for (; i + 8 <= n; i += 8) top[0] = _mm256_max_ps(_mm256_loadu_ps(x + i), top[0]);
  alignas(32) float lanes[32];
  for (int j = 0; j < 4; ++j) _mm256_store_ps(lanes + 8 * j, top[j]);
  float result = std::numeric_limits<float>::lowest();
  for (float lane : lanes) result = std::max(result, lane);
  for (; i < n; ++i) result = std::max(result, x[i]);
  return result;
}

float exp_shifted_sum_avx2(float* x, int64_t n, float shift) {
  const __m256 by = _mm256_set1_ps(shift);
  __m256 total = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), by));
    _mm256_storeu_ps(x + i, e);
    total = _mm256_add_ps(total, e);
  }
  float sum = hsum(total);
  if (const int rest = static_cast<int>(n - i); rest > 0) {  // the tail through a padded register
    alignas(32) float buffer[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < rest; ++j) buffer[j] = x[i + j] - shift;
    _mm256_store_ps(buffer, exp8(_mm256_load_ps(buffer)));
    for (int j = 0; j < rest; ++j) {
      x[i + j] = buffer[j];
      sum += buffer[j];
    }
  }
  return sum;
}

namespace {

__m256 swiglu8(__m256 g, __m256 u) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 y = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_andnot_ps(sign, g))));
  const __m256 sigmoid = _mm256_blendv_ps(_mm256_sub_ps(one, y), y, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
  return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), u);
}

}  // namespace

void swiglu_rows_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (const int rest = static_cast<int>(n - i); rest > 0) {  // the tail through padded registers
    alignas(32) float g[8] = {0, 0, 0, 0, 0, 0, 0, 0}, u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < rest; ++j) {
      g[j] = gate[i + j];
      u[j] = up[i + j];
    }
    _mm256_store_ps(g, swiglu8(_mm256_load_ps(g), _mm256_load_ps(u)));
    for (int j = 0; j < rest; ++j) out[i + j] = g[j];
  }
}

namespace {

// Eight keys' or values' elements as floats: float32 as they are, float16 (IEEE halves) widened exactly.
__m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
float value(float x) { return x; }
float value(uint16_t h) { return _cvtsh_ss(h); }

template <typename T>
float dot_of(const float* a, const T* b, int64_t n) {
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) sum = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), sum);
  float total = hsum(sum);
  for (; i < n; ++i) total += a[i] * value(b[i]);
  return total;
}

}  // namespace

void widen_halves_f16c(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* from = src + r * src_stride;
    float* to = dst + r * n;
    int64_t d = 0;
    for (; d + 8 <= n; d += 8) _mm256_storeu_ps(to + d, load8(from + d));
    for (; d < n; ++d) to[d] = value(from[d]);
  }
}

void narrow_to_halves_f16c(const float* src, int64_t n, uint16_t* dst) {
  const __m256 most = _mm256_set1_ps(65504.0f), least = _mm256_set1_ps(-65504.0f);
  for (int64_t i = 0; i < n; i += 8) {
    // min and max give their second operand where either is NaN: x second, so a NaN passes through
    const __m256 x = _mm256_max_ps(least, _mm256_min_ps(most, _mm256_loadu_ps(src + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

namespace {

template <typename T>
void dots_of(const float* q, const T* k, int64_t k_stride, int64_t S, int64_t n, float* out) {
  const int64_t dense = n / 8 * 8;
  int64_t s = 0;
  // eight keys at a time: eight lanes of partial sums each, reduced together by a tree of horizontal adds
  for (; s + 8 <= S; s += 8) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dense; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qd, load8(k + (s + j) * k_stride + d), acc[j]);
    }
    const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
    const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    // u0 holds keys 0-3 (low lane: first halves, high lane: second halves), u1 keys 4-7 likewise
    __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    if (dense < n) {
      alignas(32) float rest[8];
      for (int j = 0; j < 8; ++j) {
        float r = 0.0f;
        for (int64_t d = dense; d < n; ++d) r += q[d] * value(k[(s + j) * k_stride + d]);
        rest[j] = r;
      }
      sums = _mm256_add_ps(sums, _mm256_load_ps(rest));
    }
    _mm256_storeu_ps(out + s, sums);
  }
  for (; s < S; ++s) out[s] = dot_of(q, k + s * k_stride, n);
}

template <typename T>
void weighted_sum_add_of(const float* p, const T* v, int64_t v_stride, int64_t S, int64_t n, float* acc) {
  int64_t d = 0;
  // four blocks of eight columns at a time, the keys' weights broadcast once per key
  for (; d + 32 <= n; d += 32) {
    __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_loadu_ps(acc + d + 8);
    __m256 a2 = _mm256_loadu_ps(acc + d + 16), a3 = _mm256_loadu_ps(acc + d + 24);
    for (int64_t s = 0; s < S; ++s) {
      const __m256 w = _mm256_set1_ps(p[s]);
      const T* row = v + s * v_stride + d;
      a0 = _mm256_fmadd_ps(w, load8(row), a0);
      a1 = _mm256_fmadd_ps(w, load8(row + 8), a1);
      a2 = _mm256_fmadd_ps(w, load8(row + 16), a2);
      a3 = _mm256_fmadd_ps(w, load8(row + 24), a3);
    }
    _mm256_storeu_ps(acc + d, a0);
    _mm256_storeu_ps(acc + d + 8, a1);
    _mm256_storeu_ps(acc + d + 16, a2);
    _mm256_storeu_ps(acc + d + 24, a3);
  }
  for (; d + 8 <= n; d += 8) {
    __m256 a = _mm256_loadu_ps(acc + d);
    for (int64_t s = 0; s < S; ++s) a = _mm256_fmadd_ps(_mm256_set1_ps(p[s]), load8(v + s * v_stride + d), a);
    _mm256_storeu_ps(acc + d, a);
  }
  for (; d < n; ++d) {
    float a = acc[d];
    for (int64_t s = 0; s < S; ++s) a += p[s] * value(v[s * v_stride + d]);
    acc[d] = a;
  }
}

}  // namespace

void dots_avx2(const float* q, const float* k, int64_t k_stride, int64_t S, int64_t n, float* out) {
  dots_of(q, k, k_stride, S, n, out);
}

void dots_half_avx2(const float* q, const uint16_t* k, int64_t k_stride, int64_t S, int64_t n, float* out) {
  dots_of(q, k, k_stride, S, n, out);
}

void weighted_sum_add_avx2(const float* p, const float* v, int64_t v_stride, int64_t S, int64_t n, float* acc) {
  weighted_sum_add_of(p, v, v_stride, S, n, acc);
}

void weighted_sum_add_half_avx2(const float* p, const uint16_t* v, int64_t v_stride, int64_t S, int64_t n,
                                float* acc) {
  weighted_sum_add_of(p, v, v_stride, S, n, acc);
}

}  // namespace mlxd_qmm::detail
