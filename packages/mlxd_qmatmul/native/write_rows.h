// The MLX primitive: new rows written into a buffer in place, at rows an index names (a KV cache's update for
// batch rows at different positions), as one CPU op.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// `buffer` (any shape, its last axis D) with `rows` (any shape ending in D, any strides: N rows in row-major order)
// written at its rows `index` [N] (int32, distinct: buffer viewed as [size / D, D]). The result takes over
// the buffer's memory when nothing else holds it (as MLX's own slice updates do), else copies it first. The
// same result as `flat = buffer.reshape(-1, D); flat[index] = rows.reshape(-1, D)`, without the index
// arithmetic MLX's scatter builds around it. `rows` has the buffer's dtype, or is float32 for a float16 buffer:
// then each value is narrowed as it is written (narrow_to_halves: rounded as a cast, saturated at +-65504
// rather than infinity), which saves the cast's op. Raises std::invalid_argument for mismatched inputs.
mx::array write_rows(const mx::array& buffer, const mx::array& rows, const mx::array& index, mx::StreamOrDevice s = {});

class CpuWriteRows : public mx::UnaryPrimitive {
 public:
  explicit CpuWriteRows(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "CpuWriteRows";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
};

}  // namespace mlxd_qmm
