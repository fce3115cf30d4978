// The MLX primitive: rotary position embedding on the CPU as one op (MLX's CPU backend builds RoPE from
// about a dozen small ops a call, each one dispatch).
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// mx.fast.rope(x, dims, traditional=..., base=..., scale=..., offset=offset) for float32 x of at least
// 3 dimensions and an integer offset (a scalar, or one per entry of x's first axis); bit-identical to
// MLX's CPU result (the same formula and the same exp / sin / cos). Raises std::invalid_argument for
// other inputs.
mx::array rope(const mx::array& x, const mx::array& offset, int dims, bool traditional, float base,
               float scale, mx::StreamOrDevice s = {});

class CpuRope : public mx::UnaryPrimitive {
 public:
  CpuRope(mx::Stream stream, int dims, bool traditional, float base, float scale)
      : mx::UnaryPrimitive(stream), dims_(dims), traditional_(traditional), base_(base), scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "CpuRope";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int dims_;
  bool traditional_;
  float base_;
  float scale_;
};

}  // namespace mlxd_qmm
