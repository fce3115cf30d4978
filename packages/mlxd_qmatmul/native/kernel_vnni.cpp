// The int8-activation kernels for 4-bit and 8-bit weights: x quantized to int8 (one scale per int8_block()
// elements), the weights' codes multiplied with it as unsigned x signed bytes by AVX-512 VNNI (vpdpbusd sums
// four products into each int32 lane), each lane then scaled by its weight group's scale times its x block's
// scale. This file alone is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c.
//
// 4 bits: a chunk of 128 weights of one output column is 64 packed bytes: their low nibbles are the even
// elements, the high ones the odd elements, and int32 lane i covers elements 8i to 8i + 7 of the chunk
// (one x block, one weight group). 8 bits: a chunk is 128 bytes in element order, read as two halves of
// 64; lane i of a half covers its elements 4i to 4i + 3. The bias term is sum over groups of bias * (exact
// float sum of x).
#include <immintrin.h>

#include <cstring>

#include "kernel.h"

namespace {

using mlxd_qmm::Int8Rows;
using mlxd_qmm::Problem;
using mlxd_qmm::kPrefetchBytes;
using mlxd_qmm::prefetch_groups_ahead;
using mlxd_qmm::prefetch_scales;

// n (at most 16) consecutive scale or bias values from element i, as float32 lanes (the rest zero).
inline __m512 load_values(int type, const void* base, int64_t i, int n) {
  const __mmask16 mask = n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
  if (type == mlxd_qmm::kScaleFloat16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + i));
  }
  if (type == mlxd_qmm::kScaleBFloat16) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + i);
}

// Lane i of a chunk -> the chunk's weight group it belongs to.
template <int GS>
inline __m512i group_of_lane() {
  if constexpr (GS == 32) return _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  if constexpr (GS == 64) return _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_setzero_si512();
}

// Lane i of a half chunk of 8-bit weights (elements 4i to 4i + 3 of the half) -> its weight group in the chunk.
template <int GS, int HALF>
inline __m512i group_of_lane8() {
  if constexpr (GS == 32) return HALF == 0 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                           : _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  if constexpr (GS == 64) return _mm512_set1_epi32(HALF);
  return _mm512_setzero_si512();
}

// Lane i of a half chunk of 8-bit weights -> the 8-element x lane scale it falls in (of the chunk's 16).
template <int HALF>
inline __m512i x_lane_of_lane8() {
  return _mm512_setr_epi32(8 * HALF + 0, 8 * HALF + 0, 8 * HALF + 1, 8 * HALF + 1, 8 * HALF + 2, 8 * HALF + 2,
                           8 * HALF + 3, 8 * HALF + 3, 8 * HALF + 4, 8 * HALF + 4, 8 * HALF + 5, 8 * HALF + 5,
                           8 * HALF + 6, 8 * HALF + 6, 8 * HALF + 7, 8 * HALF + 7);
}

