// Two MLX primitives that run a llama-style decoder layer in two ops instead of about twenty: the
// attention's input (RMSNorm, the packed q/k/v product, RoPE) and everything after the cache update
// (attention, the output projection, the residual, RMSNorm, the packed gate/up product, SwiGLU, the down
// projection, the residual). Each step is the same computation as the one-op kernels (rms_norm, rope,
// attention, swiglu, quantized_matmul_split), so results are bit-identical to running those one by one;
// what goes is the per-op dispatch (about 7 us each on MLX's CPU stream) and the wake-ups of the kernel
// pool between them.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qmatmul.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

struct RopeSpec {
  int dims;
  bool traditional;
  float base, scale;
};

// What some families add between the q/k/v product and RoPE: a bias on the packed product (Qwen2), an
// RMSNorm over each query and key head (Qwen3).
struct QkvExtras {
  std::optional<mx::array> bias;  // [q + 2 kv outputs]
  std::optional<mx::array> q_norm, k_norm;  // [head_dim] each, both or neither
  float qk_eps = 0.0f;
};

// For x [B, L, hidden] (float32): xn = rms_norm(x, norm_weight, eps); q, k, v = the parts of xn @ qkv (plus
// the bias; q and k heads through their norms); returns rope(q) [B, heads, L, head_dim], rope(k)
// [B, kv_heads, L, head_dim], v [B, kv_heads, L, head_dim], RoPE at positions offset + t (offset: an int32
// scalar or one per batch entry). With `lengths` (one count per batch entry) only entry b's first lengths[b]
// tokens are computed and the rest come out as zeros: padding nothing reads (a verify forward of rows with
// drafts of different lengths), so the products cost the real tokens only.
std::vector<mx::array> attention_input(const mx::array& x, const mx::array& norm_weight, float eps,
                                       const PackedLinear& qkv, int heads, int kv_heads, int head_dim,
                                       const mx::array& offset, const RopeSpec& rope, const QkvExtras& extras,
                                       const std::optional<mx::array>& lengths = std::nullopt,
                                       mx::StreamOrDevice s = {});

// For the layer input x [B, L, hidden], the queries from attention_input and the cache's keys and values:
// h = x + attention(q, keys, values) @ o; returns h + down(swiglu(gate, up)), where gate, up are the parts of
// rms_norm(h, norm_weight, eps) @ gate_up. Mask as attention() takes it. With `lengths`, as attention_input:
// the padding tokens' rows come out as x.
mx::array block_output(const mx::array& x, const mx::array& q, const mx::array& keys, const mx::array& values,
                       const std::optional<mx::array>& mask, bool causal, float attention_scale,
                       const PackedLinear& o, const mx::array& norm_weight, float eps, const PackedLinear& gate_up,
                       const PackedLinear& down, const std::optional<mx::array>& lengths = std::nullopt,
                       mx::StreamOrDevice s = {});

// Inputs: x, norm weight, offset, qkv weight, scales, biases[, bias][, q norm, k norm][, lengths]. Outputs: q, k, v.
class CpuAttentionInput : public mx::Primitive {
 public:
  CpuAttentionInput(mx::Stream stream, float eps, int group_size, int bits, std::vector<int> sizes, int int8,
                    int heads, int kv_heads, int head_dim, RopeSpec rope, bool has_bias, bool has_qk_norm, float qk_eps,
                    bool has_lengths)
      : mx::Primitive(stream), eps_(eps), group_size_(group_size), bits_(bits), sizes_(std::move(sizes)), int8_(int8),
        heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), rope_(rope), has_bias_(has_bias),
        has_qk_norm_(has_qk_norm), qk_eps_(qk_eps), has_lengths_(has_lengths) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override {
    return "CpuAttentionInput";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  float eps_;
  int group_size_, bits_;
  std::vector<int> sizes_;
  int int8_;
  int heads_, kv_heads_, head_dim_;
  RopeSpec rope_;
  bool has_bias_, has_qk_norm_;
  float qk_eps_;
  bool has_lengths_;
};

// What block_output_span's attention reads of a layer's buffers [slots, kv_heads, capacity, head_dim]: the
// forward's rows are the adjacent slots [first_slot, first_slot + rows), each read at positions [0, read_length).
struct CacheSpan {
  int first_slot, rows, read_length;
  bool operator==(const CacheSpan& o) const {
    return first_slot == o.first_slot && rows == o.rows && read_length == o.read_length;
  }
};

// block_output over a span of the layer's whole key and value buffers (the forward's new rows already written,
// write_rows), not over slices of them: the same bits as slicing the buffers and calling block_output, without
// the two slice ops a layer on the CPU stream, where each op costs a hand-over
// (docs/benchmark_results/code_notes.md#eval-handoffs).
mx::array block_output_span(const mx::array& x, const mx::array& q, const mx::array& k_buf, const mx::array& v_buf,
                            const CacheSpan& span, const std::optional<mx::array>& mask, bool causal,
                            float attention_scale, const PackedLinear& o, const mx::array& norm_weight, float eps,
                            const PackedLinear& gate_up, const PackedLinear& down,
                            const std::optional<mx::array>& lengths = std::nullopt, mx::StreamOrDevice s = {});

// Inputs: x, q, keys, values (with a CacheSpan: the layer's buffers), o (weight, scales, biases), norm weight,
// gate_up (3), down (3)[, mask][, lengths].
class CpuBlockOutput : public mx::UnaryPrimitive {
 public:
  struct Formats {
    int o_group_size, o_bits, gate_up_group_size, gate_up_bits, down_group_size, down_bits;
    std::vector<int> gate_up_sizes;
    int o_int8 = kInt8Off, gate_up_int8 = kInt8Off, down_int8 = kInt8Off;  // Int8Mode
  };
  CpuBlockOutput(mx::Stream stream, float attention_scale, bool causal, float eps, Formats formats, bool has_mask,
                 bool has_lengths, std::optional<CacheSpan> span = std::nullopt)
      : mx::UnaryPrimitive(stream), attention_scale_(attention_scale), causal_(causal), eps_(eps),
        formats_(std::move(formats)), has_mask_(has_mask), has_lengths_(has_lengths), span_(span) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return "CpuBlockOutput";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  float attention_scale_;
  bool causal_;
  float eps_;
  Formats formats_;
  bool has_mask_, has_lengths_;
  std::optional<CacheSpan> span_;
};

}  // namespace mlxd_qmm
