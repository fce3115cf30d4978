#include "swiglu.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "qmatmul.h"
#include "vector_math.h"

namespace mlxd_qmm {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd swiglu: " + what);
}

}  // namespace

mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s) {
  check(gate.dtype() == mx::float32 && up.dtype() == mx::float32, "gate and up must be float32");
  check(gate.shape() == up.shape(), "gate and up must have the same shape");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  return mx::array(gate.shape(), mx::float32, std::make_shared<CpuSwiglu>(stream), {gate, up});
}

void CpuSwiglu::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(inputs[0]);
  encoder.set_input_array(inputs[1]);
  encoder.set_output_array(out);
  encoder.dispatch([gate = inputs[0], up = inputs[1], dst = out.data<float>(), n = static_cast<int64_t>(out.size())]() {
    std::vector<float> gate_copy, up_copy;
    swiglu_rows(dense_floats(gate, gate_copy), dense_floats(up, up_copy), dst, n);
  });
}

void CpuSwiglu::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuSwiglu runs on the CPU only; on a GPU use mlx-lm's swiglu");
}

}  // namespace mlxd_qmm
