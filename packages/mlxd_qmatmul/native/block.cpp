#include "block.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "rms_norm.h"
#include "rope.h"
#include "vector_math.h"

namespace mlxd_qmm {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd fused layer: " + what);
}

mx::array float_vector(const mx::array& a, int size, const char* what, const mx::Stream& stream) {
  check(a.ndim() == 1 && a.dtype() == mx::float32 && a.shape(0) == size,
        std::string(what) + " must be a float32 vector of " + std::to_string(size));
  return row_contiguous(a, stream);
}

// The packed weight's arrays as inputs, in the order eval_cpu reads them back (PackedLinear at `first`).
void push_weight(std::vector<mx::array>& inputs, const PackedLinear& p) {
  inputs.push_back(p.weight);
  inputs.push_back(p.scales);
  inputs.push_back(p.biases);
}

PackedLinear weight_at(const std::vector<mx::array>& inputs, size_t first, int group_size, int bits,
                       std::vector<int> sizes, int int8) {
  return PackedLinear{inputs[first], inputs[first + 1], inputs[first + 2], group_size, bits, std::move(sizes), int8};
}

// out[rows, parts...] = dense x [M, K] @ the packed weight, its parts at outs.
void product(const float* x, int M, int K, const PackedLinear& w, const std::vector<float*>& outs) {
  run_products(x, packed_problems(w.weight, w.scales, w.biases, w.group_size, w.bits, w.sizes, outs, M, K), w.int8);
}

// The tokens of a [B, L] batch an op computes: all of them, or with `lengths` (one count per batch entry) row
// b's first lengths[b] only. The rest are padding that nothing reads (a verify forward's rows of different
// widths, each fed up to the widest): their products are skipped, so a forward costs its real tokens.
struct RealTokens {
  std::vector<int64_t> index;  // b * L + t of each real token in order; empty: every token is real
  int count(int all) const {
    return index.empty() ? all : static_cast<int>(index.size());
  }
};

RealTokens real_tokens(const mx::array* lengths, int B, int L) {
  RealTokens real;
  if (lengths == nullptr) return real;
  const int32_t* n = lengths->data<int32_t>();
  int64_t total = 0;
  for (int b = 0; b < B; ++b) total += std::clamp(n[b], 0, L);
  if (total == static_cast<int64_t>(B) * L) return real;
  real.index.reserve(total);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < std::clamp(n[b], 0, L); ++t) real.index.push_back(static_cast<int64_t>(b) * L + t);
  }
  return real;
}

// The rows of src [M, width] at `index`, packed into `buffer`; src itself when index is empty.
const float* gather_rows(const float* src, int width, const std::vector<int64_t>& index, std::vector<float>& buffer) {
  if (index.empty()) return src;
  buffer.resize(index.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < index.size(); ++i) {
    std::copy_n(src + index[i] * width, width, buffer.data() + i * width);
  }
  return buffer.data();
}

// The optional per-row token counts as an input: int32, one per batch entry.
mx::array lengths_input(const mx::array& lengths, int B, const mx::Stream& stream) {
  check(lengths.ndim() == 1 && lengths.shape(0) == B && mx::issubdtype(lengths.dtype(), mx::integer),
        "lengths must be an integer vector with one count per batch entry");
  return row_contiguous(mx::astype(lengths, mx::int32, stream), stream);
}

}  // namespace

