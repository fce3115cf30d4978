#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "attention.h"
#include "qmatmul.h"
#include "rms_norm.h"
#include "rope.h"
#include "swiglu.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_ext, m) {
  m.doc() = "mlxd's CPU kernels: quantized matmul for MLX's affine format (4 and 8 bits), RoPE, RMSNorm, attention, SwiGLU";
  m.def("quantized_matmul", &mlxd_qmm::quantized_matmul, "x"_a, "w"_a, "scales"_a, "biases"_a,
        "group_size"_a, "bits"_a, nb::kw_only(), "int8_activations"_a = false, "stream"_a = nb::none(),
        "x @ dequantize(w, scales, biases).T on the CPU kernels (transpose=True semantics of "
        "mx.quantized_matmul); float32 math, the result in x's dtype.");
  m.def("quantized_matmul_split", &mlxd_qmm::quantized_matmul_split, "x"_a, "w"_a, "scales"_a, "biases"_a,
        "group_size"_a, "bits"_a, "sizes"_a, nb::kw_only(), "int8_activations"_a = false, "stream"_a = nb::none(),
        "quantized_matmul for a weight packed from several layers' rows: one output per entry of sizes "
        "(each layer's output count, in order), each equal to that layer's own product.");
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
  m.def("int8_available", &mlxd_qmm::int8_available, "bits"_a,
        "Whether products of this many bits run on the int8-activation kernel when asked.");
  m.def("kernel_isa", &mlxd_qmm::kernel_isa, "The instruction set the kernels use on this CPU.");
  m.def("kernel_threads", &mlxd_qmm::kernel_threads, "rows"_a,
        "Threads that share the output columns of a product of this many rows.");
}
