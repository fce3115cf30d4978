#include "attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "dispatch.h"
#include "kernel.h"  // half_to_float
#include "vector_math.h"

namespace mlxd_qmm {

namespace {

// Multiply-adds (pairs x queries x keys x head size) from which a product is split over threads.
constexpr int64_t kParallelAttentionWork = 1 << 17;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mlxd attention: " + what);
}

struct AttentionJob {
  mx::array q, k, v;
  std::optional<mx::array> mask;
  float* out;
  float scale;
  bool causal;
  bool token_major = false;  // out as [B, L, Hq, Dv] (the fused layer ops), else [B, Hq, L, Dv]
  // batch entry b's queries past lengths[b] are padding nothing reads: skipped, their outputs zeros
  const int32_t* lengths = nullptr;
  bool padding(int b, int l) const {
    return lengths != nullptr && l >= lengths[b];
  }
  // where query (b, h, l)'s Dv outputs go, in either layout
  float* out_row(int b, int h, int l) const {
    const int Hq = q.shape(1), L = q.shape(2), Dv = v.shape(3);
    const int64_t row = token_major ? (static_cast<int64_t>(b) * L + l) * Hq + h
                                    : (static_cast<int64_t>(b) * Hq + h) * L + l;
    return out + row * Dv;
  }
};

// The mask's strides over [B, Hq, L, S]: its axes aligned to the right, a broadcast axis 0.
std::array<int64_t, 4> mask_strides(const mx::array& mask) {
  std::array<int64_t, 4> strides{0, 0, 0, 0};
  const int nd = mask.ndim();
  for (int d = 0; d < nd; ++d) {
    const int axis = 4 - nd + d;
    strides[axis] = mask.shape(d) == 1 ? 0 : mask.strides()[d];
  }
  return strides;
}

// A job's mask as the loops read it: one query's row of a boolean mask (hidden keys false) or of an additive
// one, its entries `strides[3]` apart; both rows null without a mask.
struct MaskRows {
  std::array<int64_t, 4> strides{0, 0, 0, 0};
  const bool* hidden = nullptr;
  const float* added = nullptr;

  explicit MaskRows(const std::optional<mx::array>& mask) {
    if (!mask.has_value()) return;
    strides = mask_strides(*mask);
    if (mask->dtype() == mx::bool_) {
      hidden = mask->data<bool>();
    } else {
      added = mask->data<float>();
    }
  }
  int64_t at(int b, int h, int l) const { return b * strides[0] + h * strides[1] + l * strides[2]; }
  const bool* bool_row(int b, int h, int l) const { return hidden ? hidden + at(b, h, l) : nullptr; }
  const float* float_row(int b, int h, int l) const { return added ? added + at(b, h, l) : nullptr; }
};

// How many of a query's first `visible` keys to score under a boolean mask row: up to its last visible key,
// rounded up to a whole block of eight (keys past it are masked: their weights are zero, and a block of
// zeros adds nothing to the eight-lane sums, so the result is the same to the bit); all of them when the
// mask hides every key. A slot's span read past a short context (compiled decode) then costs nothing.
int visible_by_mask(const bool* row, int64_t stride, int visible) {
  int last = visible - 1;
  if (stride == 1) {
    while (last >= 7) {
      uint64_t block;
      std::memcpy(&block, row + last - 7, sizeof(block));
      if (block != 0) break;
      last -= 8;
    }
  }
  while (last >= 0 && !row[last * stride]) --last;
  return last < 0 ? visible : std::min(visible, (last + 8) / 8 * 8);
}

// Softmax's numerators of one query's first `visible` scores, in place: the mask applied (a hidden key's score
// set to the lowest float where `bool_row` hides it, `float_row` added: the mask's entries for this query,
// `step` apart; neither: no mask), then exp(score - max). Returns their sum.
float masked_softmax_numerators(float* scores, int visible, const bool* bool_row, const float* float_row,
                                int64_t step) {
  if (bool_row != nullptr) {
    for (int s = 0; s < visible; ++s) {
      if (!bool_row[s * step]) scores[s] = std::numeric_limits<float>::lowest();
    }
  } else if (float_row != nullptr) {
    for (int s = 0; s < visible; ++s) scores[s] += float_row[s * step];
  }
  return exp_shifted_sum(scores, visible, largest(scores, visible));
}

// One (batch, key head)'s keys or values as the loops read them: float32 rows where they are, or float16 rows
// (a cache kept at half the bytes) widened into `scratch` a block at a time. Widening is exact, so the sums
// are those of float32 rows holding the same values.
struct HeadRows {
  const float* wide = nullptr;     // float32 rows, `row_step` elements apart
  const uint16_t* half = nullptr;  // float16 rows (IEEE halves), likewise
  int64_t row_step = 0, col_step = 1;
  int width = 0;
  std::vector<float> scratch;

