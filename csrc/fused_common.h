// Shared by the CPU and CUDA wrappers of the fused ops (csrc/fused_cpu.cpp, csrc/fused_cuda.cpp): the
// parts that are about tensors, not about the device.
#pragma once

#include <ATen/ATen.h>

namespace ops {

// fused_add_rms_norm writes `input` and `residual` in place, whatever their strides: the kernels want
// contiguous rows, so non-contiguous tensors are processed in contiguous copies that are then written
// back. Calls kernel(x, res) with x, res contiguous (the tensors themselves when they already are).
template <typename Kernel>
void run_in_place_on_contiguous(at::Tensor& input, at::Tensor& residual, Kernel&& kernel) {
  at::Tensor x = input.is_contiguous() ? input : input.contiguous();
  at::Tensor res = residual.is_contiguous() ? residual : residual.contiguous();
  kernel(x, res);
  if (!x.is_same(input)) input.copy_(x);
  if (!res.is_same(residual)) residual.copy_(res);
}

// silu_and_mul's result for input (..., 2d): a new contiguous (..., d) tensor of input's dtype/device.
inline at::Tensor silu_and_mul_output(const at::Tensor& input) {
  auto sizes = input.sizes().vec();
  sizes.back() = input.size(-1) / 2;
  return at::empty(sizes, input.options());
}

}  // namespace ops
