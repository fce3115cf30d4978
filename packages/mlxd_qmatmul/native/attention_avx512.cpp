// vector_math.h's many-row attention loops in AVX-512 (this file alone of them is compiled with -mavx512f): the
// weighted values of several query rows over one block of values, each value row loaded once for all of them.
#include <immintrin.h>

#include <algorithm>

#include "vector_math.h"

namespace mlxd_qmm::detail {

namespace {

__m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Rows [0, Rows) of weighted_sums_add over W blocks of sixteen columns: Rows x W accumulators held in registers
// over every key, each a chain of multiply-adds key by key (weighted_sum_add's order, so its bits).
template <int Rows, int W, typename T>
void weighted_tile(const float* p, int64_t p_stride, const T* v, int64_t v_stride, int64_t S, float* acc,
                   int64_t acc_stride) {
  __m512 a[Rows][W];
  for (int r = 0; r < Rows; ++r) {
    for (int w = 0; w < W; ++w) a[r][w] = _mm512_loadu_ps(acc + r * acc_stride + 16 * w);
  }
  for (int64_t s = 0; s < S; ++s) {
    const T* row = v + s * v_stride;
    __m512 x[W];
    for (int w = 0; w < W; ++w) x[w] = load16(row + 16 * w);
    for (int r = 0; r < Rows; ++r) {
      const __m512 weight = _mm512_set1_ps(p[r * p_stride + s]);
      for (int w = 0; w < W; ++w) a[r][w] = _mm512_fmadd_ps(weight, x[w], a[r][w]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int w = 0; w < W; ++w) _mm512_storeu_ps(acc + r * acc_stride + 16 * w, a[r][w]);
  }
}

template <int Rows, typename T>
void weighted_rows(const float* p, int64_t p_stride, const T* v, int64_t v_stride, int64_t S, int64_t n, float* acc,
                   int64_t acc_stride) {
  int64_t d = 0;
  for (; d + 64 <= n; d += 64) weighted_tile<Rows, 4>(p, p_stride, v + d, v_stride, S, acc + d, acc_stride);
  switch ((n - d) / 16) {
    case 3: return weighted_tile<Rows, 3>(p, p_stride, v + d, v_stride, S, acc + d, acc_stride);
    case 2: return weighted_tile<Rows, 2>(p, p_stride, v + d, v_stride, S, acc + d, acc_stride);
    case 1: return weighted_tile<Rows, 1>(p, p_stride, v + d, v_stride, S, acc + d, acc_stride);
    default: return;
  }
}

template <typename T>
void weighted_sums_add_of(const float* p, int64_t p_stride, int rows, const T* v, int64_t v_stride, int64_t S,
                          int64_t n, float* acc, int64_t acc_stride) {
  constexpr int kRowsAtOnce = 6;  // 6 rows x 4 blocks: 24 accumulators, 4 values and a weight in 32 registers
  for (int r = 0; r < rows; r += kRowsAtOnce) {
    const float* pr = p + r * p_stride;
    float* ar = acc + r * acc_stride;
    switch (std::min(kRowsAtOnce, rows - r)) {
      case 6: weighted_rows<6>(pr, p_stride, v, v_stride, S, n, ar, acc_stride); break;
      case 5: weighted_rows<5>(pr, p_stride, v, v_stride, S, n, ar, acc_stride); break;
      case 4: weighted_rows<4>(pr, p_stride, v, v_stride, S, n, ar, acc_stride); break;
      case 3: weighted_rows<3>(pr, p_stride, v, v_stride, S, n, ar, acc_stride); break;
      case 2: weighted_rows<2>(pr, p_stride, v, v_stride, S, n, ar, acc_stride); break;
      default: weighted_rows<1>(pr, p_stride, v, v_stride, S, n, ar, acc_stride); break;
    }
  }
}

}  // namespace

void weighted_sums_add_avx512(const float* p, int64_t p_stride, int rows, const float* v, int64_t v_stride, int64_t S,
                              int64_t n, float* acc, int64_t acc_stride) {
  weighted_sums_add_of(p, p_stride, rows, v, v_stride, S, n, acc, acc_stride);
}

void weighted_sums_add_avx512(const float* p, int64_t p_stride, int rows, const uint16_t* v, int64_t v_stride,
                              int64_t S, int64_t n, float* acc, int64_t acc_stride) {
  weighted_sums_add_of(p, p_stride, rows, v, v_stride, S, n, acc, acc_stride);
}

}  // namespace mlxd_qmm::detail
