// FP8 quantization as ops::quantize_fp8 computes it (quantize_fp8.cpp), for the ops that quantize
// what they compute (fp8_fused.cpp): errors name `op`.
#pragma once

#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

namespace ops {

std::tuple<at::Tensor, at::Tensor> quantize_fp8_as(const char* op, const at::Tensor& input,
                                                   c10::string_view granularity, c10::optional<at::ScalarType> dtype,
                                                   const c10::optional<at::Tensor>& scale, bool pow2_scale);

}  // namespace ops
