// The CPU kernels of rms_norm, fused_add_rms_norm, silu_and_mul and quantize_fp8, written once over ATen's
// Vectorized types and compiled three times: for the baseline x86-64 ISA (fused_cpu.cpp), AVX2 + FMA
// (fused_cpu_avx2.cpp) and AVX-512 (fused_cpu_avx512.cpp), as ATen compiles its own kernels per CPU
// capability. Everything here lives in namespace ops::CPU_CAPABILITY so the copies do not collide.
// Include only from those files. rms_norm's statistic and silu_and_mul's elements are torch's own, bit for
// bit (docs/numerics.md): the sections below say how.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include "fp8_scale.h"

namespace ops {
namespace CPU_CAPABILITY {

// Rows per task: enough work per thread to amortise scheduling (~32K elements).
int64_t grain_rows(int64_t row_length) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(row_length, 1)); }

template <typename T>
using acc_t = at::opmath_type<T>;

// Lambdas take Vectorized<acc_t<T>> explicitly: for float16/bfloat16 that selects ATen's helpers that
// convert each vector to float once, compute in float and round once at the store (with `auto`
// parameters ATen would run each operation in the half type, rounding every intermediate).
template <typename T>
using AccVec = at::vec::Vectorized<acc_t<T>>;

// ---- The row statistic: sum(x[i]^2) as torch sums it -----------------------------------------------
// F.rms_norm (ATen's rms_norm_composite), vLLM's RMSNorm.forward_native and transformers' LlamaRMSNorm all
// take x.float().pow(2).mean(-1): ATen's cascade_sum (aten/src/ATen/native/cpu/SumKernel.cpp) of the
// squares, rounded to float32 (float64 for float64 input), then one division by d. The sum below adds the
// same values in the same order, so 1 / rms is theirs bit for bit:
//  - a row of at least 32 bytes of squares (8 float, 4 double): vectorized_inner_sum, over vectors of 32
//    bytes whatever the CPU (ATen registers its sum kernel with REGISTER_DISPATCH, which runs its AVX2 build
//    on AVX-512 CPUs; its baseline build's vectors are 32 bytes too): row_sum of the d / lanes vectors, then
//    the d % lanes tail added in order, then the lanes in order;
//  - a shorter row: row_sum of the scalars;
//  - row_sum: multi_row_sum over 4 interleaved accumulators, each a cascade of 4 levels of 2^p items
//    (p = max(4, ceil(log2(items / 4)) / 4)), then the 0-3 leftover items into the first, then the four;
//  - a whole tensor of one row of more than 32768 elements (at::internal::GRAIN_SIZE) reduced while torch
//    runs more than one thread, outside a parallel region: TensorIterator's two_pass_reduction, each of
//    min(threads, ceil(d / 32768)) tasks summing its ceil(d / tasks) elements alone, then the per-thread
//    buffer (one slot per thread, zero where no task ran) summed as a row.
// Adding exactly, these orders also bound the error: each square passes through O(log d) additions.
constexpr int64_t kAtenGrainSize = 32768;  // at::internal::GRAIN_SIZE (ATen/TensorIterator.h)

// ATen's CeilLog2 (aten/src/ATen/native/cpu/utils.h): 1 for x <= 2.
inline int64_t aten_ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = static_cast<uint64_t>(x) - 1; v != 0; v >>= 1) ++bits;
  return bits;
}

// row_sum of SumKernel.cpp over `size` items of L lanes, fed in order (add_items); result() gives its lanes.
template <typename A, int L>
class CascadeRowSum {
 public:
  explicit CascadeRowSum(int64_t size) : multi_(size / 4) {
    power_ = std::max<int64_t>(4, aten_ceil_log2(multi_) / 4);
    step_ = int64_t(1) << power_;
    if (multi_ == 0) finish_levels();
  }

