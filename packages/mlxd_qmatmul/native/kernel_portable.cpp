// The baseline kernel (4 float lanes) in the compiler's generic vectors: SSE2 on x86-64, NEON on arm64,
// whatever 16-byte vectors the target has elsewhere; compiled with the build's default flags.
#include <cstring>

#include "kernel.h"

namespace {

struct Ops {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
  typedef uint8_t B __attribute__((vector_size(4)));
  static constexpr int V = 4;
  static float half(uint16_t h) { return mlxd_qmm::half_to_float(h); }
  static void halves16(const uint16_t* in, float* out) {
    for (int i = 0; i < 16; ++i) out[i] = half(in[i]);
  }
  static F zero() { return F{}; }
  static F load(const float* p) {
    F v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static F splat(float s) { return F{s, s, s, s}; }
  static F fma(F a, F b, F c) { return a * b + c; }
  static F add(F a, F b) { return a + b; }
  static float hsum(F v) { return (v[0] + v[2]) + (v[1] + v[3]); }
  static I widen(const uint8_t* p) {
    B b;
    std::memcpy(&b, p, sizeof(b));
    return __builtin_convertvector(b, I);
  }
  struct Group {
    F scale, bias;
  };
  static Group group(float s, float b) { return {splat(s), splat(b)}; }
  static void nibbles(const Group& g, const uint8_t* p, F& lo, F& hi) {
    const I q = widen(p);
    lo = fma(__builtin_convertvector(q & 15, F), g.scale, g.bias);
    hi = fma(__builtin_convertvector(q >> 4, F), g.scale, g.bias);
  }
  static F bytes(const Group& g, const uint8_t* p) { return fma(__builtin_convertvector(widen(p), F), g.scale, g.bias); }
};

#include "kernel_tiles.inc"

}  // namespace

namespace mlxd_qmm {
void kernel_portable(const Problem& p, int n0, int n1) {
  kernel_entry(p, n0, n1);
}
int lanes_portable() {
  return Ops::V;
}
}  // namespace mlxd_qmm
