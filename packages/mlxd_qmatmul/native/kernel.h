// The CPU quantized matmul kernels: y[M, N] = x[M, K] @ dequantize(w)[N, K]^T for MLX's affine format.
//
// Weights are MLX's packed uint32 rows (bits 4 or 8, element j of a word at bits bits*j), with one float32
// scale and bias per group of `group_size` consecutive elements of a row: w = scale * q + bias.
// Each kernel computes the output columns [n0, n1) for every row of x; the caller splits columns over
// threads. For 4 bits the kernels read x in "split" order (see split_rows): each block of 2V elements
// holds its even elements first, then its odd ones, which is the order a byte's low and high nibbles
// come out in.
#pragma once

#include <cstdint>

namespace mlxd_qmm {

struct Problem {
  const float* x;  // [M, K], row-major; for 4 bits in split order with block `split_block`
  const uint8_t* w;  // [N, K * bits / 8] bytes
  const float* scales;  // [N, K / group_size]
  const float* biases;  // [N, K / group_size]
  float* y;  // [M, N]
  int M, N, K, group_size, bits;
};

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
#endif

// The best kernel the running CPU supports (or the one MLXD_QMM_ISA names, when the CPU has it).
const Isa& select_isa();

// x rows into the split order of blocks of `block` elements (block = 2 * lanes), for 4-bit kernels.
void split_rows(const float* x, float* out, int M, int K, int block);

}  // namespace mlxd_qmm
