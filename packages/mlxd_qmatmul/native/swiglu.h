// The MLX primitive: mlx-lm's swiglu (silu(gate) * up) on the CPU as one op with a vectorised exp.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// mlx_lm.models.activations.swiglu(gate, up) for float32 arrays of one shape; bit-identical to MLX's CPU
// result (vector_math.h). Raises std::invalid_argument for other inputs.
mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s = {});

class CpuSwiglu : public mx::UnaryPrimitive {
 public:
  explicit CpuSwiglu(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "CpuSwiglu";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
};

}  // namespace mlxd_qmm
