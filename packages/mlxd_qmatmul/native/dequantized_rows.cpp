// Compiled without multiply-add contraction (CMakeLists.txt): each weight is MLX's two roundings, q * scale then
// + bias, not one fused multiply-add.
#include "dequantized_rows.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernel.h"  // half_to_float, bfloat16_to_float
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "qmatmul.h"  // row_contiguous

namespace mlxd_qmm {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd dequantized_rows: " + what);
}

// Element i of a float32, float16 or bfloat16 array's data as float32 (exact).
float widened(const mx::array& a, int64_t i) {
  if (a.dtype() == mx::float16) return half_to_float(reinterpret_cast<const uint16_t*>(a.data<void>())[i]);
  if (a.dtype() == mx::bfloat16) return bfloat16_to_float(reinterpret_cast<const uint16_t*>(a.data<void>())[i]);
  return a.data<float>()[i];
}

// Entry i of an integer array (dense) as int64.
int64_t id_at(const mx::array& ids, size_t i) {
  switch (ids.dtype()) {
    case mx::int32: return ids.data<int32_t>()[i];
    case mx::uint32: return ids.data<uint32_t>()[i];
    case mx::int64: return ids.data<int64_t>()[i];
    case mx::uint64: return static_cast<int64_t>(ids.data<uint64_t>()[i]);
    case mx::int16: return ids.data<int16_t>()[i];
    case mx::uint16: return ids.data<uint16_t>()[i];
    case mx::int8: return ids.data<int8_t>()[i];
    default: return ids.data<uint8_t>()[i];
  }
}

}  // namespace

mx::array dequantized_rows(const mx::array& w, const mx::array& scales, const mx::array& biases, const mx::array& ids,
                           int group_size, int bits, bool column_blocks, mx::StreamOrDevice s) {
  check(bits == 4 || bits == 8, "bits must be 4 or 8");
  check(group_size > 0 && group_size % (32 / bits) == 0, "the group size must hold whole packed words");
  check(w.ndim() == 2 && w.dtype() == mx::uint32, "w must be a [rows, packed] uint32 array");
  const int K = w.shape(1) * (32 / bits);
  check(K % group_size == 0, "a row must hold whole groups");
  for (const auto* a : {&scales, &biases}) {
    check(a->ndim() == 2 && a->shape(0) == w.shape(0) && a->shape(1) == K / group_size,
          "scales and biases must be [rows, groups] of w's rows");
    check(a->dtype() == mx::float32 || a->dtype() == mx::float16 || a->dtype() == mx::bfloat16,
          "scales and biases must be float32, float16 or bfloat16");
  }
  check(mx::issubdtype(ids.dtype(), mx::integer), "the ids must be integers");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  mx::Shape shape = ids.shape();
  shape.push_back(K);
  return mx::array(shape, mx::float32, std::make_shared<CpuDequantizedRows>(stream, group_size, bits, column_blocks),
                   {row_contiguous(w, stream), row_contiguous(scales, stream), row_contiguous(biases, stream),
                    row_contiguous(ids, stream)});
}

void CpuDequantizedRows::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& input : inputs) encoder.set_input_array(input);
  encoder.set_output_array(out);
  encoder.dispatch([w = inputs[0], scales = inputs[1], biases = inputs[2], ids = inputs[3], dst = out.data<float>(),
                    group_size = group_size_, bits = bits_, columns = column_blocks_]() {
    const int64_t N = w.shape(0), words = w.shape(1);
    const int per_word = 32 / bits, K = static_cast<int>(words) * per_word, groups = K / group_size;
    const uint32_t mask = (1u << bits) - 1;
    for (size_t r = 0; r < ids.size(); ++r) {
      float* row = dst + static_cast<int64_t>(r) * K;
      const int64_t id = id_at(ids, r);
      if (id < 0 || id >= N) {
        for (int k = 0; k < K; ++k) row[k] = 0.0f;
        continue;
      }
      // where the row's word j and group g sit: MLX's order, or its lane of its block of 16 rows (column blocks)
      const int64_t first = columns ? id / 16 * 16 : id, count = columns ? std::min<int64_t>(16, N - first) : 1;
      const int64_t lane = id - first;
      const uint32_t* packed = w.data<uint32_t>() + first * words + lane;
      const int64_t group_at = first * groups + lane;
      for (int g = 0; g < groups; ++g) {
        const float scale = widened(scales, group_at + g * count), bias = widened(biases, group_at + g * count);
        for (int k = g * group_size; k < (g + 1) * group_size; ++k) {
          const uint32_t q = (packed[k / per_word * count] >> ((k % per_word) * bits)) & mask;
          const float scaled = static_cast<float>(q) * scale;
          row[k] = scaled + bias;
        }
      }
    }
  });
}

void CpuDequantizedRows::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuDequantizedRows runs on the CPU only; elsewhere use mx.dequantize");
}

bool CpuDequantizedRows::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuDequantizedRows&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_ && column_blocks_ == o.column_blocks_;
}

std::vector<mx::Shape> CpuDequantizedRows::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[3].shape();
  shape.push_back(inputs[0].shape(1) * (32 / bits_));
  return {shape};
}

}  // namespace mlxd_qmm
