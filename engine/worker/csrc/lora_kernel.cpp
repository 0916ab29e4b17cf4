// Grouped LoRA for CPU in one call per LoRA module: shrink and expand of every adapter segment of the batch.
//
//   y[t, offset + c] (+)= sum_r h[t, slice(c) * R + r] * bt[slot(t), r, c]
//   h[t, j * R + r]    = scale * sum_k x[t, k] * a[slot(t), j, r, k]        (r < ranks[slot(t)])
//
// Tokens come grouped by adapter slot (`order`, `seg_starts`, `seg_slots`, computed once per engine step);
// tokens without an adapter are in no segment and their rows of y are untouched. Weights are float32, prepared
// by engine/worker/native_ops.py: a [S, N, R, H], bt [S, R, W] (B transposed, the N slices side by side), so
// both loops run along contiguous memory and vectorise. x and y are float32 or bfloat16; sums are float32.
// Work is split into (segment, token block) items over ATen's intra-op thread pool.

// Not <torch/extension.h>: it includes all of torch and more than doubles the build time (40 s to 17 s measured).
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kTokenBlock = 8;
constexpr int64_t kRowBlock = 16;
constexpr int64_t kColBlock = 256;
// Below this many multiply-adds a call runs on the calling thread: waking the pool costs more than it saves.
constexpr int64_t kInlineWork = 1 << 18;

struct Item {
  int64_t segment, first, last;  // tokens [first, last) of `order`
  int64_t lo, hi;                // expand: columns of W
  int64_t slice;                 // expand: the slice the columns belong to
};

// bfloat16 <-> float by bits, so the loops vectorise (c10's conversions do not): widening is exact, narrowing
// rounds to nearest even as c10::BFloat16 does, NaN stays NaN.
inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) {
  uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
template <typename T>
inline T from_float(float v);
template <>
inline float from_float<float>(float v) { return v; }
template <>
inline c10::BFloat16 from_float<c10::BFloat16>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return c10::BFloat16(static_cast<uint16_t>(nan ? 0x7FC0u : rounded), c10::BFloat16::from_bits());
}

template <typename T>
void gather_rows(const at::Tensor& x, const int64_t* order, int64_t count, float* out) {
  const int64_t hidden = x.size(1), stride = x.stride(0);
  const T* base = x.data_ptr<T>();
  for (int64_t m = 0; m < count; ++m) {
    const T* src = base + order[m] * stride;
    float* dst = out + m * hidden;
#pragma omp simd
    for (int64_t k = 0; k < hidden; ++k) dst[k] = to_float(src[k]);
  }
}

// h[m, row] for tokens [first, last) and rows [lo, hi) of one slot's packed A ([N * R, H] row-major).
void shrink_block(const float* xg, const float* a, float* h, int64_t hidden, int64_t h_stride, int64_t rank,
                  int64_t R, int64_t first, int64_t last, int64_t lo, int64_t hi, float scale) {
  for (int64_t row = lo; row < hi; ++row) {
    if (row % R >= rank) continue;
    const float* w = a + row * hidden;
    int64_t m = first;
    for (; m + 4 <= last; m += 4) {
      const float *x0 = xg + m * hidden, *x1 = x0 + hidden, *x2 = x1 + hidden, *x3 = x2 + hidden;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t k = 0; k < hidden; ++k) {
        s0 += x0[k] * w[k];
        s1 += x1[k] * w[k];
        s2 += x2[k] * w[k];
        s3 += x3[k] * w[k];
      }
      h[m * h_stride + row] = s0 * scale;
      h[(m + 1) * h_stride + row] = s1 * scale;
      h[(m + 2) * h_stride + row] = s2 * scale;
      h[(m + 3) * h_stride + row] = s3 * scale;
    }
    for (; m < last; ++m) {
      const float* x0 = xg + m * hidden;
      float s0 = 0.f;
#pragma omp simd reduction(+ : s0)
      for (int64_t k = 0; k < hidden; ++k) s0 += x0[k] * w[k];
      h[m * h_stride + row] = s0 * scale;
    }
  }
}

// y rows of tokens [first, last) (their h rows), columns [lo, hi) of one slot's B^T ([R, W] row-major). Columns
// go in chunks of kChunk held in registers across the rank loop; a partial last chunk takes the generic loop.
template <typename T>
void expand_block(const float* h, const float* bt, T* y, const int64_t* order, int64_t y_stride, int64_t h_stride,
                  int64_t width, int64_t rank, int64_t R, const Item& it, bool add_inputs) {
  constexpr int64_t kChunk = 64;
  for (int64_t i = it.first; i < it.last; ++i) {
    const float* hi = h + i * h_stride + it.slice * R;
    T* out = y + order[i] * y_stride;
    int64_t c0 = it.lo;
    for (; c0 + kChunk <= it.hi; c0 += kChunk) {
      float acc[kChunk] = {};
      for (int64_t r = 0; r < rank; ++r) {
        const float hv = hi[r];
        const float* b = bt + r * width + c0;
#pragma omp simd
        for (int64_t c = 0; c < kChunk; ++c) acc[c] += hv * b[c];
      }
#pragma omp simd
      for (int64_t c = 0; c < kChunk; ++c) {
        out[c0 + c] = from_float<T>((add_inputs ? to_float(out[c0 + c]) : 0.f) + acc[c]);
      }
    }
    const int64_t rest = it.hi - c0;
    if (rest > 0) {
      float acc[kChunk] = {};
      for (int64_t r = 0; r < rank; ++r) {
        const float hv = hi[r];
        const float* b = bt + r * width + c0;
        for (int64_t c = 0; c < rest; ++c) acc[c] += hv * b[c];
      }
      for (int64_t c = 0; c < rest; ++c) {
        out[c0 + c] = from_float<T>((add_inputs ? to_float(out[c0 + c]) : 0.f) + acc[c]);
      }
    }
  }
}