  // The next `count` items, item i at p + i * L.
  void add_items(const A* p, int64_t count) {
    while (count > 0) {
      if (fed_ % 4 == 0 && count >= 4 && fed_ < 4 * multi_) {
        // Whole rows of 4 items (multi_row_sum's inner loop), the cascade after each 2^p of them.
        const int64_t rows = std::min(count / 4, multi_ - fed_ / 4);
        A level0[4][L];  // acc_[0] in a local the compiler may keep in registers (p cannot alias it)
        std::memcpy(level0, acc_[0], sizeof level0);
        for (int64_t i = 0; i < rows; ++i, p += 4 * L) {
          for (int k = 0; k < 4; ++k) add(level0[k], p + k * L);
          const int64_t done = fed_ / 4 + i + 1;
          if ((done & (step_ - 1)) == 0) {
            std::memcpy(acc_[0], level0, sizeof level0);
            cascade(done);
            std::memcpy(level0, acc_[0], sizeof level0);
          }
        }
        std::memcpy(acc_[0], level0, sizeof level0);
        fed_ += 4 * rows;
        count -= 4 * rows;
        if (fed_ == 4 * multi_) finish_levels();
        continue;
      }
      if (fed_ < 4 * multi_) {
        const int64_t k = fed_ % 4;
        add(acc_[0][k], p);
        ++fed_;
        if (k == 3) {
          const int64_t done = fed_ / 4;  // multi_row_sum's i after a row of 4 items
          if ((done & (step_ - 1)) == 0) cascade(done);
          if (done == multi_) finish_levels();
        }
      } else {
        add(acc_[0][0], p);  // row_sum's leftover items
        ++fed_;
      }
      p += L;
      --count;
    }
  }

  const A* result() {
    for (int k = 1; k < 4; ++k) add(acc_[0][0], acc_[0][k]);
    return acc_[0][0];
  }

 private:
  static void add(A* acc, const A* v) {
    for (int j = 0; j < L; ++j) acc[j] += v[j];
  }
  void cascade(int64_t done) {
    const int64_t mask = step_ - 1;
    for (int64_t level = 1; level < 4; ++level) {
      for (int k = 0; k < 4; ++k) {
        add(acc_[level][k], acc_[level - 1][k]);
        for (int j = 0; j < L; ++j) acc_[level - 1][k][j] = A(0);
      }
      if ((done & (mask << (level * power_))) != 0) break;
    }
  }
  void finish_levels() {
    for (int level = 1; level < 4; ++level) {
      for (int k = 0; k < 4; ++k) add(acc_[0][k], acc_[level][k]);
    }
  }

  int64_t multi_, power_, step_, fed_ = 0;
  A acc_[4][4][L] = {};
};

// cascade_sum's contiguous inner reduction of one row of n values, fed in order in pieces whose lengths
// are multiples of kLanes (the last one excepted).
template <typename A>
class AtenRowSum {
 public:
  static constexpr int kLanes = 32 / sizeof(A);

  explicit AtenRowSum(int64_t n) : n_(n), vectors_(n >= kLanes ? n / kLanes : 0), vec_(vectors_), scalar_(n) {}

  void add(const A* v, int64_t count) {
    if (n_ < kLanes) {
      scalar_.add_items(v, count);
      fed_ += count;
      return;
    }
    const int64_t in_vectors = std::min(count, std::max<int64_t>(0, vectors_ * kLanes - fed_));
    vec_.add_items(v, in_vectors / kLanes);
    for (int64_t i = in_vectors; i < count; ++i) tail_ += v[i];
    fed_ += count;
  }

  A result() {
    if (n_ < kLanes) return scalar_.result()[0];
    const A* lanes = vec_.result();
    A total = tail_;
    for (int j = 0; j < kLanes; ++j) total += lanes[j];
    return total;
  }

 private:
  int64_t n_, vectors_, fed_ = 0;
  CascadeRowSum<A, kLanes> vec_;
  CascadeRowSum<A, 1> scalar_;
  A tail_ = A(0);
};

// The squares of x[begin, end) in acc_t<T> (ATen's pow(2) of the float32 or float64 tensor), summed as
// AtenRowSum does. The squares go through memory before they are added: an x * x + sum contracted into one
// fused multiply-add would round differently from torch's separate pow and sum.
template <typename T>
acc_t<T> aten_sum_of_squares_range(const T* x, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  constexpr int64_t kChunk = 256;  // a multiple of AtenRowSum's lanes
  A squares[kChunk];
  AtenRowSum<A> sum(end - begin);
  for (int64_t start = begin; start < end; start += kChunk) {
    const int64_t m = std::min(kChunk, end - start);
    if constexpr (std::is_same_v<T, A>) {
      for (int64_t i = 0; i < m; ++i) squares[i] = x[start + i] * x[start + i];
    } else {
      at::vec::convert(x + start, squares, m);
      for (int64_t i = 0; i < m; ++i) squares[i] = squares[i] * squares[i];
    }
#if defined(__GNUC__)
    asm volatile("" : : "r"(squares) : "memory");
#endif
    sum.add(squares, m);
  }
  return sum.result();
}

