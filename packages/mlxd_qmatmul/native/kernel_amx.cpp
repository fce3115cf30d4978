// The many-rows kernel on Intel AMX (tile multiply units, bfloat16): batched verify and prompt chunks.
// This file alone is compiled with -mamx-tile -mamx-bf16 and AVX-512 (CMakeLists.txt, when the compiler
// takes them); the dispatcher runs it only where the CPU has AMX and the OS grants its tile state.
//
// Exact in float32 terms: each x value is split into three bfloat16 pieces whose sum is the value
// (hi + mid + lo, 8 significant bits each), every 4-bit or 8-bit weight is a bfloat16 integer, so each
// tile product q * piece is exact and the tiles accumulate in float32. Per weight group:
//   y[m, n] += scale[n, g] * sum_k q[n, k] x[m, k] + bias[n, g] * sum_k x[m, k]
// with the first sum from the tiles (16 weight rows x up to 16 x rows a tile) and the second from
// AmxRows.sums. Tile roles: A = 16 weight rows x 32 weights (decoded here), B = x's pieces laid out as
// pairs (amx_prepare, once a product), C = float32 sums [weight row][x row].
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernel.h"

namespace mlxd_qmm {

namespace {

struct alignas(64) TileConfig {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0 and 1: C of two column tiles; 2-4: x's pieces (B); 5 and 6: decoded weights (A). `cols`: the
// x rows of this row tile (C's and B's width).
void configure(int cols) {
  thread_local int configured = -1;
  if (configured == cols) return;
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 5; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = static_cast<uint16_t>(4 * cols);
  }
  for (int t = 5; t < 7; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  configured = cols;
}

// 16 weight rows' 32 weights from element k, as bfloat16, into out [16][32].
template <int BITS>
void decode_rows(const uint8_t* w, int64_t row_bytes, int k, uint16_t* out) {
  alignas(64) static const uint16_t kNibbleValues[32] = {0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0,
                                                         0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120, 0x4130,
                                                         0x4140, 0x4150, 0x4160, 0x4170};  // bfloat16 of 0..15
  const __m512i table = _mm512_load_si512(kNibbleValues);
  for (int i = 0; i < 16; ++i) {
    const uint8_t* src = w + i * row_bytes;
    __builtin_prefetch(src + k * BITS / 8 + kPrefetchBytes);  // as the vector kernels do (kernel.h)
    if constexpr (BITS == 4) {
      const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k / 2)));
      const __m256i low = _mm256_and_si256(bytes, _mm256_set1_epi16(0x0f));
      const __m256i high = _mm256_srli_epi16(bytes, 4);
      const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
      _mm512_store_si512(out + 32 * i, _mm512_permutexvar_epi16(q, table));
    } else {  // 0..255 as float32, whose top 16 bits are then exact bfloat16
      const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
      const __m512 b =
          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 16))));
      const __m256i ha = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(a), 16));
      const __m256i hb = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(b), 16));
      _mm512_store_si512(out + 32 * i, _mm512_inserti64x4(_mm512_castsi256_si512(ha), hb, 1));
    }
  }
}

// The scales (or biases) of weight rows n .. n + 15 for groups [g, g + count), as float32: out[i][j].
void widen16(const Problem& p, const void* base, int n, int groups, int g, int count, float out[16][16]) {
  for (int i = 0; i < 16; ++i) {
    const int64_t at = static_cast<int64_t>(n + i) * groups + g;
    if (p.scale_type == kScaleFloat16 && count == 16) {
      const auto* src = reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + at);
      _mm512_store_ps(out[i], _mm512_cvtph_ps(_mm256_loadu_si256(src)));
      continue;
    }
    for (int j = 0; j < count; ++j) {
      if (p.scale_type == kScaleFloat16) {
        out[i][j] = _cvtsh_ss(static_cast<const uint16_t*>(base)[at + j]);
      } else if (p.scale_type == kScaleBFloat16) {
        out[i][j] = bfloat16_to_float(static_cast<const uint16_t*>(base)[at + j]);
      } else {
        out[i][j] = static_cast<const float*>(base)[at + j];
      }
    }
  }
}

