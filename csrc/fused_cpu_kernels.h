// The CPU kernels of rms_norm, fused_add_rms_norm, silu_and_mul and quantize_fp8, written once over ATen's
// Vectorized types and compiled twice: for the baseline x86-64 ISA (fused_cpu.cpp) and for AVX2 + FMA
// (fused_cpu_avx2.cpp, used when the CPU has them), as ATen compiles its own kernels per CPU capability.
// Everything here lives in namespace ops::CPU_CAPABILITY so the two copies do not collide.
// Include only from those two files.
#include <algorithm>
#include <cmath>
#include <limits>

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

// sum(x[i]^2) over one row of length d, in acc_t<T>. ATen's vectorised reduction over blocks of
// kSumBlock elements, the block sums added in double: one reduction over a whole long row would add
// d / lanes terms into each lane in fp32, with a rounding error growing with d (1e-4 relative at 2^24
// elements; torch's own reductions sum in cascades for the same reason). Rows up to kSumBlock take one
// reduction, as before.
template <typename T>
acc_t<T> sum_of_squares(const T* x, int64_t d) {
  constexpr int64_t kSumBlock = 4096;
  using V = AccVec<T>;
  const auto square = [](V v) { return v * v; };
  const auto add = [](V a, V b) { return a + b; };
  if (d <= kSumBlock) return at::vec::map_reduce_all<T>(square, add, x, d);
  double total = 0;
  for (int64_t i = 0; i < d; i += kSumBlock) {
    total += at::vec::map_reduce_all<T>(square, add, x + i, std::min(kSumBlock, d - i));
  }
  return static_cast<acc_t<T>>(total);
}

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows r of length d.
template <typename T>
void rms_norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps) {
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      using V = AccVec<T>;
      const acc_t<T> sum_sq = sum_of_squares(xr, d);
      const acc_t<T> inv = acc_t<T>(1) / std::sqrt(sum_sq / static_cast<acc_t<T>>(d) + static_cast<acc_t<T>>(eps));
      at::vec::map2<T>([inv](V xv, V wv) { return xv * V(inv) * wv; }, y + r * d, xr, w, d);
    }
  });
}

// residual[r] += x[r]; x[r] = rms_norm(residual[r]) * w. The normalised value is computed from the
// residual as stored (rounded to T), as the next layer will read it.
template <typename T>
void fused_add_rms_norm_rows(T* x, T* residual, const T* w, int64_t rows, int64_t d, double eps) {
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * d;
      T* rr = residual + r * d;
      using V = AccVec<T>;
      at::vec::map2<T>([](V a, V b) { return a + b; }, rr, xr, rr, d);
      const acc_t<T> sum_sq = sum_of_squares(rr, d);
      const acc_t<T> inv = acc_t<T>(1) / std::sqrt(sum_sq / static_cast<acc_t<T>>(d) + static_cast<acc_t<T>>(eps));
      at::vec::map2<T>([inv](V rv, V wv) { return rv * V(inv) * wv; }, xr, rr, w, d);
    }
  });
}

// out[r] = silu(x[r, :d]) * x[r, d:], silu(a) = a / (1 + exp(-a)).
template <typename T>
void silu_and_mul_rows(const T* x, T* out, int64_t rows, int64_t d) {
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * 2 * d;
      using V = AccVec<T>;
      at::vec::map2<T>(
          [](V a, V b) {
            return a / (V(1) + a.neg().exp_u20()) * b;  // exp to 2.0 ULP (as ATen's own kernels use)
          },
          out + r * d, xr, xr + d, d);
    }
  });
}

// codes[i] = clamp(x[i] / s, -max, max) rounded to the FP8 type C (c10::Float8_e4m3fn or Float8_e5m2) for
// n elements: the float32 division, a NaN-keeping clamp and one rounding to nearest even, as quantize_fp8's
// formula. The AVX-512 build converts 16 at a time (ATen's vec512 float8 conversion, bit-equal to c10's
// scalar one, which the other builds use: tests/test_fp8.py).
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
void rms_norm_kernel(const at::Tensor& x, const at::Tensor& w, at::Tensor& y, double eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rms_norm_cpu", [&] {
    rms_norm_rows<scalar_t>(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                            y.mutable_data_ptr<scalar_t>(), rows, d, eps);
  });
}

void fused_add_rms_norm_kernel(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_add_rms_norm_cpu", [&] {
    fused_add_rms_norm_rows<scalar_t>(x.mutable_data_ptr<scalar_t>(), residual.mutable_data_ptr<scalar_t>(),
                                      w.const_data_ptr<scalar_t>(), rows, d, eps);
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
