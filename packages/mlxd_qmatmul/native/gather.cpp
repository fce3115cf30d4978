#include "gather.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "aligned_floats.h"
#include "dispatch.h"
#include "kernel.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "qmatmul.h"

namespace mlxd_qmm {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd gather_quantized_matmul: " + what);
}

// The products of rows already in order of their expert: rows [start[e], start[e + 1]) of `x` (dense) take
// expert e, and write the same rows of `y` [rows, N].
void run_experts(const float* x, float* y, const std::vector<int>& start, const mx::array& w, const mx::array& scales,
                 const mx::array& biases, int N, int K, int group_size, int bits) {
  const int experts = static_cast<int>(start.size()) - 1;
  const int scale_type = scale_type_of(scales);
  const int64_t row_bytes = static_cast<int64_t>(K) * bits / 8;
  const int64_t expert_weight_bytes = row_bytes * N;
  const int64_t expert_scale_bytes = static_cast<int64_t>(N) * (K / group_size) * scale_bytes(scale_type);
  const auto* weights = reinterpret_cast<const uint8_t*>(w.data<uint32_t>());
  const auto* scale_base = static_cast<const char*>(scales.data<void>());
  const auto* bias_base = static_cast<const char*>(biases.data<void>());
  auto problem = [&](int e, const float* rows) {
    const int first = start[e];
    return Problem{rows + static_cast<int64_t>(first) * K, weights + e * expert_weight_bytes,
                   scale_base + e * expert_scale_bytes, bias_base + e * expert_scale_bytes,
                   y + static_cast<int64_t>(first) * N, start[e + 1] - first, N, K, group_size, bits, scale_type};
  };
  const bool amx = amx_kernel() != nullptr;
  std::vector<int> few;  // experts whose rows run on the vector kernels, all in one job
  for (int e = 0; e < experts; ++e) {
    const int rows = start[e + 1] - start[e];
    if (rows == 0) continue;
    if (amx && rows >= amx_min_rows(bits)) {
      run_products(x + static_cast<int64_t>(start[e]) * K, {problem(e, x)}, false);  // x as run_products takes it
    } else {
      few.push_back(e);
    }
  }
  if (few.empty()) return;
  const Isa& isa = select_isa();
  const float* ordered = x;
  if (bits == 4) {  // the vector kernels read x in split order: every row of x at once
    thread_local AlignedFloats split;
    float* out = split.reserve(static_cast<size_t>(start.back()) * K);
    split_rows(x, out, start.back(), K, 2 * isa.lanes);
    ordered = out;
  }
  std::vector<Problem> problems;
  const uint64_t version = next_x_version();
  for (int e : few) {
    problems.push_back(problem(e, ordered));
    problems.back().x_version = version;
  }
  run_problems(problems, isa);
}

}  // namespace

mx::array gather_quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                                  const mx::array& biases, const mx::array& experts, int group_size, int bits,
                                  mx::StreamOrDevice s) {
  check_format(bits, group_size, "gather_quantized_matmul");
  check(group_size >= 32, "an experts layer's group size must be 32, 64 or 128");
  check(x.ndim() >= 1 && mx::issubdtype(x.dtype(), mx::floating), "x must be a floating-point array");
  check(w.dtype() == mx::uint32 && w.ndim() == 3, "weights must be a 3-D uint32 array [experts, N, K * bits / 32]");
  const int E = w.shape(0), N = w.shape(1), K = x.shape(-1);
  check(w.shape(2) * 32 / bits == K, "x has " + std::to_string(K) + " features, the weights take " +
                                         std::to_string(w.shape(2) * 32 / bits));
  check(K % group_size == 0, "the input size is not a multiple of the group size");
  const mx::Shape groups{E, N, K / group_size};
  check(scales.shape() == groups && biases.shape() == groups, "scales and biases must be [experts, N, K / group_size]");
  check(mx::issubdtype(experts.dtype(), mx::integer), "experts must be an integer array");
  check(static_cast<size_t>(experts.size()) * K == x.size(), "experts must name one expert a row of x");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  const mx::Dtype scale_dtype = read_scale_dtype(scales, biases);
  mx::Shape shape = x.shape();
  shape.back() = N;
  auto out = mx::array(shape, mx::float32, std::make_shared<CpuGatherQuantizedMatmul>(stream, group_size, bits),
                       {mx::astype(x, mx::float32, stream), row_contiguous(w, stream),
                        row_contiguous(mx::astype(scales, scale_dtype, stream), stream),
                        row_contiguous(mx::astype(biases, scale_dtype, stream), stream),
                        row_contiguous(mx::astype(mx::flatten(experts, stream), mx::uint32, stream), stream)});
  return x.dtype() == mx::float32 ? out : mx::astype(out, x.dtype(), stream);
}

void CpuGatherQuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (!inputs[i].flags().row_contiguous) {
      throw std::runtime_error("CpuGatherQuantizedMatmul: weights and experts must be row-contiguous");
    }
  }
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& input : inputs) encoder.set_input_array(input);
  encoder.set_output_array(out);
  encoder.dispatch([x, w = inputs[1], scales = inputs[2], biases = inputs[3], experts = inputs[4],
                    y = out.data<float>(), group_size = group_size_, bits = bits_]() {
    const int K = x.shape(-1), N = w.shape(1), E = w.shape(0);
    const int rows = K == 0 ? 0 : static_cast<int>(x.size() / K);
    if (rows == 0 || N == 0) return;
    thread_local std::vector<float> dense;
    const float* source = dense_floats(x, dense);
    const uint32_t* ids = experts.data<uint32_t>();
    // rows in order of their expert (a counting sort: each expert's rows keep their order); rows naming no
    // expert come out as zeros
    std::vector<int> start(E + 1, 0), order;
    order.reserve(rows);
    for (int r = 0; r < rows; ++r) {
      if (ids[r] < static_cast<uint32_t>(E)) ++start[ids[r] + 1];
    }
    for (int e = 0; e < E; ++e) start[e + 1] += start[e];
    std::vector<int> next(start.begin(), start.end() - 1);
    order.resize(start.back());
    for (int r = 0; r < rows; ++r) {
      if (ids[r] < static_cast<uint32_t>(E)) order[next[ids[r]]++] = r;
    }
    thread_local AlignedFloats sorted_x, sorted_y;
    const size_t kept = order.size();
    float* xs = sorted_x.reserve(std::max<size_t>(1, kept * K));
    float* ys = sorted_y.reserve(std::max<size_t>(1, kept * N));
    for (size_t i = 0; i < kept; ++i) std::memcpy(xs + i * K, source + static_cast<int64_t>(order[i]) * K, sizeof(float) * K);
    run_experts(xs, ys, start, w, scales, biases, N, K, group_size, bits);
    if (kept < static_cast<size_t>(rows)) std::memset(y, 0, sizeof(float) * rows * N);
    for (size_t i = 0; i < kept; ++i) std::memcpy(y + static_cast<int64_t>(order[i]) * N, ys + i * N, sizeof(float) * N);
  });
}

void CpuGatherQuantizedMatmul::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("CpuGatherQuantizedMatmul runs on the CPU only; on a GPU use mx.gather_qmm");
}

bool CpuGatherQuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuGatherQuantizedMatmul&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_;
}

std::vector<mx::Shape> CpuGatherQuantizedMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  mx::Shape shape = inputs[0].shape();
  shape.back() = inputs[1].shape(1);
  return {shape};
}

}  // namespace mlxd_qmm