// The bias term, sum over groups of bias * (float sum of x over the group), added to acc; then the sums out.
template <int R, int C>
inline void finish(const Problem& p, int m0, int n0, const int64_t* first_group, __m512 (&acc)[R][C]) {
  const Int8Rows& x = *p.int8;
  const int groups = p.K / p.group_size;
  for (int g = 0; g < groups; g += 16) {
    const int n = groups - g < 16 ? groups - g : 16;
    __m512 bias[C];
    for (int c = 0; c < C; ++c) bias[c] = load_values(p.scale_type, p.biases, first_group[c] + g, n);
    for (int r = 0; r < R; ++r) {
      const __m512 sums = _mm512_load_ps(x.group_sums + static_cast<int64_t>(m0 + r) * x.Gpad + g);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(bias[c], sums, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) p.y[static_cast<int64_t>(m0 + r) * p.N + n0 + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int R, int C, int GS>
inline void tile8(const Problem& p, int m0, int n0) {
  const Int8Rows& x = *p.int8;
  const int K = p.K;
  const int groups = K / GS;
  const uint8_t* w[C];
  int64_t first_group[C];
  for (int c = 0; c < C; ++c) {
    w[c] = p.w + static_cast<int64_t>(n0 + c) * K;
    first_group[c] = static_cast<int64_t>(n0 + c) * groups;
  }
  const __m512i group0 = group_of_lane8<GS, 0>(), group1 = group_of_lane8<GS, 1>();
  const __m512i lane0 = x_lane_of_lane8<0>(), lane1 = x_lane_of_lane8<1>();
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int k0 = 0; k0 < K; k0 += 128) {
    const int left = K - k0;  // a multiple of 32
    const __mmask64 bytes0 = left >= 64 ? ~0ULL : (1ULL << left) - 1;
    const __mmask64 bytes1 = left >= 128 ? ~0ULL : left > 64 ? (1ULL << (left - 64)) - 1 : 0ULL;
    const int chunk_groups = left >= 128 ? 128 / GS : (left + GS - 1) / GS;
    const int g0 = k0 / GS;
    __m512i w0[C], w1[C];
    __m512 scale0[C], scale1[C];
    for (int c = 0; c < C; ++c) {
      __builtin_prefetch(w[c] + k0 + kPrefetchBytes);
      __builtin_prefetch(w[c] + k0 + 64 + kPrefetchBytes);
      prefetch_scales(p, first_group[c] + g0 + prefetch_groups_ahead(GS, 8));
      w0[c] = _mm512_maskz_loadu_epi8(bytes0, w[c] + k0);
      w1[c] = _mm512_maskz_loadu_epi8(bytes1, w[c] + k0 + 64);
      const __m512 group_scales = load_values(p.scale_type, p.scales, first_group[c] + g0, chunk_groups);
      scale0[c] = _mm512_permutexvar_ps(group0, group_scales);
      scale1[c] = _mm512_permutexvar_ps(group1, group_scales);
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = x.q + static_cast<int64_t>(m0 + r) * x.Kpad + k0;
      const __m512i xa = _mm512_load_si512(xq);
      const __m512i xb = _mm512_load_si512(xq + 64);
      const __m512 d = _mm512_load_ps(x.lane_scales + static_cast<int64_t>(m0 + r) * (x.Kpad / 8) + k0 / 8);
      const __m512 d0 = _mm512_permutexvar_ps(lane0, d), d1 = _mm512_permutexvar_ps(lane1, d);
      for (int c = 0; c < C; ++c) {
        const __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0[c], xa);
        const __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w1[c], xb);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(d0, scale0[c]), acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d1, scale1[c]), acc[r][c]);
      }
    }
  }
  finish<R, C>(p, m0, n0, first_group, acc);
}

template <int R, int C, int GS>
inline void tile4(const Problem& p, int m0, int n0) {
  const Int8Rows& x = *p.int8;
  const int K = p.K;
  const int groups = K / GS;
  const int64_t row_bytes = K / 2;
  const uint8_t* w[C];
  int64_t first_group[C];
  for (int c = 0; c < C; ++c) {
    w[c] = p.w + (n0 + c) * row_bytes;
    first_group[c] = static_cast<int64_t>(n0 + c) * groups;
  }
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i lane_group = group_of_lane<GS>();
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int k0 = 0; k0 < K; k0 += 128) {
    const int left = K - k0;
    const __mmask64 bytes = left >= 128 ? ~0ULL : (1ULL << (left / 2)) - 1;
    const int chunk_groups = left >= 128 ? 128 / GS : (left + GS - 1) / GS;
    const int g0 = k0 / GS;
    __m512i lo[C], hi[C];
    __m512 scale[C];
    for (int c = 0; c < C; ++c) {
      __builtin_prefetch(w[c] + k0 / 2 + kPrefetchBytes);
      prefetch_scales(p, first_group[c] + g0 + prefetch_groups_ahead(GS, 4));
      const __m512i packed = _mm512_maskz_loadu_epi8(bytes, w[c] + k0 / 2);
      lo[c] = _mm512_and_si512(packed, low4);
      hi[c] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
      scale[c] = _mm512_permutexvar_ps(lane_group, load_values(p.scale_type, p.scales, first_group[c] + g0, chunk_groups));
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = x.q + static_cast<int64_t>(m0 + r) * x.Kpad + k0;
      const __m512i xl = _mm512_load_si512(xq);
      const __m512i xh = _mm512_load_si512(xq + 64);
      const __m512 d = _mm512_load_ps(x.lane_scales + static_cast<int64_t>(m0 + r) * (x.Kpad / 8) + k0 / 8);
      for (int c = 0; c < C; ++c) {
        __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[c], xl);
        sum = _mm512_dpbusd_epi32(sum, hi[c], xh);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, scale[c]), acc[r][c]);
      }
    }
  }
  finish<R, C>(p, m0, n0, first_group, acc);
}

