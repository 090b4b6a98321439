// CPU kernel of ops::linear: ATen's addmm (BLAS) plus the activation, with the same checks and
// semantics as the CUDA kernel (cutlass_gemm/linear_cuda.cpp).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include "gemm_host.h"
#include "../csrc/checks.h"

namespace ops {
namespace {

at::Tensor linear_cpu(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                      c10::string_view activation) {
  check_linear_inputs("linear", input, weight, bias);
  const auto epilogue = cutlass_gemm::epilogue_for_activation("linear", activation);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const int64_t K = input.size(-1), N = weight.size(0);
  // Rows = product of the leading dimensions (not -1 in reshape: K or N may be 0).
  const int64_t M = c10::multiply_integers(input.sizes().slice(0, input.dim() - 1));
  auto out_sizes = input.sizes().vec();
  out_sizes.back() = N;
  at::Tensor out = at::empty(out_sizes, input.options());
  at::Tensor out2d = out.view({M, N});
  const at::Tensor x2d = input.reshape({M, K});
  if (bias.has_value() && bias->defined()) {
    at::addmm_out(out2d, *bias, x2d, weight.t());
  } else {
    at::mm_out(out2d, x2d, weight.t());
  }
  cutlass_gemm::apply_activation_(out2d, epilogue);
  return out;
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("linear", &ops::linear_cpu); }
