// The MLX primitive: attention for a few query tokens (decode steps and verify forwards) on the CPU as
// one op (MLX's CPU backend builds it from about ten: a scale, head grouping, two matmuls, a mask and a
// softmax).
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=...) for float32 q [B, Hq, L, D],
// k [B, Hkv, S, D], v [B, Hkv, S, Dv] (any strides; Hq a multiple of Hkv; k and v float32, or both float16:
// a cache kept in half precision, widened exactly as it is read), with no mask, the causal mask
// (queries at the last L key positions), or a boolean or additive float32 mask that broadcasts to
// [B, Hq, L, S]. Equal within float32 rounding (another summation order). Raises std::invalid_argument
// for other inputs.
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                    const std::optional<mx::array>& mask, mx::StreamOrDevice s = {});

// The checks attention() makes of its inputs (std::invalid_argument naming what is wrong).
void check_attention_inputs(const mx::array& q, const mx::array& k, const mx::array& v, bool causal,
                            const std::optional<mx::array>& mask);

// The same checks of keys and values known by their shapes and dtypes only (views not made yet).
void check_attention_shapes(const mx::array& q, const mx::Shape& k, const mx::Shape& v, mx::Dtype k_dtype,
                            mx::Dtype v_dtype, bool causal, const std::optional<mx::array>& mask);

// attention()'s result for evaluated inputs, computed on the calling thread and the kernel pool and written
// token-major ([B, L, Hq, Dv], dense) into out: the fused layer ops' attention (block.h). With `lengths` (one
// count per batch entry), entry b's queries from lengths[b] on are padding: not computed, their outputs zeros.
void attention_into(const mx::array& q, const mx::array& k, const mx::array& v, const std::optional<mx::array>& mask,
                    float scale, bool causal, float* out, const int32_t* lengths = nullptr);

class CpuAttention : public mx::UnaryPrimitive {
 public:
  CpuAttention(mx::Stream stream, float scale, bool causal)
      : mx::UnaryPrimitive(stream), scale_(scale), causal_(causal) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "CpuAttention";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  float scale_;
  bool causal_;
};

}  // namespace mlxd_qmm