  HeadRows(const mx::array& a, int b, int head) : row_step(a.strides()[2]), col_step(a.strides()[3]), width(a.shape(3)) {
    const int64_t first = b * a.strides()[0] + head * a.strides()[1];
    if (a.dtype() == mx::float16) {
      half = reinterpret_cast<const uint16_t*>(a.data<mx::float16_t>()) + first;
    } else {
      wide = a.data<float>() + first;
    }
  }
  bool dense_halves() const { return half != nullptr && col_step == 1; }
  // rows [s0, s0 + count) as floats, dense within a row; *step is the distance between rows
  const float* rows(int s0, int count, int64_t* step) {
    if (wide != nullptr && col_step == 1) {
      *step = row_step;
      return wide + s0 * row_step;
    }
    scratch.resize(static_cast<size_t>(count) * width);
    if (half != nullptr && col_step == 1) {
      widen_halves(half + s0 * row_step, row_step, count, width, scratch.data());
    } else {
      for (int s = 0; s < count; ++s) {
        for (int d = 0; d < width; ++d) {
          const int64_t at = (s0 + s) * row_step + d * col_step;
          scratch[static_cast<size_t>(s) * width + d] = half != nullptr ? half_to_float(half[at]) : wide[at];
        }
      }
    }
    *step = width;
    return scratch.data();
  }
};

// The rows of (batch, head) pairs [pair0, pair1).
void run_attention_pairs(const AttentionJob& job, int pair0, int pair1) {
  const auto& q = job.q;
  const int Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int Hkv = job.k.shape(1), S = job.k.shape(2), Dv = job.v.shape(3);
  const int repeats = Hq / Hkv;
  const auto& qs = q.strides();
  const float* q_data = q.data<float>();
  const MaskRows mask(job.mask);
  std::vector<float> query(D), scores(S), acc(Dv);
  // the key head's keys and values as dense float rows, made once for the query heads that share it
  std::optional<HeadRows> keys, values;
  const float *k_head = nullptr, *v_head = nullptr;
  int64_t k_step = 0, v_step = 0;
  int held = -1;  // the (batch, key head) they hold
  for (int pair = pair0; pair < pair1; ++pair) {
    const int b = pair / Hq, h = pair % Hq;
    const int kvh = h / repeats;
    if (b * Hkv + kvh != held) {
      keys.emplace(job.k, b, kvh);
      values.emplace(job.v, b, kvh);
      k_head = keys->rows(0, S, &k_step);
      v_head = values->rows(0, S, &v_step);
      held = b * Hkv + kvh;
    }
    for (int l = 0; l < L; ++l) {
      if (job.padding(b, l)) {
        std::fill_n(job.out_row(b, h, l), Dv, 0.0f);
        continue;
      }
      const float* q_row = q_data + b * qs[0] + h * qs[1] + l * qs[2];
      for (int d = 0; d < D; ++d) query[d] = job.scale * q_row[d * qs[3]];
      int visible = job.causal ? std::min(S, l + 1 + (S - L)) : S;
      if (mask.hidden) visible = visible_by_mask(mask.bool_row(b, h, l), mask.strides[3], visible);
      // scores of the visible keys (eight at a time), masked, then softmax's exponentials
      dots(query.data(), k_head, k_step, visible, D, scores.data());
      const float total = masked_softmax_numerators(scores.data(), visible, mask.bool_row(b, h, l),
                                                    mask.float_row(b, h, l), mask.strides[3]);
      weighted_sum(scores.data(), v_head, v_step, visible, Dv, acc.data());
      float* dst = job.out_row(b, h, l);
      const float inverse = 1.0f / total;
      for (int d = 0; d < Dv; ++d) dst[d] = acc[d] * inverse;
    }
  }
}

// Keys a block of the grouped path: K's and V's rows of one block (2 x 64 keys x 64 floats, 32 KB) stay in L1
// while every query of the group reads them.
constexpr int kKeyBlock = 64;
// Query rows of a group up to which float16 keys and values are read as they are (each row widening what it
// reads, in registers); more rows share one widened copy of each block.
constexpr int kDirectHalfRows = 4;
// Scores the grouped path holds at once (rows x keys, 1 MB): a prompt chunk over a long context takes its
// rows a few at a time.
constexpr int64_t kGroupScores = 1 << 18;

// Query rows [r0, r1) of one (batch, key head) group with dense keys and values (run_attention_group: at
// most kGroupScores / keys of them at once): row r is query head
// kvh * repeats + r / L at query position r % L, every query head that reads this key head. The same sums
// as run_attention_pairs, to the bit (each query's scores eight keys at a time from key 0, its softmax, its
// weighted sum key by key), but the keys and values are read a block at a time for all the rows at once
// instead of once per query from L2.
void run_attention_rows(const AttentionJob& job, int group, int r0, int r1) {
  const auto& q = job.q;
  const int Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int Hkv = job.k.shape(1), S = job.k.shape(2), Dv = job.v.shape(3);
  const int repeats = Hq / Hkv;
  const auto& qs = q.strides();
  const int b = group / Hkv, kvh = group % Hkv;
  HeadRows keys(job.k, b, kvh), values(job.v, b, kvh);
  const MaskRows mask(job.mask);
  const int rows = r1 - r0;
  std::vector<float> queries(static_cast<size_t>(rows) * D), scores(static_cast<size_t>(rows) * S);
  std::vector<float> accs(static_cast<size_t>(rows) * Dv, 0.0f);
  std::vector<int> visible(rows);
  int most = 0;
  for (int i = 0; i < rows; ++i) {
    const int h = kvh * repeats + (r0 + i) / L, l = (r0 + i) % L;
    const float* q_row = q.data<float>() + b * qs[0] + h * qs[1] + l * qs[2];
    for (int d = 0; d < D; ++d) queries[static_cast<size_t>(i) * D + d] = job.scale * q_row[d * qs[3]];
    int seen = job.causal ? std::min(S, l + 1 + (S - L)) : S;
    if (mask.hidden) seen = visible_by_mask(mask.bool_row(b, h, l), mask.strides[3], seen);
    if (job.padding(b, l)) seen = 0;  // no scores, no values: its output is zeros
    visible[i] = seen;
    most = std::max(most, seen);
  }
  // scores, a block of keys at a time for every row (blocks start at multiples of eight, as dots' groups)
  // float16 keys and values: read as they are by a few rows, widened once a block for many (the same sums)
  const bool direct = rows <= kDirectHalfRows && keys.dense_halves() && values.dense_halves();
  for (int s0 = 0; s0 < most; s0 += kKeyBlock) {
    int64_t step = keys.row_step;
    const float* block = direct ? nullptr : keys.rows(s0, std::min(kKeyBlock, most - s0), &step);
    for (int i = 0; i < rows; ++i) {
      const int count = std::min(kKeyBlock, visible[i] - s0);
      if (count > 0 && direct) {
        dots(queries.data() + static_cast<size_t>(i) * D, keys.half + s0 * step, step, count, D,
             scores.data() + static_cast<size_t>(i) * S + s0);
      } else if (count > 0) {
        dots(queries.data() + static_cast<size_t>(i) * D, block, step, count, D,
             scores.data() + static_cast<size_t>(i) * S + s0);
      }
    }
  }
  std::vector<float> totals(rows);
  for (int i = 0; i < rows; ++i) {
    const int h = kvh * repeats + (r0 + i) / L, l = (r0 + i) % L;
    if (job.padding(b, l)) {
      totals[i] = 1.0f;
      continue;
    }
    totals[i] = masked_softmax_numerators(scores.data() + static_cast<size_t>(i) * S, visible[i],
                                          mask.bool_row(b, h, l), mask.float_row(b, h, l), mask.strides[3]);
  }
  // weighted values, a block of keys at a time for every row, each row's sums continued key by key
  for (int s0 = 0; s0 < most; s0 += kKeyBlock) {
    int64_t step = values.row_step;
    const float* block = direct ? nullptr : values.rows(s0, std::min(kKeyBlock, most - s0), &step);
    // rows side by side that weigh as many of the block's keys take it at once (each value row loaded once)
    for (int i = 0; i < rows;) {
      const int count = std::min(kKeyBlock, visible[i] - s0);
      int j = i + 1;
      while (j < rows && std::min(kKeyBlock, visible[j] - s0) == count) ++j;
      if (count > 0) {
        const float* p = scores.data() + static_cast<size_t>(i) * S + s0;
        float* acc = accs.data() + static_cast<size_t>(i) * Dv;
        if (direct) {
          weighted_sums_add(p, S, j - i, values.half + s0 * step, step, count, Dv, acc, Dv);
        } else {
          weighted_sums_add(p, S, j - i, block, step, count, Dv, acc, Dv);
        }
      }
      i = j;
    }
  }
  for (int i = 0; i < rows; ++i) {
    const int h = kvh * repeats + (r0 + i) / L, l = (r0 + i) % L;
    float* dst = job.out_row(b, h, l);
    const float inverse = 1.0f / totals[i];
    const float* acc = accs.data() + static_cast<size_t>(i) * Dv;
    for (int d = 0; d < Dv; ++d) dst[d] = acc[d] * inverse;
  }
}

void run_attention_group(const AttentionJob& job, int group, int r0, int r1) {
  const int step = static_cast<int>(std::max<int64_t>(1, kGroupScores / std::max(1, job.k.shape(2))));
  for (int r = r0; r < r1; r += step) run_attention_rows(job, group, r, std::min(r1, r + step));
}

// Pairs of (batch, head) shared over the kernel pool's threads where the work pays for waking them.
void run_attention(const AttentionJob& job) {
  const int pairs = job.q.shape(0) * job.q.shape(1);
  const int64_t work = static_cast<int64_t>(pairs) * job.q.shape(2) * job.k.shape(2) * job.q.shape(3);
  const bool parallel = work >= kParallelAttentionWork && pool_threads() > 1;
  if (job.k.strides()[3] == 1 && job.v.strides()[3] == 1) {
    // dense keys and values: the grouped path, each group's rows split in pieces enough to keep every
    // thread busy (a group's rows are its query heads' queries)
    const int groups = job.q.shape(0) * job.k.shape(1);
    const int rows = (job.q.shape(1) / job.k.shape(1)) * job.q.shape(2);
    const int pieces = parallel ? std::max(1, std::min(rows, (2 * pool_threads() + groups - 1) / groups)) : 1;
    const int per_piece = (rows + pieces - 1) / pieces;
    auto piece = [&](int task) {
      const int group = task / pieces, r0 = (task % pieces) * per_piece;
      if (r0 < rows) run_attention_group(job, group, r0, std::min(rows, r0 + per_piece));
    };
    if (!parallel) {
      for (int task = 0; task < groups * pieces; ++task) piece(task);
    } else {
      run_tasks(groups * pieces, piece);
    }
    return;
  }
  if (!parallel) {
    run_attention_pairs(job, 0, pairs);
    return;
  }
  run_tasks(pairs, [&](int pair) { run_attention_pairs(job, pair, pair + 1); });
}

}  // namespace

