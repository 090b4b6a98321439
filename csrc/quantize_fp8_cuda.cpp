// CUDA kernels of quantize_fp8 and its fused forms: per row and per 1x128 group (and per tensor with a
// given scale) of float16, bfloat16 and float32 rows in 16-byte packs, quantize_fp8_kernels.cuh
// (quantize_fp8, silu_and_mul_fp8) and fused_kernels.cu (rms_norm_fp8, fused_add_rms_norm_fp8); every other
// call (per tensor dynamic, per 128x128 block, float64, rows not in packs), quantize_fp8's ATen formula or
// the fused form's composition, which give the same bits.
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "fused_kernels.h"
#include "quantize_fp8.h"

namespace ops {
namespace {

using Quantized = std::tuple<at::Tensor, at::Tensor>;
using Granularity = Fp8Quantization::Granularity;

std::optional<int> kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return fused::kF16;
    case at::kBFloat16: return fused::kBF16;
    case at::kFloat: return fused::kF32;
    default: return std::nullopt;
  }
}

// Whether the kernels quantize to `q`: per row or 1x128 group, or per tensor with a given scale.
bool kernel_granularity(const Fp8Quantization& q) {
  return q.granularity == Granularity::Row || q.granularity == Granularity::Group ||
         (q.granularity == Granularity::Tensor && q.given);
}

// Allocates the outputs of `q` (codes of `sizes`, and scales, or the given scales' copy), fills the fields
// the kernels' argument structs share and calls launch(args, stream); nullopt where it is not supported.
template <typename Args, typename Launch>
std::optional<Quantized> run_quantizing(const char* op, const Fp8Quantization& q, const at::Tensor& x,
                                        at::IntArrayRef sizes, int dtype, const c10::optional<at::Tensor>& scale,
                                        bool pow2_scale, Args args, Launch&& launch) {
  at::Tensor codes = at::empty(sizes, x.options().dtype(q.dtype));
  at::Tensor scales = q.given ? scale->reshape(q.scale_shape).clone(at::MemoryFormat::Contiguous)
                              : at::empty(q.scale_shape, x.options().dtype(at::kFloat));
  args.dtype = dtype;
  args.e5m2 = q.dtype == at::kFloat8_e5m2;
  args.groups = q.granularity == Granularity::Group;
  args.x = x.const_data_ptr();
  args.codes = static_cast<unsigned char*>(codes.data_ptr());
  args.scales = q.given ? nullptr : scales.data_ptr<float>();
  args.rows = codes.numel() / sizes.back();
  if (q.given) {
    args.given = scales.const_data_ptr<float>();
    args.given_stride = q.granularity == Granularity::Tensor ? 0 : scales.size(-1);
  }
  args.pow2 = pow2_scale;
  const cudaError_t err = launch(args, at::cuda::getCurrentCUDAStream());
  if (err == cudaErrorNotSupported) return std::nullopt;
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
  return Quantized{codes, scales};
}

// The kernel's (codes, scales) for `q` of rows of `k` elements read from x (contiguous; rows of
// (gate, up), 2k wide, with silu_and_mul), or nullopt where the kernel does not take them.
std::optional<Quantized> quantize_rows(const char* op, const Fp8Quantization& q, const at::Tensor& x,
                                       at::IntArrayRef sizes, bool silu_and_mul,
                                       const c10::optional<at::Tensor>& scale, bool pow2_scale) {
  const std::optional<int> dtype = kernel_dtype(x.scalar_type());
  const int64_t k = sizes.back();
  if (!dtype || k == 0 || !kernel_granularity(q) || !fused::quantize_fp8_supported(*dtype, x.const_data_ptr(), k)) {
    return std::nullopt;
  }
  fused::QuantizeFp8Args args;
  args.silu_and_mul = silu_and_mul;
  args.k = k;
  return run_quantizing(op, q, x, sizes, *dtype, scale, pow2_scale, args, fused::quantize_fp8);
}

Quantized quantize_fp8_cuda(const at::Tensor& input, c10::string_view granularity,
                            c10::optional<at::ScalarType> dtype, const c10::optional<at::Tensor>& scale,
                            bool pow2_scale) {
  constexpr const char* op = "quantize_fp8";
  const Fp8Quantization q = check_quantize_fp8(op, input, input.sizes(), granularity, dtype, scale, pow2_scale);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous();
  if (auto out = quantize_rows(op, q, x, input.sizes(), /*silu_and_mul=*/false, scale, pow2_scale)) return *out;
  return quantize_fp8_formula(q, input, scale, pow2_scale);
}