// How torch's reduction of a whole (rows, d) tensor splits one row: the tasks of two_pass_reduction, or 0
// where each row is summed alone. Read before the kernels' own parallel_for, as ATen reads it at the call.
inline int64_t aten_two_pass_tasks(int64_t rows, int64_t d) {
  if (rows != 1 || d <= kAtenGrainSize || at::get_num_threads() <= 1 || at::in_parallel_region()) return 0;
  return std::min<int64_t>(at::get_num_threads(), (d + kAtenGrainSize - 1) / kAtenGrainSize);
}

template <typename T>
acc_t<T> sum_of_squares(const T* x, int64_t d, int64_t two_pass_tasks) {
  using A = acc_t<T>;
  if (two_pass_tasks == 0) return aten_sum_of_squares_range(x, 0, d);
  const int64_t chunk = (d + two_pass_tasks - 1) / two_pass_tasks;
  std::vector<A> slots(static_cast<size_t>(at::get_num_threads()), A(0));
  for (int64_t t = 0; t < two_pass_tasks && t * chunk < d; ++t) {
    slots[t] = A(0) + aten_sum_of_squares_range(x, t * chunk, std::min(d, (t + 1) * chunk));
  }
  AtenRowSum<A> total(static_cast<int64_t>(slots.size()));
  total.add(slots.data(), static_cast<int64_t>(slots.size()));
  return total.result();
}

// 1 / sqrt(sum / d + eps) in acc_t<T>: torch's mean (the sum divided by d), eps added in the same type, then
// rsqrt (1 / sqrt, two IEEE operations, in every ATen build).
template <typename T>
acc_t<T> inverse_rms(acc_t<T> sum_sq, int64_t d, double eps) {
  using A = acc_t<T>;
  return A(1) / std::sqrt(sum_sq / static_cast<A>(d) + static_cast<A>(eps));
}

// out = x * inv * w (one rounding to T), or with round_x_hat the normalised value rounded to T first and
// then times w, rounded again (transformers' LlamaRMSNorm, vLLM's RMSNorm.forward_native). For float32 and
// float64 the two are the same bits. out may be x.
template <typename T>
void normalise_row(const T* x, const T* w, T* out, acc_t<T> inv, int64_t d, bool round_x_hat) {
  using V = AccVec<T>;
  if (round_x_hat && at::vec::is_reduced_floating_point_v<T>) {
    at::vec::map<T>([inv](V xv) { return xv * V(inv); }, out, x, d);
    at::vec::map2<T>([](V a, V b) { return a * b; }, out, out, w, d);
  } else {
    at::vec::map2<T>([inv](V xv, V wv) { return xv * V(inv) * wv; }, out, x, w, d);
  }
}

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows r of length d.
template <typename T>
void rms_norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps, bool round_x_hat) {
  const int64_t two_pass = aten_two_pass_tasks(rows, d);
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      normalise_row(xr, w, y + r * d, inverse_rms<T>(sum_of_squares(xr, d, two_pass), d, eps), d, round_x_hat);
    }
  });
}

// residual[r] += x[r]; x[r] = rms_norm(residual[r]) * w. The normalised value is computed from the
// residual as stored (rounded to T), as the next layer will read it.
template <typename T>
void fused_add_rms_norm_rows(T* x, T* residual, const T* w, int64_t rows, int64_t d, double eps, bool round_x_hat) {
  const int64_t two_pass = aten_two_pass_tasks(rows, d);
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * d;
      T* rr = residual + r * d;
      using V = AccVec<T>;
      at::vec::map2<T>([](V a, V b) { return a + b; }, rr, xr, rr, d);
      normalise_row(rr, w, xr, inverse_rms<T>(sum_of_squares(rr, d, two_pass), d, eps), d, round_x_hat);
    }
  });
}