void check_attention_shapes(const mx::array& q, const mx::Shape& k, const mx::Shape& v, mx::Dtype k_dtype,
                            mx::Dtype v_dtype, bool causal, const std::optional<mx::array>& mask) {
  check(q.ndim() == 4 && k.size() == 4 && v.size() == 4, "q, k and v must have 4 dimensions");
  check(q.dtype() == mx::float32, "q must be float32");
  check((k_dtype == mx::float32 || k_dtype == mx::float16) && v_dtype == k_dtype,
        "k and v must both be float32 or both float16");
  check(k[0] == q.shape(0) && v[0] == q.shape(0), "q, k and v must have the same batch size");
  check(k[3] == q.shape(3), "q and k must have the same head size");
  check(k[1] == v[1] && k[2] == v[2], "k and v must have the same heads and length");
  check(k[1] > 0 && q.shape(1) % k[1] == 0, "the query heads must be a multiple of the key heads");
  check(!(causal && mask.has_value()), "either the causal mask or a mask array");
  check(!causal || k[2] >= q.shape(2), "a causal mask needs at least as many keys as queries");
  if (mask.has_value()) {
    check(mask->ndim() <= 4, "the mask must have at most 4 dimensions");
    check(mask->dtype() == mx::bool_ || mask->dtype() == mx::float32, "the mask must be boolean or float32");
    const mx::Shape full{q.shape(0), q.shape(1), q.shape(2), k[2]};
    for (int d = 0; d < mask->ndim(); ++d) {
      const int size = mask->shape(d), want = full[4 - mask->ndim() + d];
      check(size == 1 || size == want, "the mask does not broadcast to [B, heads, queries, keys]");
    }
  }
}

