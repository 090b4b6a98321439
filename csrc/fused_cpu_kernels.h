// The CPU kernels of rms_norm, fused_add_rms_norm and silu_and_mul, written once over ATen's
// Vectorized types and compiled twice: for the baseline x86-64 ISA (fused_cpu.cpp) and for AVX2 + FMA
// (fused_cpu_avx2.cpp, used when the CPU has them), as ATen compiles its own kernels per CPU capability.
// Everything here lives in namespace ops::CPU_CAPABILITY so the two copies do not collide.
// Include only from those two files.
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

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

}  // namespace CPU_CAPABILITY
}  // namespace ops
