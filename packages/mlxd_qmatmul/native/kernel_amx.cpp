// The many-rows kernel on Intel AMX (tile multiply units, bfloat16): batched verify, batches of 6 rows or
// more and prompt chunks. This file alone is compiled with -mamx-tile -mamx-bf16 and AVX-512 (F, BW, VL,
// VBMI, BF16; CMakeLists.txt, when the compiler takes them); the dispatcher runs it only where the CPU has
// all of those and the OS grants its tile state.
//
// Exact in float32 terms: each x value is split into three bfloat16 pieces whose sum is the value
// (hi + mid + lo, 8 significant bits each), every 4-bit or 8-bit weight is a bfloat16 integer, so each
// tile product piece * q is exact and the tiles accumulate in float32. Per weight group:
//   y[m, n] += scale[n, g] * sum_k x[m, k] q[n, k] + bias[n, g] * sum_k x[m, k]
// with the first sum from the tiles and the second from AmxRows.sums. Tile roles: A = x's pieces (the x
// rows of a row tile x 32 elements, amx_prepare, once a product), B = 16 weight rows' 32 weights decoded
// here into pairs (B row r, column i: elements 2r and 2r + 1 of weight row i), C = float32 sums
// [x row][weight row]. A tile product costs in proportion to A's rows, so a 9-row verify pays 9 of 16
// (code_notes.md#amx-tiles), and each C row is one x row's 16 outputs: the per-group scale and bias are
// vectors over the weight rows and the results go out as whole vectors.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
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

// Tiles 0 and 1: C of two column tiles (`rows` x rows x 16 floats); 2-4: x's pieces (A, `rows` x `depth`
// bfloat16); 5 and 6: decoded weights (B, depth / 2 pair rows x 16 columns). The depth is 32, or 16 for
// groups of 16 weights (each half of a decoded chunk its own product).
void configure(int rows, int depth) {
  thread_local int configured = -1;
  if (configured == rows * 64 + depth) return;
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 2; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = 64;
  }
  for (int t = 2; t < 5; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = static_cast<uint16_t>(2 * depth);
  }
  for (int t = 5; t < 7; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(depth / 2);
    cfg.colsb[t] = 64;
  }
  // the compiler does not see the tile-config load read `cfg`: without this barrier it may drop the stores
  // above as dead (a build where this function was not inlined loaded an all-zero config, and the first
  // tile instruction faulted)
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
  configured = rows * 64 + depth;
}

// Decoded weights run this many 32-element chunks ahead of the tile products that read them.
constexpr int kDecodeAhead = 2;

