// The MLX primitive: a quantized matmul for MLX's affine format that runs on the CPU kernels here.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// x[..., K] @ dequantize(w, scales, biases)^T -> [..., N], float32 (x is cast to float32 and back).
// Raises std::invalid_argument for a layout the kernels do not take (bits other than 4 and 8, a group
// size other than 32, 64 or 128, shapes that do not match).
// With int8_activations, products run on the int8-activation kernel where the CPU has it (x rounded to
// int8 in blocks of kInt8Block elements: results near the float product, not within float32 rounding);
// elsewhere the float kernel runs.
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits, bool int8_activations = false,
                           mx::StreamOrDevice s = {});

// The same product for a weight packed from several layers' rows (sizes: each layer's output count, in
// order, summing to N), one output per layer: the layers' products of one x as one op and one job on the
// pool, each output dense and equal to that layer's own quantized_matmul (the same kernel per column).
std::vector<mx::array> quantized_matmul_split(const mx::array& x, const mx::array& w, const mx::array& scales,
                                              const mx::array& biases, int group_size, int bits,
                                              const std::vector<int>& sizes, bool int8_activations = false,
                                              mx::StreamOrDevice s = {});

// Whether products of this many bits run on the int8-activation kernel when asked (the CPU has AVX-512 VNNI).
bool int8_available(int bits);

// The instruction set the kernels run with here and the number of threads they use (the same for every
// row count).
std::string kernel_isa();
int kernel_threads(int rows);

// One output per entry of sizes (the column counts of the packed layers, in order).
class CpuQuantizedMatmul : public mx::Primitive {
 public:
  CpuQuantizedMatmul(mx::Stream stream, int group_size, int bits, bool int8_activations, std::vector<int> sizes)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits), int8_(int8_activations), sizes_(std::move(sizes)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  const char* name() const override {
    return "CpuQuantizedMatmul";
  }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;

 private:
  int group_size_;
  int bits_;
  bool int8_;
  std::vector<int> sizes_;
};

}  // namespace mlxd_qmm
