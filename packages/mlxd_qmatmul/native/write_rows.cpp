#include "write_rows.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "vector_math.h"  // narrow_to_halves

namespace mlxd_qmm {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd write_rows: " + what);
}

// `src`'s elements (any strides) into `dst`, row-major: the copy of a buffer something else still holds.
void copy_elements(const mx::array& src, char* dst) {
  const size_t item = src.itemsize();
  const int nd = src.ndim();
  std::vector<int64_t> at(nd, 0);
  const char* base = src.data<char>();
  for (size_t i = 0; i < src.size(); ++i) {
    int64_t offset = 0;
    for (int d = 0; d < nd; ++d) offset += at[d] * src.strides()[d];
    std::memcpy(dst + i * item, base + offset * static_cast<int64_t>(item), item);
    for (int d = nd - 1; d >= 0 && ++at[d] == src.shape(d); --d) at[d] = 0;
  }
}

}  // namespace

mx::array write_rows(const mx::array& buffer, const mx::array& rows, const mx::array& index, mx::StreamOrDevice s) {
  check(buffer.ndim() >= 1 && buffer.size() > 0, "the buffer must have at least one axis and elements");
  check(rows.dtype() == buffer.dtype() || (rows.dtype() == mx::float32 && buffer.dtype() == mx::float16),
        "rows must have the buffer's dtype (or be float32 for a float16 buffer)");
  check(index.ndim() == 1 && index.dtype() == mx::int32, "the index must be one axis of int32");
  const int64_t D = buffer.shape(-1);
  check(static_cast<int64_t>(rows.size()) == static_cast<int64_t>(index.size()) * D,
        "rows must hold one row of the buffer's last axis per index entry");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  check(rows.ndim() >= 1 && rows.shape(-1) == D, "rows must end in the buffer's last axis");
  return mx::array(buffer.shape(), buffer.dtype(), std::make_shared<CpuWriteRows>(stream), {buffer, rows, index});
}

void CpuWriteRows::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& buffer = inputs[0];
  // the buffer's memory taken over when nothing else holds it, else copied (MLX's slice update does the same)
  const bool dense = buffer.flags().row_contiguous && buffer.data_size() == buffer.size();
  const bool donated = dense && buffer.is_donatable();
  if (donated) {
    out.copy_shared_buffer(buffer);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  auto& encoder = mx::cpu::get_command_encoder(stream());
  if (!donated) {
    encoder.set_input_array(buffer);
    encoder.dispatch([buffer, dense, out = out.data<char>()]() {
      if (dense) {
        std::memcpy(out, buffer.data<char>(), buffer.nbytes());
      } else {
        copy_elements(buffer, out);
      }
    });
  }
  encoder.set_input_array(inputs[1]);
  encoder.set_input_array(inputs[2]);
  encoder.set_output_array(out);
  encoder.dispatch([rows = inputs[1], index = inputs[2], out = out.data<char>(), limit = out.size(),
                    out_item = out.itemsize()]() {
    // rows in row-major order over their leading axes (any strides), D elements each
    const int nd = rows.ndim();
    const int64_t n = index.size(), D = rows.shape(nd - 1), col_step = rows.strides()[nd - 1];
    const size_t item = rows.itemsize(), row_bytes = static_cast<size_t>(D) * item;
    const bool narrow = out_item != item;  // float32 rows into a float16 buffer
    std::vector<float> gathered(narrow && col_step != 1 ? D : 0);
    const int32_t* at = index.data<int32_t>();
    const int64_t index_step = index.strides()[0];
    const char* src = rows.data<char>();
    std::vector<int64_t> lead(nd > 1 ? nd - 1 : 0, 0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t offset = 0;  // row i's first element, in elements
      for (int d = 0; d + 1 < nd; ++d) offset += lead[d] * rows.strides()[d];
      for (int d = nd - 2; d >= 0 && ++lead[d] == rows.shape(d); --d) lead[d] = 0;
      const int64_t row = at[i * index_step];
      // an index outside the buffer writes nothing (the callers' indices come from the storage's own plan)
      if (row < 0 || (row + 1) * D > static_cast<int64_t>(limit)) continue;
      const char* from = src + offset * static_cast<int64_t>(item);
      if (narrow) {
        const float* values = reinterpret_cast<const float*>(from);
        if (col_step != 1) {
          for (int64_t d = 0; d < D; ++d) gathered[d] = values[d * col_step];
          values = gathered.data();
        }
        narrow_to_halves(values, D, reinterpret_cast<uint16_t*>(out) + row * D);
        continue;
      }
      char* dst = out + row * static_cast<int64_t>(row_bytes);
      if (col_step == 1) {
        std::memcpy(dst, from, row_bytes);
      } else {
        for (int64_t d = 0; d < D; ++d) std::memcpy(dst + d * item, from + d * col_step * item, item);
      }
    }
  });
}

void CpuWriteRows::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuWriteRows runs on the CPU only; on a GPU use a scatter");
}

}  // namespace mlxd_qmm
