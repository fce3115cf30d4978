// The portable forms of vector_math.h (one float at a time, std::fma) and the choice of the AVX2 forms
// where the CPU has AVX2 and FMA.
#include "vector_math.h"

#include "kernel.h"  // half_to_float, select_isa

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "mlx/types/half_types.h"

namespace mlxd_qmm {

namespace {

constexpr float kHalfMax = 65504.0f;  // the largest finite IEEE half
static_assert(sizeof(mlx::core::float16_t) == sizeof(uint16_t));

// mlx/backend/cpu/simd/math.h's exp for one float.
float mlx_exp(float in) {
  float x = in * 1.442695f;
  const float ipart = std::floor(x + 0.5f);
  const float fpart = x - ipart;
  x = 1.535336188319500e-4f;
  x = std::fma(x, fpart, 1.339887440266574e-3f);
  x = std::fma(x, fpart, 9.618437357674640e-3f);
  x = std::fma(x, fpart, 5.550332471162809e-2f);
  x = std::fma(x, fpart, 2.402264791363012e-1f);
  x = std::fma(x, fpart, 6.931472028550421e-1f);
  x = std::fma(x, fpart, 1.000000000000000f);
  if (std::isnan(in)) return in;
  if (in > 88.0f) return std::numeric_limits<float>::infinity();
  if (in < -88.0f) return 0.0f;
  const int32_t bits = (static_cast<int32_t>(ipart) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return scale * x;
}

// Where the CPU has AVX2 and FMA, unless the kernels' instruction set is the portable one (MLXD_QMM_ISA=sse2
// chooses it on any x86-64 CPU, which is how the portable forms are tested there).
bool use_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           std::strcmp(select_isa().name, "sse2") != 0;
  return avx2;
#else
  return false;
#endif
}

// A key's or value's element as a float: float32 as it is, float16 (an IEEE half) widened exactly.
float value(float x) { return x; }
float value(uint16_t h) { return half_to_float(h); }

// The portable dot product (eight scalar partial sums) and weighted sum (key by key, zero weights skipped), over
// float32 or float16 keys and values: the same operations in the same order for both.
template <typename T>
float portable_dot(const float* a, const T* b, int64_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) part[j] += a[i + j] * value(b[i + j]);
  }
  float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i) sum += a[i] * value(b[i]);
  return sum;
}

template <typename T>
void portable_weighted_sum_add(const float* p, const T* v, int64_t v_stride, int64_t S, int64_t n, float* acc) {
  for (int64_t s = 0; s < S; ++s) {
    if (p[s] == 0.0f) continue;
    const T* row = v + s * v_stride;
    for (int64_t i = 0; i < n; ++i) acc[i] += p[s] * value(row[i]);
  }
}

// Where the kernels' instruction set is AVX-512 (which has AVX2, FMA and F16C too): the many-row loops.
bool use_avx512() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool avx512 = std::strcmp(select_isa().name, "avx512") == 0;
  return avx512;
#else
  return false;
#endif
}

template <typename T>
void weighted_sums_add_of(const float* p, int64_t p_stride, int rows, const T* v, int64_t v_stride, int64_t S,
                          int64_t n, float* acc, int64_t acc_stride) {
#if defined(__x86_64__) || defined(_M_X64)
  if (n % 16 == 0 && use_avx512()) return detail::weighted_sums_add_avx512(p, p_stride, rows, v, v_stride, S, n, acc,
                                                                            acc_stride);
#endif
  for (int r = 0; r < rows; ++r) weighted_sum_add(p + r * p_stride, v, v_stride, S, n, acc + r * acc_stride);
}

bool use_f16c() {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool f16c = use_avx2() && __builtin_cpu_supports("f16c");
  return f16c;
#else
  return false;
#endif
}

}  // namespace

void widen_halves(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst) {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_f16c()) return detail::widen_halves_f16c(src, src_stride, rows, n, dst);
#endif
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < n; ++d) dst[r * n + d] = half_to_float(src[r * src_stride + d]);
  }
}

void narrow_to_halves(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
#if defined(__x86_64__) || defined(_M_X64)
  if (use_f16c()) {
    i = n / 8 * 8;
    detail::narrow_to_halves_f16c(src, i, dst);
  }
#endif
  for (; i < n; ++i) {
    // std::clamp keeps a NaN (both its comparisons are false); MLX's own conversion rounds the rest
    const mlx::core::float16_t half(std::clamp(src[i], -kHalfMax, kHalfMax));
    std::memcpy(dst + i, &half, sizeof(uint16_t));
  }
}

float largest(const float* x, int64_t n) {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_avx2()) return detail::largest_avx2(x, n);
#endif
  float top = std::numeric_limits<float>::lowest();
  for (int64_t i = 0; i < n; ++i) top = std::max(top, x[i]);
  return top;
}

float exp_shifted_sum(float* x, int64_t n, float shift) {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_avx2()) return detail::exp_shifted_sum_avx2(x, n, shift);
#endif
  float total = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = mlx_exp(x[i] - shift);
    total += x[i];
  }
  return total;
}

void swiglu_rows(const float* gate, const float* up, float* out, int64_t n) {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_avx2()) return detail::swiglu_rows_avx2(gate, up, out, n);
#endif
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float y = 1.0f / (1.0f + mlx_exp(std::fabs(g)));
    const float sigmoid = g < 0.0f ? y : 1.0f - y;
    out[i] = (g * sigmoid) * up[i];
  }
}

void dots(const float* q, const float* k, int64_t k_stride, int64_t S, int64_t n, float* out) {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_avx2()) return detail::dots_avx2(q, k, k_stride, S, n, out);
#endif
  for (int64_t s = 0; s < S; ++s) out[s] = portable_dot(q, k + s * k_stride, n);
}

void weighted_sum(const float* p, const float* v, int64_t v_stride, int64_t S, int64_t n, float* acc) {
  for (int64_t d = 0; d < n; ++d) acc[d] = 0.0f;
  weighted_sum_add(p, v, v_stride, S, n, acc);
}

void weighted_sum_add(const float* p, const float* v, int64_t v_stride, int64_t S, int64_t n, float* acc) {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_avx2()) return detail::weighted_sum_add_avx2(p, v, v_stride, S, n, acc);
#endif
  portable_weighted_sum_add(p, v, v_stride, S, n, acc);
}

void dots(const float* q, const uint16_t* k, int64_t k_stride, int64_t S, int64_t n, float* out) {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_f16c()) return detail::dots_half_avx2(q, k, k_stride, S, n, out);
#endif
  for (int64_t s = 0; s < S; ++s) out[s] = portable_dot(q, k + s * k_stride, n);
}

void weighted_sum_add(const float* p, const uint16_t* v, int64_t v_stride, int64_t S, int64_t n, float* acc) {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_f16c()) return detail::weighted_sum_add_half_avx2(p, v, v_stride, S, n, acc);
#endif
  portable_weighted_sum_add(p, v, v_stride, S, n, acc);
}

void weighted_sums_add(const float* p, int64_t p_stride, int rows, const float* v, int64_t v_stride, int64_t S,
                       int64_t n, float* acc, int64_t acc_stride) {
  weighted_sums_add_of(p, p_stride, rows, v, v_stride, S, n, acc, acc_stride);
}

void weighted_sums_add(const float* p, int64_t p_stride, int rows, const uint16_t* v, int64_t v_stride, int64_t S,
                       int64_t n, float* acc, int64_t acc_stride) {
  weighted_sums_add_of(p, p_stride, rows, v, v_stride, S, n, acc, acc_stride);
}

}  // namespace mlxd_qmm