// Weights in column-block order (kInt8Columns, interleave_columns): int32 lane c of every product is column c of
// a block of 16. Per x block of 8 elements and row, two vpdpbusd sum the block for all 16 columns, with each
// 4-element run of x broadcast (4 bits: the block's 4 even elements against its word's low nibbles, its 4 odd ones
// against the high; 8 bits: its two words, 4 elements each); those sums times the block's x scale add up over the
// weight group, which is then scaled by its 16 columns' scales at once and given their biases. In MLX's order
// (`tile4`, `tile8`) a column's lanes are its x blocks, and each block's sum is scaled for every column apart
// (docs/benchmark_results/code_notes.md#int8-columns). Every row's arithmetic is the same whatever the tile's row
// count, so a product's rows come out with the same bits however many rows it has (a verify forward's rows as a
// decode step's).
template <int R, int GS, int BITS, int SHARED>
inline void column_tile(const Problem& p, int m0, int n0, int count) {
  const Int8Rows& x = *p.int8;
  const int K = p.K;
  const int groups = K / GS;
  constexpr int BLOCKS = GS / 8;  // x blocks a weight group
  constexpr int WORDS = BITS == 4 ? 1 : 2;  // packed words of one column an x block takes
  // SHARED: x blocks of 8 that share one scale (within a group): their integer sums add up first
  static_assert(BLOCKS % SHARED == 0, "an x scale's blocks never straddle a weight group");
  const auto* words = reinterpret_cast<const int32_t*>(p.w + static_cast<int64_t>(n0) * (K * BITS / 8));  // [K*BITS/32][count]
  const int64_t first_group = static_cast<int64_t>(n0) * groups;  // the block's [groups][count] scales from here
  const __mmask16 present = count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int8_t* xq[R];
  const float* lane_scales[R];
  const float* sums[R];
  for (int r = 0; r < R; ++r) {
    xq[r] = x.q + static_cast<int64_t>(m0 + r) * x.Kpad;
    lane_scales[r] = x.lane_scales + static_cast<int64_t>(m0 + r) * (x.Kpad / 8);
    sums[r] = x.group_sums + static_cast<int64_t>(m0 + r) * x.Gpad;
  }
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int g = 0; g < groups; ++g) {
    // a group's words are BLOCKS * WORDS lines (of 16 columns), its scales and biases one run of `count` each: both
    // asked for kPrefetchBytes of words ahead
    const char* ahead =
        reinterpret_cast<const char*>(words + static_cast<int64_t>(g) * BLOCKS * WORDS * count) + kPrefetchBytes;
    for (int line = 0; line < BLOCKS * WORDS; ++line) __builtin_prefetch(ahead + 64 * line);
    prefetch_scales(p, first_group + static_cast<int64_t>(g + kPrefetchBytes / (64 * BLOCKS * WORDS)) * count);
    const __m512 scale = load_values(p.scale_type, p.scales, first_group + static_cast<int64_t>(g) * count, count);
    const __m512 bias = load_values(p.scale_type, p.biases, first_group + static_cast<int64_t>(g) * count, count);
    __m512 group_acc[R];
    __m512i sum[R];
    for (int r = 0; r < R; ++r) group_acc[r] = _mm512_setzero_ps();
    for (int j = 0; j < BLOCKS; ++j) {
      const int block = g * BLOCKS + j;
      if (j % SHARED == 0) {
        for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_si512();
      }
      __m512i first, second;  // what the block's first and second 4 elements of x multiply
      int at_first, at_second;  // where those elements sit in x's int8 row
      if constexpr (BITS == 4) {
        const __m512i packed = _mm512_maskz_loadu_epi32(present, words + static_cast<int64_t>(block) * count);
        first = _mm512_and_si512(packed, low4);
        second = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
        // x's split order: a chunk of 128 holds its 64 even elements, then its 64 odd ones
        at_first = block / 16 * 128 + block % 16 * 4;
        at_second = at_first + 64;
      } else {
        first = _mm512_maskz_loadu_epi32(present, words + static_cast<int64_t>(2 * block) * count);
        second = _mm512_maskz_loadu_epi32(present, words + static_cast<int64_t>(2 * block + 1) * count);
        at_first = 8 * block;  // x in order
        at_second = at_first + 4;
      }
      for (int r = 0; r < R; ++r) {
        int32_t e, o;
        std::memcpy(&e, xq[r] + at_first, 4);
        std::memcpy(&o, xq[r] + at_second, 4);
        sum[r] = _mm512_dpbusd_epi32(sum[r], first, _mm512_set1_epi32(e));
        sum[r] = _mm512_dpbusd_epi32(sum[r], second, _mm512_set1_epi32(o));
      }
      if (j % SHARED == SHARED - 1) {
        for (int r = 0; r < R; ++r) {
          const __m512 x_scale = _mm512_set1_ps(lane_scales[r][block]);
          if constexpr (SHARED == 1) {  // each x block's sum by its scale, the group's total by the weights'
            group_acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), x_scale, group_acc[r]);
          } else {  // blocks sharing an x scale summed in integers, then scaled by both scales at once
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_mul_ps(x_scale, scale), acc[r]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      if constexpr (SHARED == 1) acc[r] = _mm512_fmadd_ps(group_acc[r], scale, acc[r]);
      acc[r] = _mm512_fmadd_ps(bias, _mm512_set1_ps(sums[r][g]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(p.y + static_cast<int64_t>(m0 + r) * p.N + n0, present, acc[r]);
}

// column_tile for a row count known only at run time (1 to R).
template <int R, int GS, int BITS, int SHARED>
inline void some_column_rows(int rows, const Problem& p, int m0, int n0, int count) {
  if constexpr (R > 1) {
    if (rows < R) {
      some_column_rows<R - 1, GS, BITS, SHARED>(rows, p, m0, n0, count);
      return;
    }
  }
  column_tile<R, GS, BITS, SHARED>(p, m0, n0, count);
}

// The most rows a column tile holds: two accumulators a row beside a block's two weight vectors and its group's
// scales and biases, in AVX-512's 32 registers (x blocks that share a scale keep an integer sum a row in place of
// a group accumulator).
constexpr int kColumnTileRows = 10;

// Columns [n0, n1) of a problem in column-block order: n0 is a block's first column (tasks come in whole blocks).
template <int GS, int BITS, int SHARED>
inline void column_blocks(const Problem& p, int n0, int n1) {
  for (int nb = n0; nb < n1; nb += 16) {
    const int count = p.N - nb < 16 ? p.N - nb : 16;  // a part's last block may hold fewer
    int m = 0;
    for (; m + kColumnTileRows <= p.M; m += kColumnTileRows)
      column_tile<kColumnTileRows, GS, BITS, SHARED>(p, m, nb, count);
    if (m < p.M) some_column_rows<kColumnTileRows - 1, GS, BITS, SHARED>(p.M - m, p, m, nb, count);
  }
}

// column_blocks for x rounded in blocks of x.block elements (8, 16 or 32; a group holds at least 32).
template <int GS, int BITS>
inline void column_blocks(const Problem& p, int n0, int n1) {
  switch (p.int8->block) {
    case 32: return column_blocks<GS, BITS, 4>(p, n0, n1);
    case 16: return column_blocks<GS, BITS, 2>(p, n0, n1);
    default: return column_blocks<GS, BITS, 1>(p, n0, n1);
  }
}

template <int R, int GS, int BITS>
inline void rows(const Problem& p, int m0, int n0, int n1) {
  constexpr int C = R == 1 ? 4 : 2;
  int n = n0;
  if constexpr (BITS == 4) {
    for (; n + C <= n1; n += C) tile4<R, C, GS>(p, m0, n);
    for (; n < n1; ++n) tile4<R, 1, GS>(p, m0, n);
  } else {
    for (; n + C <= n1; n += C) tile8<R, C, GS>(p, m0, n);
    for (; n < n1; ++n) tile8<R, 1, GS>(p, m0, n);
  }
}

template <int GS, int BITS>
inline void all_rows(const Problem& p, int n0, int n1) {
  for (int nb = n0; nb < n1; nb += 16) {  // a block's weights stay in L1 for every tile of rows
    const int ne = nb + 16 < n1 ? nb + 16 : n1;
    int m = 0;
    for (; m + 4 <= p.M; m += 4) rows<4, GS, BITS>(p, m, nb, ne);
    switch (p.M - m) {
      case 1: rows<1, GS, BITS>(p, m, nb, ne); break;
      case 2: rows<2, GS, BITS>(p, m, nb, ne); break;
      case 3: rows<3, GS, BITS>(p, m, nb, ne); break;
      default: break;
    }
  }
}

}  // namespace

namespace mlxd_qmm {
void kernel_vnni_int8(const Problem& p, int n0, int n1) {
  const bool four = p.bits == 4;
  if (p.columns) {
    switch (p.group_size) {
      case 32: four ? column_blocks<32, 4>(p, n0, n1) : column_blocks<32, 8>(p, n0, n1); break;
      case 64: four ? column_blocks<64, 4>(p, n0, n1) : column_blocks<64, 8>(p, n0, n1); break;
      case 128: four ? column_blocks<128, 4>(p, n0, n1) : column_blocks<128, 8>(p, n0, n1); break;
      default: break;
    }
    return;
  }
  switch (p.group_size) {
    case 32: four ? all_rows<32, 4>(p, n0, n1) : all_rows<32, 8>(p, n0, n1); break;
    case 64: four ? all_rows<64, 4>(p, n0, n1) : all_rows<64, 8>(p, n0, n1); break;
    case 128: four ? all_rows<128, 4>(p, n0, n1) : all_rows<128, 8>(p, n0, n1); break;
    default: break;
  }
}

void quantize_blocks_int8_avx512(const float* src, int K, int block, bool split, int8_t* dst, float* lane_scales) {
  // eight elements of x a 256-bit vector, `block` of them sharing one scale (K a multiple of 8)
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i evens_then_odds = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  for (int b0 = 0; b0 < K; b0 += block) {
    const int b1 = b0 + block < K ? b0 + block : K;
    // the block's largest magnitude in every lane (max is exact, so any order gives the scalar loop's value)
    __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(src + b0));
    for (int b = b0 + 8; b < b1; b += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + b)));
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    const float amax = _mm256_cvtss_f32(m);
    const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    for (int b = b0; b < b1; b += 8) {
      // rounded to nearest even (the default rounding mode, as lrintf), then truncated to bytes (as the cast)
      const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + b), inverse));
      const __m128i bytes = _mm256_cvtepi32_epi8(split ? _mm256_permutevar8x32_epi32(q, evens_then_odds) : q);
      if (split) {
        const int chunk = b / 128 * 128, j = b - chunk;
        const int evens = _mm_cvtsi128_si32(bytes), odds = _mm_extract_epi32(bytes, 1);
        std::memcpy(dst + chunk + j / 2, &evens, 4);
        std::memcpy(dst + chunk + 64 + j / 2, &odds, 4);
      } else {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + b), bytes);
      }
      lane_scales[b / 8] = amax / 127.0f;
    }
  }
}
}  // namespace mlxd_qmm