void check_attention_inputs(const mx::array& q, const mx::array& k, const mx::array& v, bool causal,
                            const std::optional<mx::array>& mask) {
  check(k.ndim() == 4 && v.ndim() == 4, "q, k and v must have 4 dimensions");
  check_attention_shapes(q, k.shape(), v.shape(), k.dtype(), v.dtype(), causal, mask);
}

void attention_into(const mx::array& q, const mx::array& k, const mx::array& v, const std::optional<mx::array>& mask,
                    float scale, bool causal, float* out, const int32_t* lengths) {
  AttentionJob job{q, k, v, mask, out, scale, causal, true, lengths};
  run_attention(job);
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                    const std::optional<mx::array>& mask, mx::StreamOrDevice s) {
  check_attention_inputs(q, k, v, causal, mask);
  auto stream = mx::to_stream(s, mx::Device::cpu);
  check(stream.device == mx::Device::cpu, "runs on the CPU only");
  std::vector<mx::array> inputs{q, k, v};
  if (mask.has_value()) inputs.push_back(*mask);
  mx::Shape shape{q.shape(0), q.shape(1), q.shape(2), v.shape(3)};
  return mx::array(shape, mx::float32, std::make_shared<CpuAttention>(stream, scale, causal), std::move(inputs));
}

void CpuAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& input : inputs) encoder.set_input_array(input);
  encoder.set_output_array(out);
  std::optional<mx::array> mask;
  if (inputs.size() == 4) mask = inputs[3];
  AttentionJob job{inputs[0], inputs[1], inputs[2], mask, out.data<float>(), scale_, causal_};
  encoder.dispatch([job = std::move(job)]() { run_attention(job); });
}

void CpuAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuAttention runs on the CPU only; on a GPU use mx.fast.scaled_dot_product_attention");
}

bool CpuAttention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuAttention&>(other);
  return scale_ == o.scale_ && causal_ == o.causal_;
}

std::vector<mx::Shape> CpuAttention::output_shapes(const std::vector<mx::array>& inputs) {
  const auto &q = inputs[0], &v = inputs[2];
  return {mx::Shape{q.shape(0), q.shape(1), q.shape(2), v.shape(3)}};
}

}  // namespace mlxd_qmm
