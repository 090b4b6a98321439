// CPU kernels of rms_norm, fused_add_rms_norm, silu_and_mul and quantize_fp8's per-row and 1x128 forms:
// one pass over rows in parallel (at::parallel_for), vectorised with ATen's Vectorized helpers (at::vec::map*,
// which convert float16/bfloat16 through float), statistics in float (double for float64 inputs), each
// result equal to torch's formula bit for bit (docs/numerics.md). The kernels
// (fused_cpu_kernels.h) are built for the baseline ISA here and for AVX2 (fused_cpu_avx2.cpp) and
// AVX-512 (fused_cpu_avx512.cpp); each call runs the build that matches the capability ATen runs its own
// CPU kernels at (at::get_cpu_capability(): the CPU's, or lower with ATEN_CPU_CAPABILITY).
#include <string>

#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <torch/library.h>

#include "checks.h"
#include "fused_common.h"
#include "fused_cpu_kernels.h"
#include "quantize_fp8.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define OPS_HAVE_X86_KERNELS 1
namespace ops::AVX2 {
void rms_norm_kernel(const at::Tensor& x, const at::Tensor& w, at::Tensor& y, double eps, bool round_x_hat);
void fused_add_rms_norm_kernel(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps, bool round_x_hat);
void silu_and_mul_kernel(const at::Tensor& x, at::Tensor& out);
void quantize_fp8_kernel(const at::Tensor& x, int64_t group, const float* given, int64_t given_stride, bool pow2,
                         at::Tensor& codes, float* scales);
}  // namespace ops::AVX2
namespace ops::AVX512 {
void rms_norm_kernel(const at::Tensor& x, const at::Tensor& w, at::Tensor& y, double eps, bool round_x_hat);
void fused_add_rms_norm_kernel(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps, bool round_x_hat);
void silu_and_mul_kernel(const at::Tensor& x, at::Tensor& out);
void quantize_fp8_kernel(const at::Tensor& x, int64_t group, const float* given, int64_t given_stride, bool pow2,
                         at::Tensor& codes, float* scales);
}  // namespace ops::AVX512
#endif

namespace ops {
namespace {

enum class Isa { Baseline, Avx2, Avx512 };

// ATen's capability (read once by ATen; it checks the CPU and the ATEN_CPU_CAPABILITY override), capped
// by what the CPU supports for our builds' target flags.
Isa cpu_isa() {
#ifdef OPS_HAVE_X86_KERNELS
  static const Isa isa = [] {
    const std::string capability = at::get_cpu_capability();  // "DEFAULT", "AVX2", "AVX512", ...
    if (capability == "AVX512" && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      return Isa::Avx512;
    }
    if ((capability == "AVX512" || capability == "AVX2") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      return Isa::Avx2;
    }
    return Isa::Baseline;
  }();
  return isa;
#else
  return Isa::Baseline;
#endif
}

#ifdef OPS_HAVE_X86_KERNELS
#define OPS_CPU_DISPATCH(name, ...)                                            \
  (cpu_isa() == Isa::Avx512 ? ops::AVX512::name(__VA_ARGS__)                   \
   : cpu_isa() == Isa::Avx2 ? ops::AVX2::name(__VA_ARGS__)                     \
                            : ops::CPU_CAPABILITY::name(__VA_ARGS__))
#else
#define OPS_CPU_DISPATCH(name, ...) ops::CPU_CAPABILITY::name(__VA_ARGS__)
#endif

// ops::_fused_cpu_isa(): which build the CPU kernels run ("avx512", "avx2" or "baseline"), for tests and
// bug reports.
std::string fused_cpu_isa() {
  switch (cpu_isa()) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    default: return "baseline";
  }
}

at::Tensor rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps, bool round_before_weight) {
  check_norm_inputs("rms_norm", input, weight);
  const at::Tensor x = input.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty(input.sizes(), input.options());
  OPS_CPU_DISPATCH(rms_norm_kernel, x, w, y, eps, round_before_weight);
  return y;
}

void fused_add_rms_norm_cpu(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight, double eps,
                            bool round_before_weight) {
  check_fused_add_rms_norm_inputs(input, residual, weight);
  const at::Tensor w = weight.contiguous();
  run_in_place_on_contiguous(input, residual, [&](at::Tensor& x, at::Tensor& res) {
    OPS_CPU_DISPATCH(fused_add_rms_norm_kernel, x, res, w, eps, round_before_weight);
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

void quantize_fp8_rows_cpu(const at::Tensor& x, int64_t group, const float* given, int64_t given_stride, bool pow2,
                           at::Tensor& codes, float* scales) {
  OPS_CPU_DISPATCH(quantize_fp8_kernel, x, group, given, given_stride, pow2, codes, scales);
}

}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) { m.impl("_fused_cpu_isa", &ops::fused_cpu_isa); }

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("rms_norm", &ops::rms_norm_cpu);
  m.impl("fused_add_rms_norm", &ops::fused_add_rms_norm_cpu);
  m.impl("silu_and_mul", &ops::silu_and_mul_cpu);
}