// ---- silu_and_mul: silu(a) * b, each element as F.silu(a) * b computes it ------------------------------
// ATen's silu (aten/src/ATen/native/cpu/Activation.cpp, built for every capability, AVX-512 included) is
// a / (1 + exp(-a)) in float32 (float64 for float64), through cpu_kernel_vec: per contiguous run of n
// elements that one call of its loop gets, the first n - n % (2 * lanes) by Vectorized<A>::exp (Sleef's
// 1-ulp exp on AVX2 and AVX-512; std::exp per lane in the baseline build), the rest by the scalar
// std::exp. The two exps differ in the last bit for about 4% of float32 inputs, so the split matters.
// F.silu(x[..., :d]) walks rows of d (the gate half is strided), a row split where the TensorIterator's
// parallel_for cuts the rows * d elements into min(threads, ceil(rows * d / 32768)) equal tasks (when
// rows * d > 32768, torch runs more than one thread, outside a parallel region); d = 1 has no contiguous
// run (every element scalar). This kernel runs the build of ATen's capability, so its Vectorized<A> is
// ATen's, and splits each row as that walk does. The product with b is then one IEEE multiply either way.

// ATen's split of F.silu over `total` elements: its tasks' length (total where it runs as one).
inline int64_t aten_elementwise_chunk(int64_t total) {
  if (total <= kAtenGrainSize || at::get_num_threads() <= 1 || at::in_parallel_region()) return total;
  const int64_t tasks = std::min<int64_t>(at::get_num_threads(), (total + kAtenGrainSize - 1) / kAtenGrainSize);
  return (total + tasks - 1) / tasks;
}

// silu(a) * b for one run of n elements in A (float32 or float64), as cpu_kernel_vec computes silu on a run
// of that length (`vectorized` false: every element scalar).
template <typename A>
void silu_mul_run(const A* a, const A* b, A* out, int64_t n, bool vectorized) {
  using V = at::vec::Vectorized<A>;
  const int64_t nv = vectorized ? n / (2 * V::size()) * (2 * V::size()) : 0;
  for (int64_t i = 0; i < nv; i += V::size()) {
    const V av = V::loadu(a + i);
    (av / (V(1) + av.neg().exp()) * V::loadu(b + i)).store(out + i);
  }
  for (int64_t i = nv; i < n; ++i) out[i] = a[i] / (A(1) + std::exp(-a[i])) * b[i];
}

// out[r] = silu(x[r, :d]) * x[r, d:]: in float32 (float64 for float64) from the inputs converted exactly,
// rounded once to T.
template <typename T>
void silu_and_mul_rows(const T* x, T* out, int64_t rows, int64_t d) {
  using A = acc_t<T>;
  const int64_t chunk = aten_elementwise_chunk(rows * d);
  const bool vectorized = d > 1;
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    constexpr int64_t kBuffer = 256;  // a multiple of 2 * lanes in every build
    A gate[kBuffer], up[kBuffer], product[kBuffer];
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * 2 * d;
      T* yr = out + r * d;
      for (int64_t c = 0; c < d;) {  // the runs of row r: cut where a task of ATen's split ends
        const int64_t stop = std::min(d, ((r * d + c) / chunk + 1) * chunk - r * d);
        if constexpr (std::is_same_v<T, A>) {
          silu_mul_run(xr + c, xr + d + c, yr + c, stop - c, vectorized);
        } else {
          // The run in pieces of kBuffer from its start: each piece a whole number of vector pairs but the
          // last, so the split into vector and scalar elements is the run's.
          for (int64_t p = c; p < stop; p += kBuffer) {
            const int64_t m = std::min(kBuffer, stop - p);
            at::vec::convert(xr + p, gate, m);
            at::vec::convert(xr + d + p, up, m);
            silu_mul_run(gate, up, product, m, vectorized);
            at::vec::convert(product, yr + p, m);
          }
        }
        c = stop;
      }
    }
  });
}

// codes[i] = clamp(x[i] / s, -max, max) rounded to the FP8 type C (c10::Float8_e4m3fn or Float8_e5m2) for
// n elements: the float32 division, a NaN-keeping clamp and one rounding to nearest even, as quantize_fp8's
// formula. The AVX-512 build converts 16 at a time (ATen's vec512 float8 conversion, bit-equal to c10's
// scalar one, which the other builds use: tests/test_fp8_numerics.py).
template <typename T, typename C>
void quantize_run(const T* x, int64_t n, float s, C* codes) {
  constexpr float kMax = fp8::fp8_max(std::is_same_v<C, c10::Float8_e5m2>);
  constexpr int64_t kChunk = 256;
  float buffer[kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t m = std::min(kChunk, n - start);
    at::vec::convert(x + start, buffer, m);
    int64_t i = 0;
#if defined(CPU_CAPABILITY_AVX512)
    using V = at::vec::Vectorized<float>;
    const V scale(s), lo(-kMax), hi(kMax);
    for (; i + V::size() <= m; i += V::size()) {
      at::vec::convert<C>(at::vec::clamp(V::loadu(buffer + i) / scale, lo, hi)).store(codes + start + i, V::size());
    }
#endif
    for (; i < m; ++i) {
      float q = buffer[i] / s;
      q = q < -kMax ? -kMax : q > kMax ? kMax : q;  // NaN stays
      codes[start + i] = static_cast<C>(q);
    }
  }
}

