#include "rope.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/backend/cpu/simd/simd.h"

namespace mlxd_qmm {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd rope: " + what);
}

// MLX's own CPU exp, sin and cos (its simd headers), so the angles match its RoPE bit for bit.
float mlx_exp(float v) {
  return mx::simd::exp(mx::simd::Simd<float, 1>(v)).value;
}
float mlx_sin(float v) {
  return mx::simd::sin(mx::simd::Simd<float, 1>(v)).value;
}
float mlx_cos(float v) {
  return mx::simd::cos(mx::simd::Simd<float, 1>(v)).value;
}

struct RopeJob {
  mx::array x;
  mx::array offset;
  float* out;
  int dims;
  bool traditional;
  float base;
  float scale;
};

void run_rope(const RopeJob& job) {
  const auto& x = job.x;
  const int nd = x.ndim();
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  const int D = shape[nd - 1];
  const int T = shape[nd - 2];
  const int offsets = static_cast<int>(job.offset.size());
  const int64_t offset_stride = job.offset.ndim() == 1 ? job.offset.strides()[0] : 0;
  const RopeTables tables(job.offset.data<int32_t>(), offsets, offset_stride, T, job.dims, job.base, job.scale);

  const float* src_base = x.data<float>();
  const int64_t d_stride = strides[nd - 1];
  const size_t rows = D == 0 ? 0 : x.size() / D;
  std::vector<int> index(nd - 1, 0);  // over every axis but the last
  for (size_t row = 0; row < rows; ++row) {
    int64_t at = 0;
    for (int d = 0; d < nd - 1; ++d) at += static_cast<int64_t>(index[d]) * strides[d];
    const int b = offsets == 1 ? 0 : index[0];
    tables.apply(src_base + at, d_stride, job.out + row * D, D, job.traditional, b, index[nd - 2]);
    for (int d = nd - 2; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

RopeTables::RopeTables(const int32_t* offsets, int count, int64_t stride, int T, int dims, float base, float scale)
    : T_(T), half_(dims / 2), dims_(dims) {
  // inv_freqs = exp(arange(0, -half, -1) * (log(base) / half)), theta = (t + offset) * scale * inv_freqs
  std::vector<float> inv(half_);
  const float step = std::log(base) / half_;
  for (int j = 0; j < half_; ++j) inv[j] = mlx_exp(static_cast<float>(-j) * step);
  coss_.resize(static_cast<size_t>(count) * T * half_);
  sins_.resize(coss_.size());
  for (int b = 0; b < count; ++b) {
    const float start = static_cast<float>(offsets[b * stride]);
    for (int t = 0; t < T; ++t) {
      const float position = (static_cast<float>(t) + start) * scale;
      float* c = coss_.data() + (static_cast<size_t>(b) * T + t) * half_;
      float* s = sins_.data() + (static_cast<size_t>(b) * T + t) * half_;
      for (int j = 0; j < half_; ++j) {
        const float theta = position * inv[j];
        c[j] = mlx_cos(theta);
        s[j] = mlx_sin(theta);
      }
    }
  }
}

void RopeTables::apply(const float* src, int64_t d_stride, float* dst, int D, bool traditional, int b, int t) const {
  const float* c = coss_.data() + (static_cast<size_t>(b) * T_ + t) * half_;
  const float* s = sins_.data() + (static_cast<size_t>(b) * T_ + t) * half_;
  const int half = half_;
  if (traditional) {
    for (int j = 0; j < half; ++j) {
      const float x1 = src[(2 * j) * d_stride];
      const float x2 = src[(2 * j + 1) * d_stride];
      dst[2 * j] = x1 * c[j] - x2 * s[j];
      dst[2 * j + 1] = x1 * s[j] + x2 * c[j];
    }
  } else {
    for (int j = 0; j < half; ++j) {
      const float x1 = src[j * d_stride];
      const float x2 = src[(j + half) * d_stride];
      dst[j] = x1 * c[j] - x2 * s[j];
      dst[j + half] = x1 * s[j] + x2 * c[j];
    }
  }
  for (int j = dims_; j < D; ++j) dst[j] = src[j * d_stride];
}

mx::array rope(const mx::array& x, const mx::array& offset, int dims, bool traditional, float base,
               float scale, mx::StreamOrDevice s) {
  check(x.ndim() >= 3, "x must have at least 3 dimensions");
  check(x.dtype() == mx::float32, "x must be float32");
  check(dims > 0 && dims % 2 == 0 && dims <= x.shape(-1), "dims must be even, positive and at most x's last axis");
  check(offset.ndim() <= 1, "offset must be a scalar or a vector");
  check(offset.size() == 1 || static_cast<int>(offset.size()) == x.shape(0),
        "offset must be a scalar or have one entry per entry of x's first axis");
  check(mx::issubdtype(offset.dtype(), mx::integer), "offset must be an integer");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  auto offset32 = offset.dtype() == mx::int32 ? offset : mx::astype(offset, mx::int32, stream);
  return mx::array(x.shape(), mx::float32, std::make_shared<CpuRope>(stream, dims, traditional, base, scale),
                   {x, offset32});
}

void CpuRope::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(inputs[0]);
  encoder.set_input_array(inputs[1]);
  encoder.set_output_array(out);
  RopeJob job{inputs[0], inputs[1], out.data<float>(), dims_, traditional_, base_, scale_};
  encoder.dispatch([job = std::move(job)]() { run_rope(job); });
}

void CpuRope::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuRope runs on the CPU only; on a GPU use mx.fast.rope");
}

bool CpuRope::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuRope&>(other);
  return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ && scale_ == o.scale_;
}

std::vector<mx::Shape> CpuRope::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

}  // namespace mlxd_qmm