std::vector<mx::array> attention_input(const mx::array& x, const mx::array& norm_weight, float eps,
                                       const PackedLinear& qkv, int heads, int kv_heads, int head_dim,
                                       const mx::array& offset, const RopeSpec& rope, const QkvExtras& extras,
                                       const std::optional<mx::array>& lengths, mx::StreamOrDevice s) {
  check(x.ndim() == 3 && x.dtype() == mx::float32, "x must be a float32 [batch, tokens, hidden] array");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  const int B = x.shape(0), L = x.shape(1), D = x.shape(2);
  check(qkv.sizes.size() == 3, "the q/k/v weight must have three parts");
  check(heads > 0 && kv_heads > 0 && head_dim > 0 && heads % kv_heads == 0, "heads must be a multiple of kv heads");
  check(qkv.sizes[0] == heads * head_dim && qkv.sizes[1] == kv_heads * head_dim && qkv.sizes[2] == kv_heads * head_dim,
        "the q/k/v parts must be heads x head_dim and kv_heads x head_dim");
  check(rope.dims > 0 && rope.dims % 2 == 0 && rope.dims <= head_dim, "rope dims must be even and at most head_dim");
  check(offset.ndim() <= 1 && mx::issubdtype(offset.dtype(), mx::integer), "offset must be an integer scalar or vector");
  check(offset.size() == 1 || static_cast<int>(offset.size()) == B, "offset must be a scalar or one per batch entry");
  const PackedLinear w = checked_packed(qkv, D, stream);
  std::vector<mx::array> inputs{x, float_vector(norm_weight, D, "the norm weight", stream),
                                row_contiguous(mx::astype(offset, mx::int32, stream), stream)};
  push_weight(inputs, w);
  if (extras.bias.has_value()) {
    inputs.push_back(float_vector(*extras.bias, qkv.sizes[0] + 2 * qkv.sizes[1], "the q/k/v bias", stream));
  }
  check(extras.q_norm.has_value() == extras.k_norm.has_value(), "q and k norms come together");
  if (extras.q_norm.has_value()) {
    inputs.push_back(float_vector(*extras.q_norm, head_dim, "the q norm weight", stream));
    inputs.push_back(float_vector(*extras.k_norm, head_dim, "the k norm weight", stream));
  }
  if (lengths.has_value()) inputs.push_back(lengths_input(*lengths, B, stream));
  std::vector<mx::Shape> shapes{{B, heads, L, head_dim}, {B, kv_heads, L, head_dim}, {B, kv_heads, L, head_dim}};
  return mx::array::make_arrays(
      shapes, {mx::float32, mx::float32, mx::float32},
      std::make_shared<CpuAttentionInput>(stream, eps, w.group_size, w.bits, w.sizes, w.int8, heads, kv_heads, head_dim,
                                          rope, extras.bias.has_value(), extras.q_norm.has_value(), extras.qk_eps,
                                          lengths.has_value()),
      std::move(inputs));
}

void CpuAttentionInput::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& input : inputs) encoder.set_input_array(input);
  for (auto& out : outputs) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    encoder.set_output_array(out);
  }
  encoder.dispatch([inputs, q_out = outputs[0].data<float>(), k_out = outputs[1].data<float>(),
                    v_out = outputs[2].data<float>(), w = weight_at(inputs, 3, group_size_, bits_, sizes_, int8_),
                    eps = eps_, heads = heads_, kv_heads = kv_heads_, head_dim = head_dim_, rope = rope_,
                    has_bias = has_bias_, has_qk_norm = has_qk_norm_, qk_eps = qk_eps_, has_lengths = has_lengths_]() {
    const mx::array& x = inputs[0];
    const int B = x.shape(0), L = x.shape(1), D = x.shape(2);
    if (B * L == 0) return;
    const RealTokens real = real_tokens(has_lengths ? &inputs.back() : nullptr, B, L);
    const int M = real.count(B * L);  // the rows computed; padding's outputs are zeros
    thread_local std::vector<float> gathered, packed, normed, projected;
    normed.resize(static_cast<size_t>(M) * D);
    rms_norm_rows(gather_rows(dense_floats(x, gathered), D, real.index, packed), M, D, inputs[1].data<float>(), eps,
                  normed.data());
    const int nq = w.sizes[0], nkv = w.sizes[1];
    projected.resize(static_cast<size_t>(M) * (nq + 2 * nkv));
    float* yq = projected.data();
    float* yk = yq + static_cast<size_t>(M) * nq;
    float* yv = yk + static_cast<size_t>(M) * nkv;
    product(normed.data(), M, D, w, {yq, yk, yv});
    size_t next_input = 6;
    if (has_bias) {  // each part plus its slice of the bias, as the layers' own `y + bias`
      const float* bias = inputs[next_input++].data<float>();
      const int parts[3] = {nq, nkv, nkv};
      float* outs[3] = {yq, yk, yv};
      for (int part = 0, first = 0; part < 3; first += parts[part], ++part) {
        for (int m = 0; m < M; ++m) {
          float* row = outs[part] + static_cast<int64_t>(m) * parts[part];
          for (int i = 0; i < parts[part]; ++i) row[i] = row[i] + bias[first + i];
        }
      }
    }
    if (has_qk_norm) {  // every query and key head through its RMSNorm, in place
      const float* q_norm = inputs[next_input].data<float>();
      const float* k_norm = inputs[next_input + 1].data<float>();
      rms_norm_rows(yq, static_cast<int64_t>(M) * heads, head_dim, q_norm, qk_eps, yq);
      rms_norm_rows(yk, static_cast<int64_t>(M) * kv_heads, head_dim, k_norm, qk_eps, yk);
    }
    const mx::array& offset = inputs[2];
    const int offsets = static_cast<int>(offset.size());
    const RopeTables tables(offset.data<int32_t>(), offsets, 1, L, rope.dims, rope.base, rope.scale);
    if (!real.index.empty()) {
      std::fill_n(q_out, static_cast<size_t>(B) * heads * L * head_dim, 0.0f);
      std::fill_n(k_out, static_cast<size_t>(B) * kv_heads * L * head_dim, 0.0f);
      std::fill_n(v_out, static_cast<size_t>(B) * kv_heads * L * head_dim, 0.0f);
    }
    for (int64_t token = 0; token < M; ++token) {  // a computed row, at batch entry b and position t
      const int64_t at_bt = real.index.empty() ? token : real.index[token];
      const int b = static_cast<int>(at_bt / L), t = static_cast<int>(at_bt % L);
      const int row_offset = offsets == 1 ? 0 : b;
      for (int h = 0; h < heads; ++h) {
        tables.apply(yq + token * nq + h * head_dim, 1, q_out + ((static_cast<int64_t>(b) * heads + h) * L + t) * head_dim,
                     head_dim, rope.traditional, row_offset, t);
      }
      for (int h = 0; h < kv_heads; ++h) {
        const int64_t at = ((static_cast<int64_t>(b) * kv_heads + h) * L + t) * head_dim;
        tables.apply(yk + token * nkv + h * head_dim, 1, k_out + at, head_dim, rope.traditional, row_offset, t);
        const float* v_src = yv + token * nkv + h * head_dim;
        for (int d = 0; d < head_dim; ++d) v_out[at + d] = v_src[d];
      }
    }
  });
}