Quantized silu_and_mul_fp8_cuda(const at::Tensor& input, c10::string_view granularity,
                                c10::optional<at::ScalarType> dtype, const c10::optional<at::Tensor>& scale,
                                bool pow2_scale) {
  constexpr const char* op = "silu_and_mul_fp8";
  check_silu_and_mul_input(op, input);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() /= 2;
  const Fp8Quantization q = check_quantize_fp8(op, input, sizes, granularity, dtype, scale, pow2_scale);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous();
  // The gate and up halves start at 16-byte boundaries only if d is a multiple of a pack, which
  // quantize_fp8_supported checks for k = d.
  if (auto out = quantize_rows(op, q, x, sizes, /*silu_and_mul=*/true, scale, pow2_scale)) return *out;
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: not differentiable
  static const auto silu_and_mul = c10::Dispatcher::singleton()
                                       .findSchemaOrThrow("ops::silu_and_mul", "")
                                       .typed<at::Tensor(const at::Tensor&)>();
  return quantize_fp8_formula(q, silu_and_mul.call(input), scale, pow2_scale);
}

// The norm kernels' FP8 forms for `q` (checked) of rows of x (and residual), or nullopt where they do
// not take them.
std::optional<Quantized> rms_norm_rows(const char* op, const Fp8Quantization& q, const at::Tensor& x,
                                       at::Tensor* residual, const at::Tensor& weight, double eps,
                                       const c10::optional<at::Tensor>& scale, bool pow2_scale,
                                       bool round_before_weight) {
  const std::optional<int> dtype = kernel_dtype(x.scalar_type());
  const int64_t hidden = x.size(-1);
  if (!dtype || !kernel_granularity(q) ||
      !fused::rms_norm_fp8_supported(*dtype, x.const_data_ptr(), residual ? residual->const_data_ptr() : nullptr,
                                     weight.const_data_ptr(), hidden)) {
    return std::nullopt;
  }
  fused::RmsNormFp8Args args;
  args.residual = residual ? residual->data_ptr() : nullptr;
  args.weight = weight.const_data_ptr();
  args.hidden = hidden;
  args.eps = eps;
  args.round_x_hat = round_before_weight;
  return run_quantizing(op, q, x, x.sizes(), *dtype, scale, pow2_scale, args, fused::rms_norm_fp8);
}

Quantized rms_norm_fp8_cuda(const at::Tensor& input, const at::Tensor& weight, double eps,
                            c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                            const c10::optional<at::Tensor>& scale, bool pow2_scale, bool round_before_weight) {
  constexpr const char* op = "rms_norm_fp8";
  check_norm_inputs(op, input, weight);
  const Fp8Quantization q = check_quantize_fp8(op, input, input.sizes(), granularity, dtype, scale, pow2_scale);
  const c10::cuda::CUDAGuard guard(input.device());
  if (input.is_contiguous() && weight.is_contiguous()) {
    if (auto out = rms_norm_rows(op, q, input, nullptr, weight, eps, scale, pow2_scale, round_before_weight)) {
      return *out;
    }
  }
  return rms_norm_fp8_composed(input, weight, eps, granularity, dtype, scale, pow2_scale, round_before_weight);
}

Quantized fused_add_rms_norm_fp8_cuda(const at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                                      double eps, c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                                      const c10::optional<at::Tensor>& scale, bool pow2_scale,
                                      bool round_before_weight) {
  constexpr const char* op = "fused_add_rms_norm_fp8";
  check_fused_add_rms_norm_fp8_inputs(input, residual, weight);
  const Fp8Quantization q = check_quantize_fp8(op, input, input.sizes(), granularity, dtype, scale, pow2_scale);
  const c10::cuda::CUDAGuard guard(input.device());
  // In place on residual's own memory: contiguous operands only (the composition serves the rest).
  if (input.is_contiguous() && residual.is_contiguous() && weight.is_contiguous()) {
    if (auto out = rms_norm_rows(op, q, input, &residual, weight, eps, scale, pow2_scale, round_before_weight)) {
      return *out;
    }
  }
  return fused_add_rms_norm_fp8_composed(input, residual, weight, eps, granularity, dtype, scale, pow2_scale,
                                         round_before_weight);
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("quantize_fp8", &ops::quantize_fp8_cuda);
  m.impl("silu_and_mul_fp8", &ops::silu_and_mul_fp8_cuda);
  m.impl("rms_norm_fp8", &ops::rms_norm_fp8_cuda);
  m.impl("fused_add_rms_norm_fp8", &ops::fused_add_rms_norm_fp8_cuda);
}