// Asks for `bytes` from `from` a share at a time: share `part` of `parts` (the cache lines of each share in
// order, the last share short).
inline void prefetch_share(const char* from, int64_t bytes, int part, int parts) {
  const int64_t lines = (bytes + 63) / 64, per_part = (lines + parts - 1) / parts;
  for (int64_t line = part * per_part; line < std::min(lines, (part + 1) * per_part); ++line) {
    __builtin_prefetch(from + 64 * line);
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

// The byte and word permutations that turn 16 weight rows' 32 weights into B's pair layout.
//
// 4 bits: a row's 16 bytes are its pairs (low nibble: element 2r, high: 2r + 1), so B row r is byte r of
// every row: a 16 x 16 byte transpose. Registers z[q] hold rows 4q .. 4q + 3 (16 bytes each). Stage one
// merges z[0], z[1] (and z[2], z[3]) into rows 0-7 (8-15) x bytes 8h .. 8h + 7, at [byte][row]; stage two
// merges those into B rows 4j .. 4j + 3 of each half, at [B row][column]. Then each B row's bytes spread
// to one 32-bit word a column, the low nibble in its low half and the high nibble in its high half, and a
// table gives their bfloat16 values.
//
// 8 bits: a pair is two bytes of a row, so B row r is word r of every row: a 16 x 16 word transpose in
// three stages of halving (registers z[q] hold rows 2q, 2q + 1 as 16 words each), then each B row's 32
// bytes become float32 and then bfloat16 (exact for 0 .. 255).
struct PairLayout {
  alignas(64) uint8_t bytes_stage1[2][64];
  alignas(64) uint8_t bytes_stage2[2][64];
  alignas(64) uint8_t nibble_spread[4][64];  // byte 16 s + i -> bytes 0 and 2 of word i
  alignas(64) uint16_t nibble_shifts[32];  // the high half of each word takes the high nibble
  alignas(64) uint16_t words[3][2][32];  // 8 bits: the word transpose's stages, by output half
  alignas(64) uint8_t byte_spread[4][64];  // 8 bits: byte 16 l + i -> word i
  PairLayout() {
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 8; ++b)
        for (int row = 0; row < 8; ++row)
          bytes_stage1[h][8 * b + row] = static_cast<uint8_t>((row < 4 ? 0 : 64) + 16 * (row % 4) + 8 * h + b);
    for (int j = 0; j < 2; ++j)
      for (int r = 0; r < 4; ++r)
        for (int i = 0; i < 16; ++i)
          bytes_stage2[j][16 * r + i] = static_cast<uint8_t>((i < 8 ? 0 : 64) + 8 * (4 * j + r) + i % 8);
    for (int s = 0; s < 4; ++s)
      for (int i = 0; i < 16; ++i) {
        nibble_spread[s][4 * i] = nibble_spread[s][4 * i + 2] = static_cast<uint8_t>(16 * s + i);
        nibble_spread[s][4 * i + 1] = nibble_spread[s][4 * i + 3] = 0;
      }
    for (int i = 0; i < 32; ++i) nibble_shifts[i] = (i % 2) ? 4 : 0;
    // stage one: rows 4m .. 4m + 3 x pairs 8h .. 8h + 7 at [row][pair]; stage two: rows 8b .. 8b + 7 x
    // pairs 4h .. 4h + 3 of those at [row][pair]; stage three: all 16 rows x pairs 2h, 2h + 1 at [pair][row]
    for (int h = 0; h < 2; ++h) {
      for (int row = 0; row < 4; ++row)
        for (int r = 0; r < 8; ++r)
          words[0][h][8 * row + r] = static_cast<uint16_t>((row < 2 ? 0 : 32) + 16 * (row % 2) + 8 * h + r);
      for (int row = 0; row < 8; ++row)
        for (int r = 0; r < 4; ++r)
          words[1][h][4 * row + r] = static_cast<uint16_t>((row < 4 ? 0 : 32) + 8 * (row % 4) + 4 * h + r);
      for (int e = 0; e < 2; ++e)
        for (int row = 0; row < 16; ++row)
          words[2][h][16 * e + row] = static_cast<uint16_t>((row < 8 ? 0 : 32) + 4 * (row % 8) + 2 * h + e);
    }
    for (int l = 0; l < 4; ++l)
      for (int i = 0; i < 16; ++i) {
        byte_spread[l][4 * i] = static_cast<uint8_t>(16 * l + i);
        byte_spread[l][4 * i + 1] = byte_spread[l][4 * i + 2] = byte_spread[l][4 * i + 3] = 0;
      }
  }
};
const PairLayout kPairs;

// 16 weight rows' 32 weights from element k, in B's pair layout: out[r][i] (32 bits) = the bfloat16 pair
// (element k + 2r, element k + 2r + 1) of weight row i (PairLayout).
template <int BITS>
inline void decode_pairs(const uint8_t* w, int64_t row_bytes, int k, uint16_t* out) {
  if constexpr (BITS == 4) {
    alignas(64) static const uint16_t kNibbleValues[32] = {0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0,
                                                           0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120, 0x4130,
                                                           0x4140, 0x4150, 0x4160, 0x4170};  // bfloat16 of 0..15
    const __m512i table = _mm512_load_si512(kNibbleValues);
    __m512i z[4];
    for (int q = 0; q < 4; ++q) {
      const uint8_t* src = w + (4 * q) * row_bytes + k / 2;
      __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
      for (int i = 1; i < 4; ++i) {
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * row_bytes)), i);
      }
      z[q] = v;
    }
    const __m512i shifts = _mm512_load_si512(kPairs.nibble_shifts);
    const __m512i nibble = _mm512_set1_epi16(0x0f);
    for (int h = 0; h < 2; ++h) {
      const __m512i stage1 = _mm512_load_si512(kPairs.bytes_stage1[h]);
      const __m512i top = _mm512_permutex2var_epi8(z[0], stage1, z[1]);
      const __m512i bottom = _mm512_permutex2var_epi8(z[2], stage1, z[3]);
      for (int j = 0; j < 2; ++j) {
        const __m512i rows = _mm512_permutex2var_epi8(top, _mm512_load_si512(kPairs.bytes_stage2[j]), bottom);
        for (int s = 0; s < 4; ++s) {
          __m512i v = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kPairs.nibble_spread[s]), rows);
          v = _mm512_and_si512(_mm512_srlv_epi16(v, shifts), nibble);
          _mm512_store_si512(out + 32 * (8 * h + 4 * j + s), _mm512_permutexvar_epi16(v, table));
        }
      }
    }
  } else {
    __m512i z[8];
    for (int q = 0; q < 8; ++q) {
      const uint8_t* src = w + (2 * q) * row_bytes + k;
      z[q] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + row_bytes)), 1);
    }
    __m512i s1[4][2], s2[2][2][2];  // s1[m][h]: rows 4m .. 4m + 3; s2[b][h][h2]: rows 8b .. 8b + 7
    for (int h = 0; h < 2; ++h) {
      const __m512i stage = _mm512_load_si512(kPairs.words[0][h]);
      for (int m = 0; m < 4; ++m) s1[m][h] = _mm512_permutex2var_epi16(z[2 * m], stage, z[2 * m + 1]);
    }
    for (int h2 = 0; h2 < 2; ++h2) {
      const __m512i stage = _mm512_load_si512(kPairs.words[1][h2]);
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < 2; ++h) s2[b][h][h2] = _mm512_permutex2var_epi16(s1[2 * b][h], stage, s1[2 * b + 1][h]);
    }
    for (int h3 = 0; h3 < 2; ++h3) {
      const __m512i stage = _mm512_load_si512(kPairs.words[2][h3]);
      for (int h = 0; h < 2; ++h)
        for (int h2 = 0; h2 < 2; ++h2) {
          const __m512i rows = _mm512_permutex2var_epi16(s2[0][h][h2], stage, s2[1][h][h2]);  // B rows r, r + 1
          __m512 f[4];
          for (int l = 0; l < 4; ++l) {
            const __m512i spread = _mm512_load_si512(kPairs.byte_spread[l]);
            f[l] = _mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(0x1111111111111111ull, spread, rows));
          }
          const int r = 8 * h + 4 * h2 + 2 * h3;
          _mm512_store_si512(out + 32 * r, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(f[1], f[0])));
          _mm512_store_si512(out + 32 * (r + 1), reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(f[3], f[2])));
        }
    }
  }
}

