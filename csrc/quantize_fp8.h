// FP8 quantization as ops::quantize_fp8 computes it (quantize_fp8.cpp): the checks, with errors naming
// `op`, and the formula in ATen; for the CUDA kernels (quantize_fp8_cuda.cpp) and the ops that quantize
// what they compute (fp8_fused.cpp).
#pragma once

#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

namespace ops {

// What a checked call quantizes to.
struct Fp8Quantization {
  enum class Granularity { Tensor, Row, Group, Block };
  Granularity granularity = Granularity::Row;
  at::ScalarType dtype = at::kFloat8_e4m3fn;
  double max = 448.0;  // the largest finite code
  std::vector<int64_t> scale_shape;
  bool given = false;  // a static scale
};

// Checks a quantization of `input` (of dtype and device as given; `sizes`: the shape quantized, which is
// input's own for quantize_fp8).
Fp8Quantization check_quantize_fp8(const char* op, const at::Tensor& input, at::IntArrayRef sizes,
                                   c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                                   const c10::optional<at::Tensor>& scale, bool pow2_scale);

// (codes, scales) of a checked quantization of `input`, in ATen.
std::tuple<at::Tensor, at::Tensor> quantize_fp8_formula(const Fp8Quantization& q, const at::Tensor& input,
                                                        const c10::optional<at::Tensor>& scale, bool pow2_scale);

// ops::quantize_fp8 through the dispatcher (its CPU or CUDA kernel) after checking with `op`'s name.
std::tuple<at::Tensor, at::Tensor> quantize_fp8_call(const char* op, const at::Tensor& input,
                                                     c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                                                     const c10::optional<at::Tensor>& scale, bool pow2_scale);

// The CPU kernel of quantize_fp8 per row (group = x's row length) and per 1x128 group (group = 128)
// (fused_cpu.cpp, the build of the CPU's capability): x float32, float16 or bfloat16 and codes (FP8, x's
// shape) contiguous; scales one per group, or null where `given` holds them (one per group; given_stride 0:
// one for all). The formula's bits.
void quantize_fp8_rows_cpu(const at::Tensor& x, int64_t group, const float* given, int64_t given_stride, bool pow2,
                           at::Tensor& codes, float* scales);

// The norms' FP8 forms as their composition (fp8_fused.cpp: the norm's kernel, then quantize_fp8's),
// with their checks: the CPU kernels, and the CUDA kernels' fallback (quantize_fp8_cuda.cpp).
std::tuple<at::Tensor, at::Tensor> rms_norm_fp8_composed(const at::Tensor& input, const at::Tensor& weight,
                                                         double eps, c10::string_view granularity,
                                                         c10::optional<at::ScalarType> dtype,
                                                         const c10::optional<at::Tensor>& scale, bool pow2_scale,
                                                         bool round_before_weight);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_fp8_composed(
    const at::Tensor& input, at::Tensor& residual, const at::Tensor& weight, double eps, c10::string_view granularity,
    c10::optional<at::ScalarType> dtype, const c10::optional<at::Tensor>& scale, bool pow2_scale,
    bool round_before_weight);
void check_fused_add_rms_norm_fp8_inputs(const at::Tensor& input, const at::Tensor& residual,
                                         const at::Tensor& weight);

}  // namespace ops
