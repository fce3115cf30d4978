#include "qmatmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "aligned_floats.h"
#include "dispatch.h"
#include "kernel.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"

namespace mlxd_qmm {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd quantized_matmul: " + what);
}


// Copies a strided float array into dense row-major order (x reaches the primitive as it is; most
// inputs are already dense, a transposed or sliced one is gathered here instead of by an extra op).
void gather_dense(const mx::array& a, float* out) {
  const float* src = a.data<float>();
  const int nd = a.ndim();
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  std::vector<int> index(nd, 0);
  const size_t total = a.size();
  for (size_t i = 0; i < total; ++i) {
    int64_t at = 0;
    for (int d = 0; d < nd; ++d) at += static_cast<int64_t>(index[d]) * strides[d];
    out[i] = src[at];
    for (int d = nd - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

#if defined(MLXD_HAVE_AMX)
// Splits x (dense) into this thread's AMX buffers and runs the AMX kernel on each problem.
void run_amx(const float* x, std::vector<Problem>& problems, const Isa& isa) {
  thread_local AlignedFloats piece_buffer, sum_buffer;
  const Problem& first = problems.front();
  const int row_tiles = amx_row_tiles(first.M), chunks = first.K / 32, groups = first.K / first.group_size;
  auto* pieces = reinterpret_cast<uint32_t*>(piece_buffer.reserve(static_cast<size_t>(row_tiles) * chunks * kAmxChunkWords));
  float* sums = sum_buffer.reserve(static_cast<size_t>(row_tiles) * groups * 16);
  amx_prepare(x, first.M, first.K, first.group_size, pieces, sums);
  const AmxRows rows{pieces, sums, row_tiles, chunks, groups};
  for (Problem& problem : problems) problem.amx = &rows;
  run_problems(problems, Isa{"amx", isa.lanes, amx_kernel()});
}
#endif

// Rows of x a pool thread rounds to int8 at the least (a product of fewer than twice as many: the calling thread's).
constexpr int kInt8RowsAPiece = 4;

// Quantizes x (dense) into this thread's int8 buffers and runs the int8-activation kernel on each problem.
void run_int8(std::vector<Problem> problems) {
  thread_local AlignedFloats q_buffer, lane_buffer, sum_buffer;
  const Problem& first = problems.front();
  const int Kpad = int8_padded_k(first.K);
  const int Gpad = int8_padded_groups(first.K / first.group_size);
  const size_t M = first.M;
  auto* q = reinterpret_cast<int8_t*>(q_buffer.reserve(M * Kpad / 4));
  float* lanes = lane_buffer.reserve(M * Kpad / 8);
  float* sums = sum_buffer.reserve(M * Gpad);
  const int block = int8_block();
  // rows rounded on every pool thread where there are rows enough to share (each row alone: the same bytes)
  const int pieces = std::max(1, std::min(pool_threads(), first.M / kInt8RowsAPiece));
  auto piece = [&](int i) {
    const int r0 = first.M * i / pieces, r1 = first.M * (i + 1) / pieces;
    quantize_rows_int8(first.x + static_cast<int64_t>(r0) * first.K, r1 - r0, first.K, first.group_size, block,
                       first.bits == 4, q + static_cast<int64_t>(r0) * Kpad, lanes + static_cast<int64_t>(r0) * (Kpad / 8),
                       sums + static_cast<int64_t>(r0) * Gpad);
  };
  if (pieces > 1) {
    run_tasks(pieces, piece);
  } else {
    piece(0);
  }
  const Int8Rows rows{q, lanes, sums, Kpad, Gpad, block};
  for (Problem& problem : problems) problem.int8 = &rows;
  const Isa isa{"avx512vnni", 16, int8_kernel()};
  run_problems(problems, isa);
}

}  // namespace

const float* dense_floats(const mx::array& a, std::vector<float>& copy) {
  if (a.flags().row_contiguous) return a.data<float>();
  copy.resize(a.size());
  gather_dense(a, copy.data());
  return copy.data();
}

mx::array row_contiguous(const mx::array& a, const mx::Stream& stream) {
  if (a.is_available() && a.flags().row_contiguous) return a;
  return mx::contiguous(a, false, stream);
}

void check_format(int bits, int group_size, const std::string& op) {
  if (bits != 4 && bits != 8) {
    throw std::invalid_argument("mlxd " + op + ": bits must be 4 or 8, got " + std::to_string(bits));
  }
  if (group_size != 32 && group_size != 64 && group_size != 128 && !(group_size == 16 && bits == 8)) {
    throw std::invalid_argument("mlxd " + op + ": group size must be 32, 64 or 128 (or 16 for 8 bits), got " +
                                std::to_string(group_size));
  }
}

mx::Dtype read_scale_dtype(const mx::array& scales, const mx::array& biases) {
  const auto& st = scales.dtype();
  const bool as_stored = st == biases.dtype() && (st == mx::float32 || st == mx::float16 || st == mx::bfloat16);
  return as_stored ? st : mx::float32;
}

int scale_type_of(const mx::array& scales) {
  return scales.dtype() == mx::float16    ? kScaleFloat16
         : scales.dtype() == mx::bfloat16 ? kScaleBFloat16
                                          : kScaleFloat32;
}

int int8_mode(int asked, int bits, int group_size) {
  if (asked == kInt8Columns) {
    // column-block order is read by the int8 kernel alone: no float path could take these weights
    check(int8_available(bits) && group_size >= 32,
          "column-block weights need groups of 32 or more and the int8 kernel (AVX-512 VNNI)");
    return kInt8Columns;
  }
  return asked != kInt8Off && int8_available(bits) && group_size >= 32 ? kInt8Rows : kInt8Off;
}

PackedLinear checked_packed(const PackedLinear& p, int K, const mx::Stream& stream) {
  check_format(p.bits, p.group_size, "quantized_matmul");
  check(p.weight.dtype() == mx::uint32 && p.weight.ndim() == 2, "weights must be a 2-D uint32 array");
  const int N = p.weight.shape(0);
  const int weight_k = p.weight.shape(1) * 32 / p.bits;
  check(K == weight_k, "x has " + std::to_string(K) + " features, the weights take " + std::to_string(weight_k));
  check(K % p.group_size == 0, "the input size is not a multiple of the group size");
  check(p.group_size != 16 || K % 32 == 0, "with groups of 16 the input size must be a multiple of 32");
  const mx::Shape groups{N, K / p.group_size};
  check(p.scales.shape() == groups && p.biases.shape() == groups, "scales and biases must be [N, K / group_size]");
  check(!p.sizes.empty(), "sizes must name at least one output");
  int64_t total = 0;
  for (int size : p.sizes) {
    check(size > 0, "every output size must be positive");
    total += size;
  }
  check(total == N, "the output sizes sum to " + std::to_string(total) + ", the weights have " + std::to_string(N) +
                        " rows");
  const mx::Dtype scale_dtype = read_scale_dtype(p.scales, p.biases);
  return PackedLinear{row_contiguous(p.weight, stream), row_contiguous(mx::astype(p.scales, scale_dtype, stream), stream),
                      row_contiguous(mx::astype(p.biases, scale_dtype, stream), stream), p.group_size, p.bits, p.sizes,
                      int8_mode(p.int8, p.bits, p.group_size)};
}

std::vector<mx::array> quantized_matmul_split(const mx::array& x, const mx::array& w, const mx::array& scales,
                                              const mx::array& biases, int group_size, int bits,
                                              const std::vector<int>& sizes, int int8_activations,
                                              mx::StreamOrDevice s) {
  check(x.ndim() >= 1, "x must have at least one dimension");
  check(mx::issubdtype(x.dtype(), mx::floating), "x must be floating point");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  const PackedLinear packed =
      checked_packed(PackedLinear{w, scales, biases, group_size, bits, sizes, int8_activations}, x.shape(-1), stream);
  auto x32 = mx::astype(x, mx::float32, stream);
  std::vector<mx::Shape> shapes;
  for (int size : sizes) {
    mx::Shape shape = x.shape();
    shape.back() = size;
    shapes.push_back(shape);
  }
  const int int8 = packed.int8;
  auto outs = mx::array::make_arrays(
      shapes, std::vector<mx::Dtype>(sizes.size(), mx::float32),
      std::make_shared<CpuQuantizedMatmul>(stream, group_size, bits, int8, sizes),
      {x32, packed.weight, packed.scales, packed.biases});
  if (x.dtype() != mx::float32) {
    for (auto& out : outs) out = mx::astype(out, x.dtype(), stream);
  }
  return outs;
}

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits, int int8_activations,
                           mx::StreamOrDevice s) {
  check(w.ndim() == 2, "weights must be a 2-D uint32 array");
  return quantized_matmul_split(x, w, scales, biases, group_size, bits, {w.shape(0)}, int8_activations, s)[0];
}

std::string kernel_isa() {
  return select_isa().name;
}

bool amx_available() {
  return amx_kernel() != nullptr;
}

bool small_split_tiles_available() {
  return std::strcmp(select_isa().name, "avx512") == 0;
}

void set_small_split_tiles(int bits, bool on) {
  check_format(bits, 32, "set_small_split_tiles");
  if (on && !small_split_tiles_available()) throw std::invalid_argument("mlxd set_small_split_tiles: needs AVX-512");
  const int bit = small_split_bit(bits);
  if (on) {
    small_split_choice.fetch_or(bit);
  } else {
    small_split_choice.fetch_and(~bit);
  }
}

bool small_split_tiles(int bits) {
  return (small_split_choice.load() & small_split_bit(bits)) != 0;
}

bool int8_available(int bits) {
  return (bits == 4 || bits == 8) && int8_kernel() != nullptr;
}

int kernel_threads(int) {
  return pool_threads();
}

std::vector<Problem> packed_problems(const mx::array& w, const mx::array& scales, const mx::array& biases,
                                     int group_size, int bits, const std::vector<int>& sizes,
                                     const std::vector<float*>& outs, int M, int K) {
  const int scale_type = scale_type_of(scales);
  const int64_t row_bytes = static_cast<int64_t>(K) * bits / 8;
  const int64_t groups = K / group_size;
  std::vector<Problem> problems;
  int first_row = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    const int64_t group_offset = first_row * groups * scale_bytes(scale_type);
    problems.push_back(Problem{nullptr, reinterpret_cast<const uint8_t*>(w.data<uint32_t>()) + first_row * row_bytes,
                               static_cast<const char*>(scales.data<void>()) + group_offset,
                               static_cast<const char*>(biases.data<void>()) + group_offset, outs[j], M, sizes[j], K,
                               group_size, bits, scale_type});
    first_row += sizes[j];
  }
  return problems;
}

