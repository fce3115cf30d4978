// A growing 64-byte aligned float buffer: kept per thread by the ops that copy x into a kernel's order.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <new>

namespace mlxd_qmm {

class AlignedFloats {
 public:
  AlignedFloats() = default;
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  ~AlignedFloats() { std::free(data_); }
  // At least `count` floats (the contents are not kept when it grows).
  float* reserve(size_t count) {
    if (count > capacity_) {
      std::free(data_);
      capacity_ = std::max(count, 2 * capacity_);
      data_ = static_cast<float*>(std::aligned_alloc(64, (capacity_ * sizeof(float) + 63) / 64 * 64));
      if (data_ == nullptr) {
        capacity_ = 0;
        throw std::bad_alloc();
      }
    }
    return data_;
  }
  float* data() { return data_; }

 private:
  float* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace mlxd_qmm
