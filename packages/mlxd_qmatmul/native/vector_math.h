// MLX's CPU exp and sigmoid (mlx/backend/cpu/simd/math.h, unary_ops.h), computed 8 floats at a time with
// the CPU's FMA where it has AVX2: bit-identical to MLX's results (the same operations in the same order;
// a fused multiply-add rounds once in hardware as in software). MLX's x86-64 wheel runs them one float at
// a time through a software fma per polynomial term: about 13 ns an exp.
#pragma once

#include <cstdint>

namespace mlxd_qmm {

// The largest of x[0 .. n) that is not NaN (the lowest float when there is none): what a left-to-right std::max from
// the lowest float gives, in lanes where AVX2 is there (a maximum does not depend on the order, but for the sign of
// a zero, which exp(x - largest) does not see).
float largest(const float* x, int64_t n);

// x[i] = exp(x[i] - shift) for i < n, as MLX's exp; returns their sum (summed in lanes: the order differs
// from a left-to-right sum, within float32 rounding of it).
float exp_shifted_sum(float* x, int64_t n, float shift);

// out[i] = (gate[i] * sigmoid(gate[i])) * up[i]: mlx.nn.silu(gate) * up, as mlx-lm's swiglu; bit-identical.
void swiglu_rows(const float* gate, const float* up, float* out, int64_t n);

// out[s] = the dot product of q and k + s * k_stride for s < S, over n dense floats each (attention's scores of
// one query; eight lanes of partial sums where AVX2 is there, else eight scalar partial sums: within float32
// rounding of a left-to-right sum).
void dots(const float* q, const float* k, int64_t k_stride, int64_t S, int64_t n, float* out);

// acc[d] = sum over s < S of p[s] * v[s * v_stride + d], for d < n (attention's weighted values).
void weighted_sum(const float* p, const float* v, int64_t v_stride, int64_t S, int64_t n, float* acc);

// acc[d] += the same, continuing weighted_sum's sums key by key: keys [0, S) taken in pieces, each added to
// what the pieces before left in acc (starting from zeros), give weighted_sum's result to the bit.
void weighted_sum_add(const float* p, const float* v, int64_t v_stride, int64_t S, int64_t n, float* acc);

// weighted_sum_add for `rows` rows of weights (row r's at p + r * p_stride, its sums at acc + r * acc_stride) over
// the same values: each row's result to the bit what weighted_sum_add gives it alone (where AVX-512 is there and n
// is a multiple of 16, each value row is loaded once for several query rows).
void weighted_sums_add(const float* p, int64_t p_stride, int rows, const float* v, int64_t v_stride, int64_t S,
                       int64_t n, float* acc, int64_t acc_stride);
void weighted_sums_add(const float* p, int64_t p_stride, int rows, const uint16_t* v, int64_t v_stride, int64_t S,
                       int64_t n, float* acc, int64_t acc_stride);

// dst[r * n + d] = the half src[r * src_stride + d] as a float, for r < rows and d < n: rows of float16 keys
// or values widened (exactly) for the loops above.
void widen_halves(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst);

// dst[i] = src[i] as an IEEE half for i < n, rounded to nearest even as MLX's cast rounds it, except that a value
// past half's range (|x| > 65504) becomes +-65504 rather than infinity; NaN stays NaN. Keys and values written
// into a float16 cache (write_rows).
void narrow_to_halves(const float* src, int64_t n, uint16_t* dst);

// dots and weighted_sum_add over float16 keys or values (IEEE halves), widened as they are read: the results
// of the float32 forms over the widened values, to the bit.
void dots(const float* q, const uint16_t* k, int64_t k_stride, int64_t S, int64_t n, float* out);
void weighted_sum_add(const float* p, const uint16_t* v, int64_t v_stride, int64_t S, int64_t n, float* acc);

namespace detail {
void dots_half_avx2(const float* q, const uint16_t* k, int64_t k_stride, int64_t S, int64_t n, float* out);
void weighted_sum_add_half_avx2(const float* p, const uint16_t* v, int64_t v_stride, int64_t S, int64_t n, float* acc);
void widen_halves_f16c(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t n, float* dst);
void narrow_to_halves_f16c(const float* src, int64_t n, uint16_t* dst);  // n a multiple of 8
void dots_avx2(const float* q, const float* k, int64_t k_stride, int64_t S, int64_t n, float* out);
void weighted_sum_add_avx2(const float* p, const float* v, int64_t v_stride, int64_t S, int64_t n, float* acc);
float exp_shifted_sum_avx2(float* x, int64_t n, float shift);
float largest_avx2(const float* x, int64_t n);
void weighted_sums_add_avx512(const float* p, int64_t p_stride, int rows, const float* v, int64_t v_stride, int64_t S,
                              int64_t n, float* acc, int64_t acc_stride);
void weighted_sums_add_avx512(const float* p, int64_t p_stride, int rows, const uint16_t* v, int64_t v_stride,
                              int64_t S, int64_t n, float* acc, int64_t acc_stride);
void swiglu_rows_avx2(const float* gate, const float* up, float* out, int64_t n);
}  // namespace detail

}  // namespace mlxd_qmm