void run_products(const float* x, std::vector<Problem> problems, int int8) {
  if (problems.empty() || problems.front().M == 0) return;
  if (int8 != kInt8Off) {
    for (Problem& problem : problems) {
      problem.x = x;
      problem.columns = int8 == kInt8Columns;
    }
    run_int8(problems);
    return;
  }
  const Isa& isa = select_isa();
  const Problem& first = problems.front();
  const bool amx = first.M >= amx_min_rows(first.bits) && amx_kernel() != nullptr;
  // the vector kernels' copy of x: all of a product's columns, or on AMX the columns past its last whole
  // tile of 16 (none when every part's width is a multiple of 16)
  const bool vector_columns = !amx || std::any_of(problems.begin(), problems.end(), [](const Problem& p) {
    return p.N % 16 != 0;
  });
  if (vector_columns) {
    // x goes into a 64-byte aligned copy (split order for 4 bits): every vector load then stays within
    // one cache line.
    thread_local AlignedFloats copy;
    float* rows = copy.reserve(static_cast<size_t>(first.M) * first.K);
    if (first.bits == 4) {
      split_rows(x, rows, first.M, first.K, 2 * isa.lanes);
    } else {
      std::memcpy(rows, x, sizeof(float) * first.M * first.K);
    }
    const uint64_t version = next_x_version();
    for (Problem& problem : problems) {
      problem.x = rows;
      problem.x_version = version;
    }
  }
#if defined(MLXD_HAVE_AMX)  // else amx_kernel() is null, and the AMX kernel is not in this build
  if (amx) {
    run_amx(x, problems, isa);
    return;
  }
#endif
  run_problems(problems, isa);
}

void CpuQuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const auto& x = inputs[0];
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (!inputs[i].flags().row_contiguous) throw std::runtime_error("CpuQuantizedMatmul: weights must be row-contiguous");
  }
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& input : inputs) encoder.set_input_array(input);
  const int K = x.shape(-1);
  const int M = K == 0 ? 0 : static_cast<int>(x.size() / K);
  std::vector<float*> outs;
  for (auto& out : outputs) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    encoder.set_output_array(out);
    outs.push_back(out.data<float>());
  }
  auto problems = packed_problems(inputs[1], inputs[2], inputs[3], group_size_, bits_, sizes_, outs, M, K);
  const bool x_dense = x.flags().row_contiguous;
  encoder.dispatch([problems = std::move(problems), int8 = int8_, x_dense, x]() mutable {
    if (problems.front().M == 0) return;
    thread_local AlignedFloats dense;
    const float* source = x.data<float>();
    if (!x_dense) {
      float* gathered = dense.reserve(x.size());
      gather_dense(x, gathered);
      source = gathered;
    }
    run_products(source, std::move(problems), int8);
  });
}

void CpuQuantizedMatmul::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("CpuQuantizedMatmul runs on the CPU only; on a GPU use mx.quantized_matmul");
}

bool CpuQuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuQuantizedMatmul&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_ && int8_ == o.int8_ && sizes_ == o.sizes_;
}

std::vector<mx::Shape> CpuQuantizedMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  std::vector<mx::Shape> shapes;
  for (int size : sizes_) {
    mx::Shape shape = inputs[0].shape();
    shape.back() = size;
    shapes.push_back(shape);
  }
  return shapes;
}

}  // namespace mlxd_qmm
