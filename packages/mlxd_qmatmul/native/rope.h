// The MLX primitive: rotary position embedding on the CPU as one op (MLX's CPU backend builds RoPE from
// about a dozen small ops a call, each one dispatch).
#pragma once

#include <cstdint>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// RoPE's cosines and sines for T positions after each of `count` offsets (offsets[b * stride]), computed as
// MLX computes them, and their application to one row of head size D: the one formula behind rope() and
// the fused layer ops (block.h), so both are bit-identical to MLX's CPU RoPE.
class RopeTables {
 public:
  RopeTables(const int32_t* offsets, int count, int64_t stride, int T, int dims, float base, float scale);
  // dst[0, D) = the rotated src (elements d_stride apart) at position t after offset b.
  void apply(const float* src, int64_t d_stride, float* dst, int D, bool traditional, int b, int t) const;

 private:
  int T_, half_, dims_;
  std::vector<float> coss_, sins_;
};

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