// The scales (or biases) of weight rows n .. n + 15 for groups [g, g + count), as float32: out[group][row]
// (16 rows of 16 floats), so that a group's values over the rows are one vector (the lanes past `count`
// are zero, and so are the rows past it).
void widen_columns(const Problem& p, const void* base, int n, int groups, int g, int count, float* out) {
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  __m512i rows[16];
  for (int i = 0; i < 16; ++i) {
    const int64_t at = static_cast<int64_t>(n + i) * groups + g;
    const auto* half = static_cast<const uint16_t*>(base) + at;
    if (p.scale_type == kScaleFloat16) {
      rows[i] = _mm512_castps_si512(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, half)));
    } else if (p.scale_type == kScaleBFloat16) {
      rows[i] = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, half)), 16);
    } else {
      rows[i] = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + at));
    }
  }
  transpose16(rows);
  for (int j = 0; j < 16; ++j) _mm512_store_si512(out + 16 * j, rows[j]);
}

// T column tiles of 16 weight rows from n (T = 1 or 2: two side by side share x's tiles) against every row
// tile of x. The weights are decoded kDecodeAhead chunks ahead of their products into `decoded`, a ring of
// `ring` chunks: with a ring of all of K's chunks the first row tile decodes and the later ones read them
// again; with a ring of kDecodeAhead + 1 every row tile decodes. The scales and biases are widened the same
// way: into `widened` ([scales, biases][column tile][group][weight row], every group rounded up to 16) once
// for all row tiles when it is given, else 16 groups at a time in every row tile. Each weight group's C
// tiles go to one of two buffers and are scaled into the sums while the next group's tile products run.
template <int T, int GS, int BITS>
void column_tiles(const Problem& p, int n, uint16_t* decoded, int ring, float* widened) {
  constexpr int kChunksPerGroup = GS >= 32 ? GS / 32 : 1;  // groups of 16: each chunk's halves, one group each
  constexpr int kGroupsPerChunk = GS >= 32 ? 1 : 32 / GS;
  constexpr int kChunkValues = 16 * 32;  // bfloat16 values of one decoded B tile
  const AmxRows& x = *p.amx;
  const int groups = p.K / GS, chunks = p.K / 32;
  const int64_t row_bytes = static_cast<int64_t>(p.K) * BITS / 8;
  const bool decode_once = ring >= chunks;
  alignas(64) float products[2][T][16 * 16];  // [group % 2][column tile][x row][weight row]
  alignas(64) float window[2][T][16 * 16];  // without `widened`: [scales, biases][column tile][group % 16][weight row]
  alignas(64) float sums[T][16][16];  // [column tile][x row][weight row]
  const int padded_groups = (groups + 15) / 16 * 16;
  // the scales (which = 0) or biases (1) of column tile u, group g: 16 floats over the weight rows
  auto widened_at = [&](int which, int u, int g) -> float* {
    if (widened != nullptr) return widened + ((static_cast<int64_t>(which) * T + u) * padded_groups + g) * 16;
    return window[which][u] + 16 * (g % 16);
  };
  auto widen = [&](int g) {  // groups g .. g + 15 into widened_at's place for them
    for (int u = 0; u < T; ++u) {
      const int count = std::min(16, groups - g);
      widen_columns(p, p.scales, n + 16 * u, groups, g, count, widened_at(0, u, g));
      widen_columns(p, p.biases, n + 16 * u, groups, g, count, widened_at(1, u, g));
    }
  };
  if (widened != nullptr) {
    for (int g = 0; g < groups; g += 16) widen(g);
  }
  // The next 16 x T weight rows (the thread's next columns, in this task or the next one it takes: run_problems
  // gives a thread adjacent tasks) and their scales and biases are asked for while these decode, a share a
  // chunk: the hardware prefetchers alone leave the product waiting on memory. Their addresses and sizes are
  // worked out here, once: a helper that worked them out from the Problem at each chunk made a 9-row
  // 1536 x 576 product 76 -> 115 us on two threads.
  const int64_t next_scales = static_cast<int64_t>(n + 16 * T) * groups * scale_bytes(p.scale_type);
  const int64_t block_scale_bytes = 16 * T * groups * scale_bytes(p.scale_type);
  const char* next_weights = reinterpret_cast<const char*>(p.w) + (n + 16 * T) * row_bytes;
  auto decode = [&](int c) {
    for (int u = 0; u < T; ++u) {
      uint16_t* out = decoded + (static_cast<int64_t>(c % ring) * T + u) * kChunkValues;
      decode_pairs<BITS>(p.w + (n + 16 * u) * row_bytes, row_bytes, 32 * c, out);
    }
    prefetch_share(next_weights, 16 * T * row_bytes, c, chunks);
    prefetch_share(static_cast<const char*>(p.scales) + next_scales, block_scale_bytes, c, chunks);
    prefetch_share(static_cast<const char*>(p.biases) + next_scales, block_scale_bytes, c, chunks);
  };
  const int tile_rows = amx_tile_rows(p.M);
  for (int t = 0; t < x.row_tiles; ++t) {
    const int rows = std::min(tile_rows, p.M - tile_rows * t);
    const uint32_t* pieces = x.pieces + static_cast<int64_t>(t) * x.chunks * kAmxChunkWords;
    const float* x_sums = x.sums + static_cast<int64_t>(t) * x.groups * 16;
    std::memset(sums, 0, sizeof(sums));
    auto add_group = [&](int g) {  // sums += scale * (the group's tile sums) + bias * (x's group sums)
      for (int u = 0; u < T; ++u) {
        const __m512 scale = _mm512_load_ps(widened_at(0, u, g)), bias = _mm512_load_ps(widened_at(1, u, g));
        const float* group = products[g % 2][u];
        for (int j = 0; j < rows; ++j) {
          __m512 sum = _mm512_fmadd_ps(scale, _mm512_load_ps(group + 16 * j), _mm512_load_ps(sums[u][j]));
          sum = _mm512_fmadd_ps(bias, _mm512_set1_ps(x_sums[g * 16 + j]), sum);
          _mm512_store_ps(sums[u][j], sum);
        }
      }
    };
    const bool decoding = t == 0 || !decode_once;
    if (decoding) {
      for (int c = 0; c < kDecodeAhead && c < chunks; ++c) decode(c);
    }
    for (int g = 0; g < groups; ++g) {
      if (g % 16 == 0 && widened == nullptr) {
        if (g > 0) add_group(g - 1);  // before its scales are replaced
        widen(g);
      }
      _tile_zero(0);
      if constexpr (T == 2) _tile_zero(1);
      for (int kc = 0; kc < kChunksPerGroup; ++kc) {
        const int c = g / kGroupsPerChunk * kChunksPerGroup + kc, half = g % kGroupsPerChunk;
        if (decoding && half == 0 && c + kDecodeAhead < chunks) decode(c + kDecodeAhead);
        // a group of 16: its half of the chunk's B pair rows (8 of 16) and of x's A columns (16 of 32)
        const uint16_t* weights = decoded + static_cast<int64_t>(c % ring) * T * kChunkValues + half * kChunkValues / 2;
        const uint32_t* a = pieces + static_cast<int64_t>(c) * kAmxChunkWords + half * 8;
        _tile_loadd(5, weights, 64);
        if constexpr (T == 2) _tile_loadd(6, weights + kChunkValues, 64);
        _tile_loadd(2, a, 64);
        _tile_dpbf16ps(0, 2, 5);
        if constexpr (T == 2) _tile_dpbf16ps(1, 2, 6);
        _tile_loadd(3, a + 256, 64);
        _tile_dpbf16ps(0, 3, 5);
        if constexpr (T == 2) _tile_dpbf16ps(1, 3, 6);
        _tile_loadd(4, a + 512, 64);
        _tile_dpbf16ps(0, 4, 5);
        if constexpr (T == 2) _tile_dpbf16ps(1, 4, 6);
      }
      _tile_stored(0, products[g % 2][0], 64);
      if constexpr (T == 2) _tile_stored(1, products[g % 2][1], 64);
      if (g > 0 && (g % 16 != 0 || widened != nullptr)) add_group(g - 1);
    }
    add_group(groups - 1);
    for (int u = 0; u < T; ++u) {
      for (int j = 0; j < rows; ++j) {
        _mm512_storeu_ps(p.y + static_cast<int64_t>(tile_rows * t + j) * p.N + n + 16 * u, _mm512_load_ps(sums[u][j]));
      }
    }
  }
}

