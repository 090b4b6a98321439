// CPU kernels of rms_norm, fused_add_rms_norm and silu_and_mul: one pass over rows in parallel
// (at::parallel_for), vectorised with ATen's Vectorized helpers (at::vec::map*, which convert
// float16/bfloat16 through float), statistics in float (double for float64 inputs).
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include "checks.h"

namespace ops {
namespace {

// Rows per task: enough work per thread to amortise scheduling (~32K elements).
int64_t grain_rows(int64_t row_length) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(row_length, 1)); }

template <typename T>
using acc_t = at::opmath_type<T>;

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows r of length d.
template <typename T>
void rms_norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps) {
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      const acc_t<T> sum_sq = at::vec::map_reduce_all<T>(
          [](auto v) { return v * v; }, [](auto a, auto b) { return a + b; }, xr, d);
      const acc_t<T> inv = acc_t<T>(1) / std::sqrt(sum_sq / static_cast<acc_t<T>>(d) + static_cast<acc_t<T>>(eps));
      at::vec::map2<T>([inv](auto xv, auto wv) { return xv * decltype(xv)(inv) * wv; }, y + r * d, xr, w, d);
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
      at::vec::map2<T>([](auto a, auto b) { return a + b; }, rr, xr, rr, d);
      const acc_t<T> sum_sq = at::vec::map_reduce_all<T>(
          [](auto v) { return v * v; }, [](auto a, auto b) { return a + b; }, rr, d);
      const acc_t<T> inv = acc_t<T>(1) / std::sqrt(sum_sq / static_cast<acc_t<T>>(d) + static_cast<acc_t<T>>(eps));
      at::vec::map2<T>([inv](auto rv, auto wv) { return rv * decltype(rv)(inv) * wv; }, xr, rr, w, d);
    }
  });
}

// out[r] = silu(x[r, :d]) * x[r, d:], silu(a) = a / (1 + exp(-a)).
template <typename T>
void silu_and_mul_rows(const T* x, T* out, int64_t rows, int64_t d) {
  at::parallel_for(0, rows, grain_rows(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * 2 * d;
      at::vec::map2<T>(
          [](auto a, auto b) {
            using V = decltype(a);
            return a / (V(1) + a.neg().exp()) * b;
          },
          out + r * d, xr, xr + d, d);
    }
  });
}

at::Tensor rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps) {
  check_norm_inputs("rms_norm", input, weight);
  const at::Tensor x = input.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty(input.sizes(), input.options());
  const int64_t d = input.size(-1);
  const int64_t rows = d == 0 ? 0 : input.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "rms_norm_cpu", [&] {
    rms_norm_rows<scalar_t>(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                            y.mutable_data_ptr<scalar_t>(), rows, d, eps);
  });
  return y;
}

void fused_add_rms_norm_cpu(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_norm_inputs("fused_add_rms_norm", input, weight);
  check_same_as("fused_add_rms_norm", "residual", residual, input);
  // Non-contiguous tensors are processed in contiguous copies, then written back in place.
  at::Tensor x = input.is_contiguous() ? input : input.contiguous();
  at::Tensor res = residual.is_contiguous() ? residual : residual.contiguous();
  const at::Tensor w = weight.contiguous();
  const int64_t d = input.size(-1);
  const int64_t rows = d == 0 ? 0 : input.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "fused_add_rms_norm_cpu", [&] {
    fused_add_rms_norm_rows<scalar_t>(x.mutable_data_ptr<scalar_t>(), res.mutable_data_ptr<scalar_t>(),
                                      w.const_data_ptr<scalar_t>(), rows, d, eps);
  });
  if (!x.is_same(input)) input.copy_(x);
  if (!res.is_same(residual)) residual.copy_(res);
}

at::Tensor silu_and_mul_cpu(const at::Tensor& input) {
  check_silu_and_mul_input("silu_and_mul", input);
  const at::Tensor x = input.contiguous();
  const int64_t d = input.size(-1) / 2;
  auto sizes = input.sizes().vec();
  sizes.back() = d;
  at::Tensor out = at::empty(sizes, input.options());
  const int64_t rows = d == 0 ? 0 : out.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "silu_and_mul_cpu", [&] {
    silu_and_mul_rows<scalar_t>(x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), rows, d);
  });
  return out;
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("rms_norm", &ops::rms_norm_cpu);
  m.impl("fused_add_rms_norm", &ops::fused_add_rms_norm_cpu);
  m.impl("silu_and_mul", &ops::silu_and_mul_cpu);
}