// T column tiles of 16 weight rows from n (T = 1 or 2: two run side by side, sharing x's tiles) against
// row tile t of x (`cols` rows).
template <int T, int GS, int BITS>
void column_tiles(const Problem& p, int t, int n, int cols) {
  const AmxRows& rows = *p.amx;
  const int groups = p.K / GS;
  const int64_t row_bytes = static_cast<int64_t>(p.K) * BITS / 8;
  const uint32_t* pieces = rows.pieces + static_cast<int64_t>(t) * rows.chunks * kAmxChunkWords;
  const float* sums = rows.sums + static_cast<int64_t>(t) * rows.groups * 16;
  alignas(64) uint16_t decoded[T][16 * 32];
  alignas(64) float products[T][16 * 16] = {};  // lanes past the x rows stay zero (the tiles store `cols`)
  alignas(64) float scales[T][16][16], biases[T][16][16];
  __m512 acc[T][16];  // acc[u][i]: weight row n + 16u + i, one lane per x row
  for (int u = 0; u < T; ++u)
    for (int i = 0; i < 16; ++i) acc[u][i] = _mm512_setzero_ps();
  for (int g = 0; g < groups; ++g) {
    const int gj = g % 16;
    if (gj == 0) {
      for (int u = 0; u < T; ++u) {
        for (int i = 0; i < 16; ++i) prefetch_scales(p, static_cast<int64_t>(n + 16 * u + i) * groups + g + 16);
        widen16(p, p.scales, n + 16 * u, groups, g, std::min(16, groups - g), scales[u]);
        widen16(p, p.biases, n + 16 * u, groups, g, std::min(16, groups - g), biases[u]);
      }
    }
    _tile_zero(0);
    if constexpr (T == 2) _tile_zero(1);
    for (int kc = 0; kc < GS; kc += 32) {
      const int k = g * GS + kc;
      const uint32_t* b = pieces + static_cast<int64_t>(k / 32) * kAmxChunkWords;
      decode_rows<BITS>(p.w + n * row_bytes, row_bytes, k, decoded[0]);
      _tile_loadd(5, decoded[0], 64);
      if constexpr (T == 2) {
        decode_rows<BITS>(p.w + (n + 16) * row_bytes, row_bytes, k, decoded[1]);
        _tile_loadd(6, decoded[1], 64);
      }
      _tile_loadd(2, b, 64);
      _tile_dpbf16ps(0, 5, 2);
      if constexpr (T == 2) _tile_dpbf16ps(1, 6, 2);
      _tile_loadd(3, b + 256, 64);
      _tile_dpbf16ps(0, 5, 3);
      if constexpr (T == 2) _tile_dpbf16ps(1, 6, 3);
      _tile_loadd(4, b + 512, 64);
      _tile_dpbf16ps(0, 5, 4);
      if constexpr (T == 2) _tile_dpbf16ps(1, 6, 4);
    }
    _tile_stored(0, products[0], 64);
    if constexpr (T == 2) _tile_stored(1, products[1], 64);
    const __m512 group_sums = _mm512_loadu_ps(sums + g * 16);
    for (int u = 0; u < T; ++u) {
      for (int i = 0; i < 16; ++i) {
        acc[u][i] = _mm512_fmadd_ps(_mm512_set1_ps(scales[u][i][gj]), _mm512_load_ps(products[u] + 16 * i), acc[u][i]);
        acc[u][i] = _mm512_fmadd_ps(_mm512_set1_ps(biases[u][i][gj]), group_sums, acc[u][i]);
      }
    }
  }
  for (int u = 0; u < T; ++u) {
    alignas(64) float out[16][16];
    for (int i = 0; i < 16; ++i) _mm512_store_ps(out[i], acc[u][i]);
    for (int j = 0; j < cols; ++j) {
      float* y = p.y + static_cast<int64_t>(16 * t + j) * p.N + n + 16 * u;
      for (int i = 0; i < 16; ++i) y[i] = out[i][j];
    }
  }
}

template <int GS, int BITS>
void amx_columns(const Problem& p, int n0, int n1) {
  for (int t = 0; t < p.amx->row_tiles; ++t) {
    const int cols = std::min(16, p.M - 16 * t);
    configure(cols);
    int n = n0;
    for (; n + 32 <= n1; n += 32) column_tiles<2, GS, BITS>(p, t, n, cols);
    for (; n + 16 <= n1; n += 16) column_tiles<1, GS, BITS>(p, t, n, cols);
  }
}

// Transposes a 16 x 16 matrix of 32-bit words held one row a register.
void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8) {
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

}  // namespace