void CpuAttentionInput::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("CpuAttentionInput runs on the CPU only");
}

bool CpuAttentionInput::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuAttentionInput&>(other);
  return eps_ == o.eps_ && group_size_ == o.group_size_ && bits_ == o.bits_ && sizes_ == o.sizes_ && int8_ == o.int8_ &&
         heads_ == o.heads_ && kv_heads_ == o.kv_heads_ && head_dim_ == o.head_dim_ && rope_.dims == o.rope_.dims &&
         rope_.traditional == o.rope_.traditional && rope_.base == o.rope_.base && rope_.scale == o.rope_.scale &&
         has_bias_ == o.has_bias_ && has_qk_norm_ == o.has_qk_norm_ && qk_eps_ == o.qk_eps_ &&
         has_lengths_ == o.has_lengths_;
}

std::vector<mx::Shape> CpuAttentionInput::output_shapes(const std::vector<mx::array>& inputs) {
  const int B = inputs[0].shape(0), L = inputs[0].shape(1);
  return {{B, heads_, L, head_dim_}, {B, kv_heads_, L, head_dim_}, {B, kv_heads_, L, head_dim_}};
}

namespace {

// block_output's inputs (keys and values: the attention's, or with a span the layer's buffers) and primitive.
std::pair<std::vector<mx::array>, std::shared_ptr<CpuBlockOutput>> block_output_op(
    const mx::array& x, const mx::array& q, const mx::array& keys, const mx::array& values,
    const std::optional<mx::array>& mask, bool causal, float attention_scale, const PackedLinear& o,
    const mx::array& norm_weight, float eps, const PackedLinear& gate_up, const PackedLinear& down,
    const std::optional<mx::array>& lengths, const std::optional<CacheSpan>& span, const mx::Stream& stream) {
  check(x.ndim() == 3 && x.dtype() == mx::float32, "x must be a float32 [batch, tokens, hidden] array");
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  const int B = x.shape(0), L = x.shape(1), D = x.shape(2);
  check(q.ndim() == 4 && q.shape(0) == B && q.shape(2) == L,
        "the queries must be [batch, heads, tokens, head_dim] of x's batch and tokens");
  check(o.sizes.size() == 1 && o.sizes[0] == D, "the output projection must give the hidden size");
  check(gate_up.sizes.size() == 2 && gate_up.sizes[0] == gate_up.sizes[1], "gate/up must have two parts of one size");
  check(down.sizes.size() == 1 && down.sizes[0] == D, "the down projection must give the hidden size");
  const PackedLinear ow = checked_packed(o, q.shape(1) * values.shape(3), stream);
  const PackedLinear gw = checked_packed(gate_up, D, stream);
  const PackedLinear dw = checked_packed(down, gate_up.sizes[0], stream);
  std::vector<mx::array> inputs{x, q, keys, values};
  push_weight(inputs, ow);
  inputs.push_back(float_vector(norm_weight, D, "the norm weight", stream));
  push_weight(inputs, gw);
  push_weight(inputs, dw);
  if (mask.has_value()) inputs.push_back(*mask);
  if (lengths.has_value()) inputs.push_back(lengths_input(*lengths, B, stream));
  CpuBlockOutput::Formats formats{ow.group_size, ow.bits,  gw.group_size, gw.bits, dw.group_size,
                                  dw.bits,       gw.sizes, ow.int8,       gw.int8, dw.int8};
  return {std::move(inputs), std::make_shared<CpuBlockOutput>(stream, attention_scale, causal, eps, std::move(formats),
                                                              mask.has_value(), lengths.has_value(), span)};
}

// A span's keys or values: [rows, kv_heads, read_length, head_dim] of a buffer [slots, kv_heads, capacity,
// head_dim] from slot first_slot on, sharing its memory and strides: what MLX's slice of the buffer would be,
// made in the op's task instead of as an op of its own.
mx::array span_view(const mx::array& buffer, const CacheSpan& span) {
  mx::array view(mx::Shape{span.rows, buffer.shape(1), span.read_length, buffer.shape(3)}, buffer.dtype(), nullptr, {});
  const bool whole = span.read_length == buffer.shape(2) && buffer.flags().row_contiguous;
  view.copy_shared_buffer(buffer, buffer.strides(), {whole, whole, false}, buffer.data_size(),
                          span.first_slot * buffer.strides()[0]);
  return view;
}

}  // namespace

