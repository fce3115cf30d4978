// The CPU quantized matmul kernels: y[M, N] = x[M, K] @ dequantize(w)[N, K]^T for MLX's affine format.
//
// Weights are MLX's packed uint32 rows (bits 4 or 8, element j of a word at bits bits*j), with one scale
// and bias per group of `group_size` consecutive elements of a row: w = scale * q + bias. Scales and biases
// are read as stored (float32, float16 or bfloat16; a half value widens to float32 exactly), so a checkpoint's
// half-precision scales cost half the bytes a float32 copy would.
// Each kernel computes the output columns [n0, n1) for every row of x; the caller splits columns over
// threads. For 4 bits the kernels read x in "split" order (see split_rows): each block of 2V elements
// holds its even elements first, then its odd ones, which is the order a byte's low and high nibbles
// come out in.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

namespace mlxd_qmm {

enum ScaleType { kScaleFloat32 = 0, kScaleFloat16 = 1, kScaleBFloat16 = 2 };

// x quantized to int8 for the int8-activation kernels: each row holds Kpad = K rounded up to 128 elements;
// for 4-bit weights each chunk of 128 holds its 64 even elements, then its 64 odd ones (the order of a
// chunk's 64 bytes' low and high nibbles), for 8-bit weights the elements are in order. Each block of
// int8_block() elements has one scale, x ~ scale * q. The weights' biases multiply exact float sums of x over
// each weight group.
// Elements of x that share one int8 scale (a multiple of 8 that divides every group size): 8, or 16 or 32 where
// MLXD_INT8_BLOCK asks (read once; llama.cpp's Q8 activations use 32). Larger blocks leave the column tiles fewer
// conversions and scalings a row, for a coarser rounding of x.
int int8_block();

// The padded sizes of Int8Rows for K elements and `groups` weight groups a row.
inline int int8_padded_k(int K) { return (K + 127) / 128 * 128; }
inline int int8_padded_groups(int groups) { return (groups + 15) / 16 * 16; }

// How a product's x meets its weights: float32 (kInt8Off), rounded to int8 against weights in MLX's order
// (kInt8Rows), or rounded to int8 against weights put in column-block order by interleave_columns (kInt8Columns:
// each block of 16 output columns of a part holds its packed words as [K * bits / 32][16] and its scales and
// biases as [groups][16]; a last block of fewer columns likewise with its own count).
enum Int8Mode { kInt8Off = 0, kInt8Rows = 1, kInt8Columns = 2 };

struct Int8Rows {
  const int8_t* q;  // [M, Kpad]
  const float* lane_scales;  // [M, Kpad / 8]: the block scale of each 8 elements (one int32 lane's worth)
  const float* group_sums;  // [M, Gpad]: sum of x over each weight group, Gpad = groups rounded up to 16
  int Kpad, Gpad;
  int block = 8;  // int8_block() when x was rounded: elements of x that share one scale
};

// x prepared for the AMX kernel (amx_prepare): per row tile (up to 16 x rows) and chunk of 32 elements, three
// A tiles (x's hi, mid and lo bfloat16 pieces: row j holds x row j's 32 elements in order; rows past x's
// are zero), and per weight group the exact-order float sums of x.
constexpr int kAmxChunkWords = 3 * 16 * 16;  // uint32 words of one chunk's three A tiles
inline int amx_row_tiles(int M) { return (M + 15) / 16; }
// x rows in each row tile: M spread evenly (a tile product's time follows its rows; the last tile may hold
// fewer, its spare rows zero).
inline int amx_tile_rows(int M) { return (M + amx_row_tiles(M) - 1) / amx_row_tiles(M); }

struct AmxRows {
  const uint32_t* pieces;  // [row_tiles][K / 32][kAmxChunkWords]
  const float* sums;  // [row_tiles][K / group_size][16]
  int row_tiles, chunks, groups;
};

// Whether the float kernel's tiles of 3-6 rows split their blocks' halves as the tall tiles do (split_rows), by
// weight width: bit 0 for 4-bit weights, bit 1 for 8-bit. The same bits either way; which is faster depends on
// the CPU (faster on a Zen 5 EPYC, slower on a Zen 4 one), so the engine times both forms at load and sets this
// (set_small_split_tiles; docs/benchmark_results/code_notes.md#small-split-tiles). Off until set.
inline std::atomic<int> small_split_choice{0};
inline int small_split_bit(int bits) { return bits == 8 ? 2 : 1; }

struct Problem {
  const float* x;  // [M, K], row-major; for 4 bits in split order with block `split_block`
  const uint8_t* w;  // [N, K * bits / 8] bytes
  const void* scales;  // [N, K / group_size], of scale_type
  const void* biases;  // [N, K / group_size], of scale_type
  float* y;  // [M, N]
  int M, N, K, group_size, bits;
  int scale_type;  // ScaleType
  const Int8Rows* int8 = nullptr;  // set: the int8-activation kernel runs (x unused)
  bool columns = false;  // with int8: the weights are in column-block order (kInt8Columns)
  const AmxRows* amx = nullptr;  // set: the AMX kernel runs (x, in split order, serves columns past its tiles)
  // Names this x's contents for one dispatch (`next_x_version`; 0: unnamed), so a kernel thread may reuse a
  // copy of x it made for an earlier task of the same dispatch.
  uint64_t x_version = 0;
  // small_split_choice when the product was set up: one choice for all of its tasks
  int small_split = small_split_choice.load(std::memory_order_relaxed);
};

// A fresh x_version: one per dispatch of products over the same x (never 0).
uint64_t next_x_version();

// IEEE half to float32 (exact: every half value is a float32 value), for builds without F16C.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // infinity, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // zero
  } else {  // subnormal: shift its leading one into the implicit bit
    uint32_t shifts = 0;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      ++shifts;
    }
    bits = sign | ((113 - shifts) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// bfloat16 to float32: its bits are the top half of a float32's.
inline float bfloat16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// How far ahead of its reads a kernel asks for packed weights (and, as far in weights, their scales and
// biases): the hardware prefetchers alone leave a thread reading packed weights well below the memory's
// speed (code_notes.md#weight-prefetch).
constexpr int kPrefetchBytes = 2048;

// How many weight groups kPrefetchBytes of packed weights hold: how far ahead scales and biases are asked for.
constexpr int64_t prefetch_groups_ahead(int group_size, int bits) {
  return static_cast<int64_t>(kPrefetchBytes) * 8 / (group_size * bits);
}

// Bytes of one stored scale or bias.
inline int64_t scale_bytes(int scale_type) {
  return scale_type == kScaleFloat32 ? 4 : 2;
}

// Asks for the scale and bias of group `group` (an index into the problem's scale and bias arrays).
inline void prefetch_scales(const Problem& p, int64_t group) {
  const int64_t at = group * scale_bytes(p.scale_type);
  __builtin_prefetch(static_cast<const char*>(p.scales) + at);
  __builtin_prefetch(static_cast<const char*>(p.biases) + at);
}

using KernelFn = void (*)(const Problem&, int n0, int n1);

struct Isa {
  const char* name;  // "avx512", "avx2", "neon", "portable"
  int lanes;  // float lanes of one vector: the split block is 2 * lanes
  KernelFn kernel;
};

// Kernels compiled for each instruction set (each in its own translation unit, with its own flags).
void kernel_portable(const Problem& p, int n0, int n1);
int lanes_portable();
#if defined(__x86_64__) || defined(_M_X64)
void kernel_avx2(const Problem& p, int n0, int n1);
void kernel_avx512(const Problem& p, int n0, int n1);
void kernel_vnni_int8(const Problem& p, int n0, int n1);
// quantize_rows_int8's blocks (of `block` elements) of one row, 8 elements a vector (the same bytes and scales as
// its scalar loop; K a multiple of 8; the caller zeroes the padding). Where the int8 kernel runs (AVX-512 VNNI).
void quantize_blocks_int8_avx512(const float* src, int K, int block, bool split, int8_t* dst, float* lane_scales);
#endif

// The AMX kernel (whole tiles of 16 columns; the rest through kernel_avx512) and its preparation of x,
// built where the compiler takes AMX; amx_kernel() is null unless this CPU and OS run it (and
// MLXD_QMM_AMX is not "0").
void kernel_amx(const Problem& p, int n0, int n1);
void amx_prepare(const float* x, int M, int K, int group_size, uint32_t* pieces, float* sums);
KernelFn amx_kernel();
// Fewer rows than this stay on the vector kernel: one row tile of AMX costs about as much at any row count,
// most of it decoding the weights into tile layout, which costs 8-bit weights more (a word transpose and two
// conversions) while the vector kernel reads them as they are (code_notes.md#amx-rows).
constexpr int amx_min_rows(int bits) { return bits == 8 ? 8 : 6; }

// The int8-activation kernel for 4-bit and 8-bit weights (AVX-512 VNNI), where this build and CPU have it,
// else null.
KernelFn int8_kernel();

// Quantizes x [M, K] (dense float32) into the buffers of `rows` (sized as Int8Rows says), in blocks of `block`
// elements (int8_block()); `split`: the 4-bit order.
void quantize_rows_int8(const float* x, int M, int K, int group_size, int block, bool split, int8_t* q,
                        float* lane_scales, float* group_sums);

// The best kernel the running CPU supports (or the one MLXD_QMM_ISA names, when the CPU has it).
const Isa& select_isa();

// x rows into the split order of blocks of `block` elements (block = 2 * lanes), for 4-bit kernels.
void split_rows(const float* x, float* out, int M, int K, int block);

}  // namespace mlxd_qmm