// quantize_fp8 of rows of length d in groups of `group` elements (d: per row; 128: 1x128 groups, the last
// one shorter), into codes and, where `scales` is given, one float32 scale per group: scale =
// max(amax, 1e-12) / max (pow2: rounded up to a power of two), or the given one (`given`: one per group,
// or with given_stride 0 one for all).
template <typename T, typename C>
void quantize_fp8_rows(const T* x, C* codes, float* scales, const float* given, int64_t given_stride, int64_t rows,
                       int64_t d, int64_t group, bool pow2) {
  constexpr float kMax = fp8::fp8_max(std::is_same_v<C, c10::Float8_e5m2>);
  const int64_t groups = (d + group - 1) / group;
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    using V = AccVec<T>;
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t start = g * group, n = std::min(group, d - start), index = r * groups + g;
        const T* xg = x + r * d + start;
        float s;
        if (given != nullptr) {
          s = given[index * given_stride];
        } else {
          float amax = at::vec::map_reduce_all<T>([](V v) { return v.abs(); },
                                                  [](V a, V b) { return at::vec::maximum(a, b); }, xg, n);
          // ATen's vector maximum makes its NaN all ones (negative); |x|'s, as the formula's amax, is positive,
          // and x / scale keeps the scale's sign of NaN into the codes.
          if (amax != amax) amax = std::numeric_limits<float>::quiet_NaN();
          s = fp8::scale_of(amax, kMax, pow2);
        }
        if (scales != nullptr) scales[index] = s;
        quantize_run(xg, n, s, codes + r * d + start);
      }
    }
  });
}

// Entry points (one definition per capability namespace): contiguous tensors, shapes already checked.
void rms_norm_kernel(const at::Tensor& x, const at::Tensor& w, at::Tensor& y, double eps, bool round_x_hat) {
  const int64_t d = x.size(-1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rms_norm_cpu", [&] {
    rms_norm_rows<scalar_t>(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                            y.mutable_data_ptr<scalar_t>(), rows, d, eps, round_x_hat);
  });
}

void fused_add_rms_norm_kernel(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps,
                               bool round_x_hat) {
  const int64_t d = x.size(-1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_add_rms_norm_cpu", [&] {
    fused_add_rms_norm_rows<scalar_t>(x.mutable_data_ptr<scalar_t>(), residual.mutable_data_ptr<scalar_t>(),
                                      w.const_data_ptr<scalar_t>(), rows, d, eps, round_x_hat);
  });
}

void silu_and_mul_kernel(const at::Tensor& x, at::Tensor& out) {
  const int64_t d = out.size(-1);
  const int64_t rows = d == 0 ? 0 : out.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "silu_and_mul_cpu", [&] {
    silu_and_mul_rows<scalar_t>(x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), rows, d);
  });
}

// quantize_fp8 per row (group = d) or per 1x128 group of x's rows (x float32, float16 or bfloat16, codes
// float8_e4m3fn or float8_e5m2, both contiguous of x's shape); scales: one per group, or undefined where
// `given` holds them (one per group, or one for all: given_stride 0).
void quantize_fp8_kernel(const at::Tensor& x, int64_t group, const float* given, int64_t given_stride, bool pow2,
                         at::Tensor& codes, float* scales) {
  const int64_t d = x.size(-1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "quantize_fp8_cpu", [&] {
    if (codes.scalar_type() == at::kFloat8_e5m2) {
      quantize_fp8_rows(x.const_data_ptr<scalar_t>(), codes.mutable_data_ptr<c10::Float8_e5m2>(), scales, given,
                        given_stride, rows, d, group, pow2);
    } else {
      quantize_fp8_rows(x.const_data_ptr<scalar_t>(), codes.mutable_data_ptr<c10::Float8_e4m3fn>(), scales, given,
                        given_stride, rows, d, group, pow2);
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace ops
