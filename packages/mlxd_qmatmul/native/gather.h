// The experts' products of a mixture-of-experts layer on the CPU kernels: mlx-lm's QuantizedSwitchLinear
// (mx.gather_qmm with transpose=True and expert indices for the weights only).
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// y[r] = x[r] @ dequantize(w[experts[r]], scales[..], biases[..])^T for every row r of x [..., K]: w [E, N, K *
// bits / 32] uint32, scales and biases [E, N, K / group_size], experts one integer a row of x (any shape of
// x.size / K elements). Returns [..., N] (x's leading shape), float32 math, in x's dtype. A row whose expert
// is not below E comes out as zeros. Raises std::invalid_argument for a layout the kernels do not take.
mx::array gather_quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                                  const mx::array& biases, const mx::array& experts, int group_size, int bits,
                                  mx::StreamOrDevice s = {});

// Rows are put in order of their expert, each expert's rows run as one product (the AMX kernel where they are
// enough rows for it, else every expert's product in one job on the pool), and the results go back in the
// rows' order.
class CpuGatherQuantizedMatmul : public mx::Primitive {
 public:
  CpuGatherQuantizedMatmul(mx::Stream stream, int group_size, int bits)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  const char* name() const override {
    return "CpuGatherQuantizedMatmul";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int group_size_;
  int bits_;
};

}  // namespace mlxd_qmm