mx::array block_output(const mx::array& x, const mx::array& q, const mx::array& keys, const mx::array& values,
                       const std::optional<mx::array>& mask, bool causal, float attention_scale,
                       const PackedLinear& o, const mx::array& norm_weight, float eps, const PackedLinear& gate_up,
                       const PackedLinear& down, const std::optional<mx::array>& lengths, mx::StreamOrDevice s) {
  check_attention_inputs(q, keys, values, causal, mask);
  auto [inputs, op] = block_output_op(x, q, keys, values, mask, causal, attention_scale, o, norm_weight, eps, gate_up,
                                      down, lengths, std::nullopt, mx::to_stream(s, mx::Device::cpu));
  return mx::array(x.shape(), mx::float32, std::move(op), std::move(inputs));
}

mx::array block_output_span(const mx::array& x, const mx::array& q, const mx::array& k_buf, const mx::array& v_buf,
                            const CacheSpan& span, const std::optional<mx::array>& mask, bool causal,
                            float attention_scale, const PackedLinear& o, const mx::array& norm_weight, float eps,
                            const PackedLinear& gate_up, const PackedLinear& down,
                            const std::optional<mx::array>& lengths, mx::StreamOrDevice s) {
  check(k_buf.ndim() == 4 && v_buf.ndim() == 4 && k_buf.shape(0) == v_buf.shape(0) &&
            k_buf.shape(1) == v_buf.shape(1) && k_buf.shape(2) == v_buf.shape(2),
        "the key and value buffers must be [slots, kv_heads, capacity, dim] of one slots, heads and capacity");
  check(span.rows > 0 && span.rows == q.shape(0) && span.first_slot >= 0 &&
            span.first_slot + span.rows <= k_buf.shape(0) && span.read_length > 0 &&
            span.read_length <= k_buf.shape(2),
        "the span must be one slot per batch entry inside the buffers");
  // what the attention reads: the span's views (checked as block_output checks its keys and values)
  check_attention_shapes(q, {span.rows, k_buf.shape(1), span.read_length, k_buf.shape(3)},
                         {span.rows, v_buf.shape(1), span.read_length, v_buf.shape(3)}, k_buf.dtype(), v_buf.dtype(),
                         causal, mask);
  auto [inputs, op] = block_output_op(x, q, k_buf, v_buf, mask, causal, attention_scale, o, norm_weight, eps, gate_up,
                                      down, lengths, span, mx::to_stream(s, mx::Device::cpu));
  return mx::array(x.shape(), mx::float32, std::move(op), std::move(inputs));
}

