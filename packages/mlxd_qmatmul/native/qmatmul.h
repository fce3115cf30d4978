// The MLX primitive: a quantized matmul for MLX's affine format that runs on the CPU kernels here.
#pragma once

#include <string>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "kernel.h"

namespace mx = mlx::core;

namespace mlxd_qmm {

// x[..., K] @ dequantize(w, scales, biases)^T -> [..., N], float32 (x is cast to float32 and back).
// Raises std::invalid_argument for a layout the kernels do not take (bits other than 4 and 8, a group
// size other than 32, 64 or 128, shapes that do not match).
// With int8_activations, products run on the int8-activation kernel where the CPU has it (x rounded to
// int8 in blocks of int8_block() elements: results near the float product, not within float32 rounding);
// elsewhere the float kernel runs.
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits, int int8_activations = kInt8Off,
                           mx::StreamOrDevice s = {});

// The same product for a weight packed from several layers' rows (sizes: each layer's output count, in
// order, summing to N), one output per layer: the layers' products of one x as one op and one job on the
// pool, each output dense and equal to that layer's own quantized_matmul (the same kernel per column).
std::vector<mx::array> quantized_matmul_split(const mx::array& x, const mx::array& w, const mx::array& scales,
                                              const mx::array& biases, int group_size, int bits,
                                              const std::vector<int>& sizes, int int8_activations = kInt8Off,
                                              mx::StreamOrDevice s = {});

// Whether products of this many bits run on the int8-activation kernel when asked (the CPU has AVX-512 VNNI).
bool int8_available(int bits);

// The instruction set the kernels run with here and the number of threads they use (the same for every
// row count).
std::string kernel_isa();

// Whether products of amx_min_rows(bits) rows or more run on the AMX kernel here.
bool amx_available();

// Whether the float kernel here can split tiles of 3-6 rows (AVX-512), and the choice for products set up from
// now on, by weight width (4 or 8 bits): kernel.h's small_split_choice.
bool small_split_tiles_available();
void set_small_split_tiles(int bits, bool on);
bool small_split_tiles(int bits);
int kernel_threads(int rows);

// The float array's elements in row-major order: its own buffer when it is dense, else gathered into `copy`
// (a transposed or broadcast view; what the ops are given is almost always dense).
const float* dense_floats(const mx::array& a, std::vector<float>& copy);

// An input array as the primitives read it: itself when already evaluated and row-contiguous (the loaded
// weights), else through a Contiguous op (every op in the graph is one more dispatch per step).
mx::array row_contiguous(const mx::array& a, const mx::Stream& stream);

// Raises std::invalid_argument ("mlxd <op>: ...") unless bits and group size are ones the kernels take.
void check_format(int bits, int group_size, const std::string& op);

// The dtype the kernels read scales and biases in: as stored when both are float32, float16 or bfloat16 (a half
// value widens to float32 exactly as it is read), otherwise float32.
mx::Dtype read_scale_dtype(const mx::array& scales, const mx::array& biases);

// The kernels' ScaleType of scales already in read_scale_dtype.
int scale_type_of(const mx::array& scales);

// A packed quantized weight in MLX's affine format and the output sizes of its parts (q/k/v, gate/up; one
// part for a plain layer).
struct PackedLinear {
  mx::array weight, scales, biases;
  int group_size, bits;
  std::vector<int> sizes;
  int int8 = kInt8Off;  // Int8Mode: x rounded to int8 for this product (opt-in), and the weights' order
};

// The Int8Mode a product runs with when `asked` for it: int8 only where the CPU has the int8 kernel for these bits
// and groups (else float32); column-block order only with the int8 kernel and groups of 32 or more
// (std::invalid_argument otherwise: no other path reads that order).
int int8_mode(int asked, int bits, int group_size);

// Checks a packed weight for K input features (std::invalid_argument naming what is wrong) and returns it as
// the kernels read it: row-contiguous, scales and biases as stored when float32, float16 or bfloat16.
PackedLinear checked_packed(const PackedLinear& p, int K, const mx::Stream& stream);

// The parts of one packed weight (w, scales, biases evaluated and row-contiguous; sizes: each part's rows)
// as kernel problems over M rows of K features, part j writing dense outs[j] ([M, sizes[j]]); run_products
// supplies x.
std::vector<Problem> packed_problems(const mx::array& w, const mx::array& scales, const mx::array& biases,
                                     int group_size, int bits, const std::vector<int>& sizes,
                                     const std::vector<float*>& outs, int M, int K);

// Runs problems over dense x [M, K] on this thread and the kernel pool: x copied into the kernels' order
// (split order for 4 bits) or, with int8, rounded to int8 for the int8-activation kernel.
void run_products(const float* x, std::vector<Problem> problems, int int8);

// One output per entry of sizes (the column counts of the packed layers, in order).
class CpuQuantizedMatmul : public mx::Primitive {
 public:
  CpuQuantizedMatmul(mx::Stream stream, int group_size, int bits, int int8_activations, std::vector<int> sizes)
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
  int int8_;
  std::vector<int> sizes_;
};

}  // namespace mlxd_qmm
