// The fused forms that quantize what they compute to FP8, saving the pass over memory that reads the
// result back: rms_norm_fp8, fused_add_rms_norm_fp8, silu_and_mul_fp8. Their codes and scales are by
// definition those of the unfused formula, quantize_fp8(op(...)) with the op's output rounded to the
// input's dtype first (round_before_weight as rms_norm's); here that composition (the op's kernel, then
// quantize_fp8's), the CPU kernels and the CUDA kernels' fallback (quantize_fp8_cuda.cpp).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <vector>

#include "checks.h"
#include "quantize_fp8.h"

namespace ops {
namespace {

using Quantized = std::tuple<at::Tensor, at::Tensor>;

at::Tensor rms_norm_call(const at::Tensor& x, const at::Tensor& w, double eps, bool round_before_weight) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::rms_norm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double, bool)>();
  return op.call(x, w, eps, round_before_weight);
}

}  // namespace

Quantized rms_norm_fp8_composed(const at::Tensor& input, const at::Tensor& weight, double eps,
                                c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                                const c10::optional<at::Tensor>& scale, bool pow2_scale, bool round_before_weight) {
  constexpr const char* op = "rms_norm_fp8";
  check_norm_inputs(op, input, weight);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return quantize_fp8_call(op, rms_norm_call(input, weight, eps, round_before_weight), granularity, dtype, scale,
                           pow2_scale);
}

void check_fused_add_rms_norm_fp8_inputs(const at::Tensor& input, const at::Tensor& residual,
                                         const at::Tensor& weight) {
  constexpr const char* op = "fused_add_rms_norm_fp8";
  check_norm_inputs(op, input, weight);
  check_same_as(op, "residual", residual, input);
  check_written_in_place(op, "residual", residual);
  check_no_shared_memory(op, "residual", residual, "input", input);
  check_no_shared_memory(op, "residual", residual, "weight", weight);
}

Quantized fused_add_rms_norm_fp8_composed(const at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                                          double eps, c10::string_view granularity,
                                          c10::optional<at::ScalarType> dtype, const c10::optional<at::Tensor>& scale,
                                          bool pow2_scale, bool round_before_weight) {
  constexpr const char* op = "fused_add_rms_norm_fp8";
  check_fused_add_rms_norm_fp8_inputs(input, residual, weight);
  // The quantization's arguments too, before residual is written: a call that raises leaves it as it was.
  check_quantize_fp8(op, input, input.sizes(), granularity, dtype, scale, pow2_scale);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  residual.add_(input);
  return quantize_fp8_call(op, rms_norm_call(residual, weight, eps, round_before_weight), granularity, dtype, scale,
                           pow2_scale);
}

namespace {

Quantized silu_and_mul_fp8(const at::Tensor& input, c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                           const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  constexpr const char* op = "silu_and_mul_fp8";
  check_silu_and_mul_input(op, input);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() /= 2;
  check_quantize_fp8(op, input, sizes, granularity, dtype, scale, pow2_scale);  // errors naming input's shape
  static const auto silu_and_mul = c10::Dispatcher::singleton()
                                       .findSchemaOrThrow("ops::silu_and_mul", "")
                                       .typed<at::Tensor(const at::Tensor&)>();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return quantize_fp8_call(op, silu_and_mul.call(input), granularity, dtype, scale, pow2_scale);
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("rms_norm_fp8", &ops::rms_norm_fp8_composed);
  m.impl("fused_add_rms_norm_fp8", &ops::fused_add_rms_norm_fp8_composed);
  m.impl("silu_and_mul_fp8", &ops::silu_and_mul_fp8);
}
