// The MLX primitive: rows of a packed affine matrix dequantized to float32, picked by index (a quantized
// embedding table's lookup) as one CPU op, where MLX's CPU builds the lookup from three gathers and its
// dequantize from a few dozen ops (shifts, broadcasts, casts), each a hand-over on its stream.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// For w [N, K * bits / 32] uint32 (MLX's affine packing, bits 4 or 8), scales and biases [N, K / group_size]
// (float32, float16 or bfloat16) and ids (any integer dtype and shape): the float32 rows [ids..., K] that
// mx.dequantize(w[ids], scales[ids] as float32, biases[ids] as float32) gives, bit for bit (each weight q * scale,
// rounded, plus bias, rounded). An id outside [0, N) gives a row of zeros. Raises std::invalid_argument for
// other inputs. column_blocks: w, scales and biases are in the int8 kernel's column-block order (one part of N
// rows: kInt8Columns in kernel.h), read where each row's words and groups sit there.
mx::array dequantized_rows(const mx::array& w, const mx::array& scales, const mx::array& biases, const mx::array& ids,
                           int group_size, int bits, bool column_blocks = false, mx::StreamOrDevice s = {});

class CpuDequantizedRows : public mx::UnaryPrimitive {
 public:
  CpuDequantizedRows(mx::Stream stream, int group_size, int bits, bool column_blocks)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits), column_blocks_(column_blocks) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "CpuDequantizedRows";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int group_size_;
  int bits_;
  bool column_blocks_;
};

}  // namespace mlxd_qmm