void amx_prepare(const float* x, int M, int K, int group_size, int bits, uint32_t* pieces, float* sums) {
  const int row_tiles = amx_row_tiles(M), chunks = K / 32, groups = K / group_size;
  // The sums' lanes past a row tile's x rows are read into lanes whose results are dropped: zeros keep
  // them ordinary numbers. (B columns past them are never loaded: the tiles' width is the row count.)
  std::memset(sums, 0, sizeof(float) * row_tiles * groups * 16);
  // A position p of 4-bit weights holds the chunk's even elements (p < 16), then its odd ones: the order
  // of the bytes' low, then high nibbles (decode_rows)
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int t = 0; t < row_tiles; ++t) {
    const int rows = std::min(16, M - 16 * t);
    for (int c = 0; c < chunks; ++c) {
      __m512i pairs[3][16];  // [piece][x row]: the row's 32 values in A positions, as 16 pairs
      for (int j = 0; j < 16; ++j) {
        if (j >= rows) {
          for (int s = 0; s < 3; ++s) pairs[s][j] = _mm512_setzero_si512();
          continue;
        }
        const float* src = x + static_cast<int64_t>(16 * t + j) * K + 32 * c;
        const __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
        __m512 first = a, second = b;  // positions 0-15 and 16-31
        if (bits == 4) {
          first = _mm512_permutex2var_ps(a, evens, b);
          second = _mm512_permutex2var_ps(a, odds, b);
        }
        for (int s = 0; s < 3; ++s) {  // hi, mid, lo: each the top 16 bits of what is left (exact: each
          // subtraction leaves at most 16, then 8 significant bits)
          const __m512i top_first = _mm512_and_si512(_mm512_castps_si512(first), high_half);
          const __m512i top_second = _mm512_and_si512(_mm512_castps_si512(second), high_half);
          first = _mm512_sub_ps(first, _mm512_castsi512_ps(top_first));
          second = _mm512_sub_ps(second, _mm512_castsi512_ps(top_second));
          const __m256i words_first = _mm512_cvtepi32_epi16(_mm512_srli_epi32(top_first, 16));
          const __m256i words_second = _mm512_cvtepi32_epi16(_mm512_srli_epi32(top_second, 16));
          pairs[s][j] = _mm512_inserti64x4(_mm512_castsi256_si512(words_first), words_second, 1);
        }
      }
      uint32_t* out = pieces + (static_cast<int64_t>(t) * chunks + c) * kAmxChunkWords;
      for (int s = 0; s < 3; ++s) {  // B row r, column j = pair r of x row j
        transpose16(pairs[s]);
        for (int r = 0; r < 16; ++r) _mm512_storeu_si512(out + s * 256 + 16 * r, pairs[s][r]);
      }
    }
    for (int j = 0; j < rows; ++j) {
      const float* src = x + static_cast<int64_t>(16 * t + j) * K;
      for (int g = 0; g < groups; ++g) {
        __m512 total = _mm512_loadu_ps(src + g * group_size);
        for (int k = g * group_size + 16; k < (g + 1) * group_size; k += 16) {
          total = _mm512_add_ps(total, _mm512_loadu_ps(src + k));
        }
        sums[(static_cast<int64_t>(t) * groups + g) * 16 + j] = _mm512_reduce_add_ps(total);
      }
    }
  }
}

void kernel_amx(const Problem& p, int n0, int n1) {
  const int tiled = n0 + (n1 - n0) / 16 * 16;  // whole tiles of 16 weight rows here, the rest on AVX-512
  switch (p.group_size * 16 + p.bits) {
    case 32 * 16 + 4: amx_columns<32, 4>(p, n0, tiled); break;
    case 64 * 16 + 4: amx_columns<64, 4>(p, n0, tiled); break;
    case 128 * 16 + 4: amx_columns<128, 4>(p, n0, tiled); break;
    case 32 * 16 + 8: amx_columns<32, 8>(p, n0, tiled); break;
    case 64 * 16 + 8: amx_columns<64, 8>(p, n0, tiled); break;
    case 128 * 16 + 8: amx_columns<128, 8>(p, n0, tiled); break;
    default: break;  // refused before a problem is made (qmatmul.cpp)
  }
  if (tiled < n1) kernel_avx512(p, tiled, n1);
}

}  // namespace mlxd_qmm
