// The MLX primitive: RMSNorm on the CPU as one op (MLX's CPU backend builds it from four).
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// The same for `rows` dense rows of D floats and a dense weight, into dense out (the fused layer ops).
void rms_norm_rows(const float* x, int64_t rows, int D, const float* weight, float eps, float* out);

// mx.fast.rms_norm(x, weight, eps) for float32 x and a float32 weight of x's last size; bit-identical to
// MLX's CPU result (the same order of operations). Raises std::invalid_argument for other inputs.
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, mx::StreamOrDevice s = {});

class CpuRMSNorm : public mx::UnaryPrimitive {
 public:
  CpuRMSNorm(mx::Stream stream, float eps) : mx::UnaryPrimitive(stream), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "CpuRMSNorm";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  float eps_;
};

}  // namespace mlxd_qmm