template <int GS, int BITS>
void amx_columns(const Problem& p, int n0, int n1) {
  configure(amx_tile_rows(p.M), GS >= 32 ? 32 : GS);  // A and C as tall as a row tile (spare rows are zero)
  constexpr int kSmallRing = kDecodeAhead + 1;
  alignas(64) uint16_t small[kSmallRing * 2 * 16 * 32];
  uint16_t* decoded = small;
  int ring = kSmallRing;
  float* widened = nullptr;
  if (p.amx->row_tiles > 1) {
    // decode and widen once for all row tiles: a ring of all of K's chunks and the column tiles' scales and
    // biases for every group, in one buffer kept per thread
    thread_local void* whole = nullptr;
    thread_local size_t capacity = 0;  // bytes
    const int whole_ring = std::max(p.K / 32, kSmallRing);
    const size_t ring_bytes = static_cast<size_t>(whole_ring) * 2 * 16 * 32 * sizeof(uint16_t);
    const size_t widened_bytes = static_cast<size_t>(2 * 2 * ((p.K / GS + 15) / 16 * 16) * 16) * sizeof(float);
    const size_t need = ring_bytes + widened_bytes;
    if (need > capacity) {
      std::free(whole);
      whole = std::aligned_alloc(64, need);
      capacity = whole != nullptr ? need : 0;
    }
    if (whole != nullptr) {  // else (no memory) every row tile decodes and widens again
      decoded = static_cast<uint16_t*>(whole);
      ring = whole_ring;
      widened = reinterpret_cast<float*>(static_cast<char*>(whole) + ring_bytes);
    }
  }
  if (n0 + 16 <= n1) {  // the first columns' weights, scales and biases: what the tiles read first
    const int64_t row_bytes = static_cast<int64_t>(p.K) * BITS / 8, group_bytes = (p.K / GS) * scale_bytes(p.scale_type);
    const int first = std::min(32, n1 - n0);
    prefetch_share(reinterpret_cast<const char*>(p.w) + n0 * row_bytes, first * row_bytes, 0, 1);
    prefetch_share(static_cast<const char*>(p.scales) + n0 * group_bytes, first * group_bytes, 0, 1);
    prefetch_share(static_cast<const char*>(p.biases) + n0 * group_bytes, first * group_bytes, 0, 1);
  }
  int n = n0;
  for (; n + 32 <= n1; n += 32) column_tiles<2, GS, BITS>(p, n, decoded, ring, widened);
  for (; n + 16 <= n1; n += 16) column_tiles<1, GS, BITS>(p, n, decoded, ring, widened);
}

}  // namespace

