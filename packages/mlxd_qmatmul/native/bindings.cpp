#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "attention.h"
#include "block.h"
#include "dequantized_rows.h"
#include "gather.h"
#include "qmatmul.h"
#include "rms_norm.h"
#include "rope.h"
#include "swiglu.h"
#include "write_rows.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_ext, m) {
  m.doc() = "mlxd's CPU kernels: quantized matmul for MLX's affine format (4 and 8 bits), RoPE, RMSNorm, attention, SwiGLU";
  m.def("quantized_matmul", &mlxd_qmm::quantized_matmul, "x"_a, "w"_a, "scales"_a, "biases"_a,
        "group_size"_a, "bits"_a, nb::kw_only(), "int8_activations"_a = 0, "stream"_a = nb::none(),
        "x @ dequantize(w, scales, biases).T on the CPU kernels (transpose=True semantics of "
        "mx.quantized_matmul); float32 math, the result in x's dtype.");
  m.def("quantized_matmul_split", &mlxd_qmm::quantized_matmul_split, "x"_a, "w"_a, "scales"_a, "biases"_a,
        "group_size"_a, "bits"_a, "sizes"_a, nb::kw_only(), "int8_activations"_a = 0, "stream"_a = nb::none(),
        "quantized_matmul for a weight packed from several layers' rows: one output per entry of sizes "
        "(each layer's output count, in order), each equal to that layer's own product.");
  m.def("gather_quantized_matmul", &mlxd_qmm::gather_quantized_matmul, "x"_a, "w"_a, "scales"_a, "biases"_a,
        "experts"_a, "group_size"_a, "bits"_a, nb::kw_only(), "stream"_a = nb::none(),
        "A mixture-of-experts product: row r of x [..., K] times dequantize(w[experts[r]]).T, w [E, N, K * bits "
        "/ 32] (mx.gather_qmm with transpose=True and rhs indices one a row); float32 math, the result [..., N] "
        "in x's dtype; a row whose expert is out of range comes out as zeros.");
  m.def("rope", &mlxd_qmm::rope, "x"_a, "offset"_a, "dims"_a, "traditional"_a, "base"_a, "scale"_a,
        nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.rope(x, dims, traditional=, base=, scale=, offset=) as one CPU op: float32 x, an integer "
        "offset (scalar or one per batch entry); bit-identical to MLX's CPU result.");
  m.def("rms_norm", &mlxd_qmm::rms_norm, "x"_a, "weight"_a, "eps"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.rms_norm(x, weight, eps) as one CPU op: float32 x and weight; bit-identical to MLX's CPU "
        "result.");
  m.def("attention", &mlxd_qmm::attention, "q"_a, "k"_a, "v"_a, "scale"_a, "causal"_a, "mask"_a = nb::none(),
        nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.scaled_dot_product_attention for a few float32 queries as one CPU op: no mask, causal, or a "
        "boolean / additive mask broadcasting to [B, heads, queries, keys].");
  m.def("swiglu", &mlxd_qmm::swiglu, "gate"_a, "up"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mlx-lm's swiglu(gate, up) = silu(gate) * up as one CPU op: float32 arrays of one shape; "
        "bit-identical to MLX's CPU result.");
  m.def("dequantized_rows", &mlxd_qmm::dequantized_rows, "w"_a, "scales"_a, "biases"_a, "ids"_a, "group_size"_a,
        "bits"_a, nb::kw_only(), "column_blocks"_a = false, "stream"_a = nb::none(),
        "Rows ids of a packed affine matrix (bits 4 or 8) dequantized to float32 as one CPU op: the same bits as "
        "mx.dequantize of the gathered rows with float32 scales and biases; an id out of range gives zeros.");
  m.def("write_rows", &mlxd_qmm::write_rows, "buffer"_a, "rows"_a, "index"_a, nb::kw_only(), "stream"_a = nb::none(),
        "buffer with rows [N, D] written at its rows index [N] (int32; buffer viewed as [size / D, D]) as one "
        "CPU op, in place when nothing else holds the buffer: a KV cache's update for rows at different "
        "positions.");
  m.def(
      "attention_input",
      [](const mx::array& x, const mx::array& norm_weight, float eps, const mx::array& w, const mx::array& scales,
         const mx::array& biases, int group_size, int bits, const std::vector<int>& sizes, int heads, int kv_heads,
         int head_dim, const mx::array& offset, int rope_dims, bool traditional, float base, float rope_scale,
         const std::optional<mx::array>& bias, const std::optional<mx::array>& q_norm,
         const std::optional<mx::array>& k_norm, float qk_eps, int int8_activations,
         const std::optional<mx::array>& lengths) {
        return mlxd_qmm::attention_input(x, norm_weight, eps,
                                         {w, scales, biases, group_size, bits, sizes, int8_activations}, heads,
                                         kv_heads, head_dim, offset, {rope_dims, traditional, base, rope_scale},
                                         {bias, q_norm, k_norm, qk_eps}, lengths);
      },
      "x"_a, "norm_weight"_a, "eps"_a, "w"_a, "scales"_a, "biases"_a, "group_size"_a, "bits"_a, "sizes"_a, "heads"_a,
      "kv_heads"_a, "head_dim"_a, "offset"_a, "rope_dims"_a, "traditional"_a, "base"_a, "rope_scale"_a,
      "bias"_a.none() = nb::none(), "q_norm"_a.none() = nb::none(), "k_norm"_a.none() = nb::none(), "qk_eps"_a = 0.0f,
      "int8_activations"_a = 0, "lengths"_a.none() = nb::none(),
      "A llama-style layer's attention input as one CPU op: rms_norm, the packed q/k/v product (plus its bias; "
      "query and key heads through their norms), RoPE; returns (q, k, v) as [B, heads, L, head_dim], "
      "bit-identical to those ops run one by one. lengths (one count per batch entry): only each entry's first "
      "tokens are computed, the rest (padding) come out as zeros.");
  m.def(
      "block_output",
      [](const mx::array& x, const mx::array& q, const mx::array& keys, const mx::array& values,
         const std::optional<mx::array>& mask, bool causal, float attention_scale, const mx::array& o_w,
         const mx::array& o_scales, const mx::array& o_biases, int o_group_size, int o_bits,
         const mx::array& norm_weight, float eps, const mx::array& gu_w, const mx::array& gu_scales,
         const mx::array& gu_biases, int gu_group_size, int gu_bits, int hidden, const mx::array& d_w,
         const mx::array& d_scales, const mx::array& d_biases, int d_group_size, int d_bits, int o_int8,
         int gu_int8, int d_int8, const std::optional<mx::array>& lengths) {
        const int D = x.ndim() == 3 ? x.shape(2) : 0;
        return mlxd_qmm::block_output(x, q, keys, values, mask, causal, attention_scale,
                                      {o_w, o_scales, o_biases, o_group_size, o_bits, {D}, o_int8}, norm_weight, eps,
                                      {gu_w, gu_scales, gu_biases, gu_group_size, gu_bits, {hidden, hidden}, gu_int8},
                                      {d_w, d_scales, d_biases, d_group_size, d_bits, {D}, d_int8}, lengths);
      },
      "x"_a, "q"_a, "keys"_a, "values"_a, "mask"_a.none(), "causal"_a, "attention_scale"_a, "o_w"_a, "o_scales"_a,
      "o_biases"_a, "o_group_size"_a, "o_bits"_a, "norm_weight"_a, "eps"_a, "gu_w"_a, "gu_scales"_a, "gu_biases"_a,
      "gu_group_size"_a, "gu_bits"_a, "hidden"_a, "d_w"_a, "d_scales"_a, "d_biases"_a, "d_group_size"_a, "d_bits"_a,
      "o_int8"_a = 0, "gu_int8"_a = 0, "d_int8"_a = 0, "lengths"_a.none() = nb::none(),
      "A llama-style layer after its cache update as one CPU op: h = x + o(attention(q, keys, values)); returns "
      "h + down(swiglu(gate, up)) with gate, up from rms_norm(h) @ gate_up; bit-identical to those ops run one by "
      "one. lengths (one count per batch entry): only each entry's first tokens are computed, the rest (padding) "
      "come out as x.");
  m.def(
      "block_output_span",
      [](const mx::array& x, const mx::array& q, const mx::array& k_buf, const mx::array& v_buf, int first_slot,
         int read_length, const std::optional<mx::array>& mask, bool causal, float attention_scale,
         const mx::array& o_w, const mx::array& o_scales, const mx::array& o_biases, int o_group_size, int o_bits,
         const mx::array& norm_weight, float eps, const mx::array& gu_w, const mx::array& gu_scales,
         const mx::array& gu_biases, int gu_group_size, int gu_bits, int hidden, const mx::array& d_w,
         const mx::array& d_scales, const mx::array& d_biases, int d_group_size, int d_bits, int o_int8,
         int gu_int8, int d_int8, const std::optional<mx::array>& lengths) {
        const int D = x.ndim() == 3 ? x.shape(2) : 0;
        const int rows = q.ndim() == 4 ? q.shape(0) : 0;
        return mlxd_qmm::block_output_span(
            x, q, k_buf, v_buf, {first_slot, rows, read_length}, mask, causal, attention_scale,
            {o_w, o_scales, o_biases, o_group_size, o_bits, {D}, o_int8}, norm_weight, eps,
            {gu_w, gu_scales, gu_biases, gu_group_size, gu_bits, {hidden, hidden}, gu_int8},
            {d_w, d_scales, d_biases, d_group_size, d_bits, {D}, d_int8}, lengths);
      },
      "x"_a, "q"_a, "k_buf"_a, "v_buf"_a, "first_slot"_a, "read_length"_a, "mask"_a.none(), "causal"_a,
      "attention_scale"_a, "o_w"_a, "o_scales"_a, "o_biases"_a, "o_group_size"_a, "o_bits"_a, "norm_weight"_a,
      "eps"_a, "gu_w"_a, "gu_scales"_a, "gu_biases"_a, "gu_group_size"_a, "gu_bits"_a, "hidden"_a, "d_w"_a,
      "d_scales"_a, "d_biases"_a, "d_group_size"_a, "d_bits"_a, "o_int8"_a = 0, "gu_int8"_a = 0,
      "d_int8"_a = 0, "lengths"_a.none() = nb::none(),
      "block_output over the layer's whole key and value buffers [slots, kv_heads, capacity, dim]: the attention "
      "reads slots [first_slot, first_slot + batch) at positions [0, read_length), as block_output reads those "
      "slices of them; the same bits, without the slice ops.");
  m.def("int8_available", &mlxd_qmm::int8_available, "bits"_a,
        "Whether products of this many bits run on the int8-activation kernel when asked.");
  m.def("kernel_isa", &mlxd_qmm::kernel_isa, "The instruction set the kernels use on this CPU.");
  m.def("int8_block", &mlxd_qmm::int8_block,
        "Elements of x that share one scale on the int8-activation kernel (8; MLXD_INT8_BLOCK=16 or 32 asks for more).");
  m.def("amx_available", &mlxd_qmm::amx_available,
        "Whether products of several rows run on the AMX kernel here (CPU, OS grant, MLXD_QMM_AMX).");
  m.def("small_split_tiles_available", &mlxd_qmm::small_split_tiles_available,
        "Whether the float kernel here can split tiles of 3-6 rows (AVX-512).");
  m.def("set_small_split_tiles", &mlxd_qmm::set_small_split_tiles, "bits"_a, "on"_a,
        "Split the float kernel's tiles of 3-6 rows for products of this many bits set up from now on (the same "
        "results; the faster form depends on the CPU).");
  m.def("small_split_tiles", &mlxd_qmm::small_split_tiles, "bits"_a,
        "Whether products of this many bits split their tiles of 3-6 rows.");
  m.def("kernel_threads", &mlxd_qmm::kernel_threads, "rows"_a,
        "Threads that share the output columns of a product of this many rows.");
}