void CpuBlockOutput::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& input : inputs) encoder.set_input_array(input);
  encoder.set_output_array(out);
  const Formats& f = formats_;
  const int D = inputs[0].shape(2);
  std::optional<mx::array> mask;
  if (has_mask_) mask = inputs[14];
  std::optional<mx::array> lengths;
  if (has_lengths_) lengths = inputs.back();
  encoder.dispatch([x = inputs[0], q = inputs[1], keys = inputs[2], values = inputs[3], span = span_,
                    mask = std::move(mask), lengths = std::move(lengths), norm_weight = inputs[7],
                    dst = out.data<float>(), scale = attention_scale_, causal = causal_, eps = eps_,
                    o = weight_at(inputs, 4, f.o_group_size, f.o_bits, {D}, f.o_int8),
                    gate_up = weight_at(inputs, 8, f.gate_up_group_size, f.gate_up_bits, f.gate_up_sizes, f.gate_up_int8),
                    down = weight_at(inputs, 11, f.down_group_size, f.down_bits, {D}, f.down_int8)]() {
    // with a span, the attention reads views of the buffers made here (else two slice ops before this one)
    const mx::array keys_read = span.has_value() ? span_view(keys, *span) : keys;
    const mx::array values_read = span.has_value() ? span_view(values, *span) : values;
    const int B = x.shape(0), L = x.shape(1), D = x.shape(2);
    if (B * L == 0) return;
    const RealTokens real = real_tokens(lengths.has_value() ? &*lengths : nullptr, B, L);
    const int M = real.count(B * L);  // the rows computed; padding's rows come out as x
    const int64_t size = static_cast<int64_t>(M) * D;
    const int attended = q.shape(1) * values_read.shape(3);
    const int hidden = gate_up.sizes[0];
    thread_local std::vector<float> gathered, attn, packed_attn, packed_x, projected, h, normed, gates, act;
    attn.resize(static_cast<size_t>(B) * L * attended);
    attention_into(q, keys_read, values_read, mask, scale, causal, attn.data(),
                   lengths.has_value() ? lengths->data<int32_t>() : nullptr);
    projected.resize(size);
    product(gather_rows(attn.data(), attended, real.index, packed_attn), M, attended, o, {projected.data()});
    const float* xs_all = dense_floats(x, gathered);
    const float* xs = gather_rows(xs_all, D, real.index, packed_x);
    h.resize(size);
    for (int64_t i = 0; i < size; ++i) h[i] = xs[i] + projected[i];
    normed.resize(size);
    rms_norm_rows(h.data(), M, D, norm_weight.data<float>(), eps, normed.data());
    gates.resize(static_cast<size_t>(2) * M * hidden);
    float* gate = gates.data();
    float* up = gate + static_cast<size_t>(M) * hidden;
    product(normed.data(), M, D, gate_up, {gate, up});
    act.resize(static_cast<size_t>(M) * hidden);
    swiglu_rows(gate, up, act.data(), static_cast<int64_t>(M) * hidden);
    product(act.data(), M, hidden, down, {projected.data()});
    if (real.index.empty()) {
      for (int64_t i = 0; i < size; ++i) dst[i] = h[i] + projected[i];
      return;
    }
    std::copy_n(xs_all, static_cast<size_t>(B) * L * D, dst);
    for (int64_t row = 0; row < M; ++row) {
      float* out = dst + real.index[row] * D;
      for (int i = 0; i < D; ++i) out[i] = h[row * D + i] + projected[row * D + i];
    }
  });
}

void CpuBlockOutput::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuBlockOutput runs on the CPU only");
}

bool CpuBlockOutput::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuBlockOutput&>(other);
  const Formats &a = formats_, &b = o.formats_;
  return attention_scale_ == o.attention_scale_ && causal_ == o.causal_ && eps_ == o.eps_ &&
         a.o_group_size == b.o_group_size && a.o_bits == b.o_bits && a.gate_up_group_size == b.gate_up_group_size &&
         a.gate_up_bits == b.gate_up_bits && a.down_group_size == b.down_group_size && a.down_bits == b.down_bits &&
         a.gate_up_sizes == b.gate_up_sizes && a.o_int8 == b.o_int8 && a.gate_up_int8 == b.gate_up_int8 &&
         a.down_int8 == b.down_int8 && has_mask_ == o.has_mask_ && has_lengths_ == o.has_lengths_ &&
         span_ == o.span_;
}

}  // namespace mlxd_qmm