void check(bool ok, const char* what) { TORCH_CHECK(ok, "loraplex lora_linear: ", what); }

}  // namespace

// y: [T, total] (the module's output columns start at `offset`), x: [T, H], a: [S, N, R, H] float32,
// bt: [S, R, W] float32, ranks: [S] int32, order: [M] int64, seg_starts: [G + 1] int64, seg_slots: [G] int64,
// slice_bounds: [N + 1] column bounds within W.
void lora_linear(at::Tensor y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& bt,
                 const at::Tensor& ranks, const at::Tensor& order, const at::Tensor& seg_starts,
                 const at::Tensor& seg_slots, std::vector<int64_t> slice_bounds, int64_t offset, double scale,
                 bool add_inputs) {
  check(x.dim() == 2 && y.dim() == 2 && x.size(0) == y.size(0), "x and y must be [tokens, features]");
  check(x.stride(1) == 1 && y.stride(1) == 1, "x and y rows must be contiguous");
  check(x.scalar_type() == y.scalar_type(), "x and y must have one dtype");
  check(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "dtype must be float32 or bfloat16");
  check(a.scalar_type() == at::kFloat && bt.scalar_type() == at::kFloat, "weights must be float32");
  check(a.is_contiguous() && bt.is_contiguous() && a.dim() == 4 && bt.dim() == 3, "weights must be packed");
  check(ranks.scalar_type() == at::kInt && order.scalar_type() == at::kLong && seg_starts.scalar_type() == at::kLong &&
            seg_slots.scalar_type() == at::kLong,
        "index dtypes");
  const int64_t S = a.size(0), N = a.size(1), R = a.size(2), H = a.size(3), W = bt.size(2);
  check(x.size(1) == H && bt.size(0) == S && bt.size(1) == R, "weight shapes do not match x");
  check(static_cast<int64_t>(slice_bounds.size()) == N + 1 && slice_bounds[N] == W, "slice bounds");
  check(offset >= 0 && offset + W <= y.size(1), "output columns out of range");
  const int64_t G = seg_slots.numel(), M = order.numel();
  if (G == 0 || R == 0 || M == 0) return;
  const int64_t* ord = order.data_ptr<int64_t>();
  const int64_t* starts = seg_starts.data_ptr<int64_t>();
  const int64_t* slots = seg_slots.data_ptr<int64_t>();
  const int32_t* rank_of = ranks.data_ptr<int32_t>();
  for (int64_t g = 0; g < G; ++g) check(slots[g] >= 0 && slots[g] < S, "slot out of range");
  for (int64_t m = 0; m < M; ++m) check(ord[m] >= 0 && ord[m] < x.size(0), "token row out of range");

  // One item per (segment, token block): gather its x rows, shrink, expand. Items touch disjoint tokens, so one
  // parallel region does everything; a small batch (a few decode tokens) runs inline, without waking threads.
  std::vector<Item> items;
  int64_t work = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t rank = std::min<int64_t>(rank_of[slots[g]], R);
    if (rank <= 0) continue;
    for (int64_t first = starts[g]; first < starts[g + 1]; first += kTokenBlock) {
      items.push_back({g, first, std::min(first + kTokenBlock, starts[g + 1]), 0, 0, 0});
    }
    work += (starts[g + 1] - starts[g]) * rank * (N * H + W);
  }
  const int64_t h_stride = N * R;
  const float* ap = a.data_ptr<float>();
  const float* bp = bt.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  const int64_t y_stride = y.stride(0);
  const bool is_float = x.scalar_type() == at::kFloat;
  const int64_t n_items = static_cast<int64_t>(items.size());
  const int64_t grain = work < kInlineWork ? n_items : 1;
  at::parallel_for(0, n_items, std::max<int64_t>(grain, 1), [&](int64_t begin, int64_t end) {
    std::vector<float> xg(kTokenBlock * H), h(kTokenBlock * h_stride);
    for (int64_t i = begin; i < end; ++i) {
      const Item& it = items[i];
      const int64_t slot = slots[it.segment];
      const int64_t rank = std::min<int64_t>(rank_of[slot], R);
      const int64_t tokens = it.last - it.first;
      if (is_float) {
        gather_rows<float>(x, ord + it.first, tokens, xg.data());
      } else {
        gather_rows<c10::BFloat16>(x, ord + it.first, tokens, xg.data());
      }
      shrink_block(xg.data(), ap + slot * N * R * H, h.data(), H, h_stride, rank, R, 0, tokens, 0, N * R, fscale);
      const float* b = bp + slot * R * W;
      for (int64_t j = 0; j < N; ++j) {
        for (int64_t lo = slice_bounds[j]; lo < slice_bounds[j + 1]; lo += kColBlock) {
          const Item cols{it.segment, 0, tokens, lo, std::min(lo + kColBlock, slice_bounds[j + 1]), j};
          if (is_float) {
            expand_block<float>(h.data(), b, y.data_ptr<float>() + offset, ord + it.first, y_stride, h_stride, W,
                                rank, R, cols, add_inputs);
          } else {
            expand_block<c10::BFloat16>(h.data(), b, y.data_ptr<c10::BFloat16>() + offset, ord + it.first, y_stride,
                                        h_stride, W, rank, R, cols, add_inputs);
          }
        }
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lora_linear", &lora_linear, "Grouped LoRA shrink + expand of one module for every adapter segment");
}