void amx_prepare(const float* x, int M, int K, int group_size, uint32_t* pieces, float* sums) {
  const int row_tiles = amx_row_tiles(M), tile_rows = amx_tile_rows(M), chunks = K / 32, groups = K / group_size;
  // Spare rows of the last row tile are zero (its tiles are as tall as the others; their results are
  // dropped), and so are their group sums.
  std::memset(sums, 0, sizeof(float) * row_tiles * groups * 16);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int t = 0; t < row_tiles; ++t) {
    const int rows = std::min(tile_rows, M - tile_rows * t);
    for (int c = 0; c < chunks; ++c) {
      auto* out = reinterpret_cast<uint16_t*>(pieces + (static_cast<int64_t>(t) * chunks + c) * kAmxChunkWords);
      for (int j = 0; j < tile_rows; ++j) {  // A row j of each piece: x row tile_rows * t + j, elements 32 c ..
        if (j >= rows) {
          for (int s = 0; s < 3; ++s) _mm512_store_si512(out + s * 512 + 32 * j, _mm512_setzero_si512());
          continue;
        }
        const float* src = x + static_cast<int64_t>(tile_rows * t + j) * K + 32 * c;
        __m512 first = _mm512_loadu_ps(src), second = _mm512_loadu_ps(src + 16);
        for (int s = 0; s < 3; ++s) {  // hi, mid, lo: each the top 16 bits of what is left (exact: each
          // subtraction leaves at most 16, then 8 significant bits)
          const __m512i top_first = _mm512_and_si512(_mm512_castps_si512(first), high_half);
          const __m512i top_second = _mm512_and_si512(_mm512_castps_si512(second), high_half);
          first = _mm512_sub_ps(first, _mm512_castsi512_ps(top_first));
          second = _mm512_sub_ps(second, _mm512_castsi512_ps(top_second));
          const __m256i words_first = _mm512_cvtepi32_epi16(_mm512_srli_epi32(top_first, 16));
          const __m256i words_second = _mm512_cvtepi32_epi16(_mm512_srli_epi32(top_second, 16));
          _mm512_store_si512(out + s * 512 + 32 * j,
                             _mm512_inserti64x4(_mm512_castsi256_si512(words_first), words_second, 1));
        }
      }
    }
    for (int j = 0; j < rows; ++j) {
      const float* src = x + static_cast<int64_t>(tile_rows * t + j) * K;
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
    case 16 * 16 + 8: amx_columns<16, 8>(p, n0, tiled); break;
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
