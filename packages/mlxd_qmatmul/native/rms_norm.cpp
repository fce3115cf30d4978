#include "rms_norm.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/backend/cpu/simd/simd.h"

namespace mlxd_qmm {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd rms_norm: " + what);
}

// MLX's order: the squares summed left to right, times 1/size (rounded from double), plus eps, MLX's
// rsqrt, then x times that, times the weight.
inline void norm_row(const float* src, int64_t d_stride, const float* w, int64_t w_stride, int D, float eps,
                     float* dst) {
  const float normalizer = static_cast<float>(1.0 / static_cast<double>(D));
  float sum = 0.0f;
  for (int i = 0; i < D; ++i) {
    const float v = src[i * d_stride];
    const float square = v * v;
    sum = sum + square;
  }
  const float mean = sum * normalizer;
  const float r = mx::simd::rsqrt(mx::simd::Simd<float, 1>(mean + eps)).value;
  for (int i = 0; i < D; ++i) {
    const float scaled = src[i * d_stride] * r;
    dst[i] = scaled * w[i * w_stride];
  }
}

void run_rms_norm(const mx::array& x, const mx::array& weight, float* out, float eps) {
  const int nd = x.ndim();
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  const int D = shape[nd - 1];
  const int64_t d_stride = strides[nd - 1];
  const float* w = weight.data<float>();
  const int64_t w_stride = weight.strides()[0];
  const float* base = x.data<float>();
  const size_t rows = D == 0 ? 0 : x.size() / D;
  std::vector<int> index(nd - 1, 0);
  for (size_t row = 0; row < rows; ++row) {
    int64_t at = 0;
    for (int d = 0; d < nd - 1; ++d) at += static_cast<int64_t>(index[d]) * strides[d];
    norm_row(base + at, d_stride, w, w_stride, D, eps, out + row * D);
    for (int d = nd - 2; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

void rms_norm_rows(const float* x, int64_t rows, int D, const float* weight, float eps, float* out) {
  for (int64_t row = 0; row < rows; ++row) norm_row(x + row * D, 1, weight, 1, D, eps, out + row * D);
}

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, mx::StreamOrDevice s) {
  check(x.ndim() >= 1 && x.dtype() == mx::float32, "x must be a float32 array");
  check(weight.ndim() == 1 && weight.dtype() == mx::float32 && weight.size() == static_cast<size_t>(x.shape(-1)),
        "weight must be a float32 vector of x's last size");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  return mx::array(x.shape(), mx::float32, std::make_shared<CpuRMSNorm>(stream, eps), {x, weight});
}

void CpuRMSNorm::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(inputs[0]);
  encoder.set_input_array(inputs[1]);
  encoder.set_output_array(out);
  encoder.dispatch([x = inputs[0], weight = inputs[1], dst = out.data<float>(), eps = eps_]() {
    run_rms_norm(x, weight, dst, eps);
  });
}

void CpuRMSNorm::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuRMSNorm runs on the CPU only; on a GPU use mx.fast.rms_norm");
}

bool CpuRMSNorm::is_equivalent(const mx::Primitive& other) const {
  return eps_ == static_cast<const CpuRMSNorm&>(other).eps_;
}

std::vector<mx::Shape> CpuRMSNorm::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

}  // namespace mlxd_qmm
