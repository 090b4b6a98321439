// CPU kernels of rms_norm, fused_add_rms_norm and silu_and_mul: one pass over rows in parallel
// (at::parallel_for), vectorised with ATen's Vectorized helpers (at::vec::map*, which convert
// float16/bfloat16 through float), statistics in float (double for float64 inputs). The kernels
// (fused_cpu_kernels.h) run as their AVX2 build (fused_cpu_avx2.cpp) where the CPU supports it.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "checks.h"
#include "fused_common.h"
#include "fused_cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define OPS_HAVE_AVX2_KERNELS 1
namespace ops::AVX2 {
void rms_norm_kernel(const at::Tensor& x, const at::Tensor& w, at::Tensor& y, double eps);
void fused_add_rms_norm_kernel(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps);
void silu_and_mul_kernel(const at::Tensor& x, at::Tensor& out);
}  // namespace ops::AVX2
#endif

namespace ops {
namespace {

bool use_avx2() {
#ifdef OPS_HAVE_AVX2_KERNELS
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

#ifdef OPS_HAVE_AVX2_KERNELS
#define OPS_CPU_DISPATCH(name, ...) \
  (use_avx2() ? ops::AVX2::name(__VA_ARGS__) : ops::CPU_CAPABILITY::name(__VA_ARGS__))
#else
#define OPS_CPU_DISPATCH(name, ...) ops::CPU_CAPABILITY::name(__VA_ARGS__)
#endif

at::Tensor rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps) {
  check_norm_inputs("rms_norm", input, weight);
  const at::Tensor x = input.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty(input.sizes(), input.options());
  OPS_CPU_DISPATCH(rms_norm_kernel, x, w, y, eps);
  return y;
}

void fused_add_rms_norm_cpu(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_fused_add_rms_norm_inputs(input, residual, weight);
  const at::Tensor w = weight.contiguous();
  run_in_place_on_contiguous(input, residual, [&](at::Tensor& x, at::Tensor& res) {
    OPS_CPU_DISPATCH(fused_add_rms_norm_kernel, x, res, w, eps);
  });
}

at::Tensor silu_and_mul_cpu(const at::Tensor& input) {
  check_silu_and_mul_input("silu_and_mul", input);
  const at::Tensor x = input.contiguous();
  at::Tensor out = silu_and_mul_output(input);
  OPS_CPU_DISPATCH(silu_and_mul_kernel, x, out);
  return out;
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("rms_norm", &ops::rms_norm_cpu);
  m.impl("fused_add_rms_norm", &ops::fused_add_rms_norm_cpu);
  m.impl("silu_and_mul", &ops::silu_and_mul_cpu);
}
