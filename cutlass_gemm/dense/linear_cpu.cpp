// CPU kernel of ops::linear: ATen's linear (addmm, BLAS) plus the activation, with the same checks and
// semantics as the CUDA kernel (cutlass_gemm/dense/linear_cuda.cpp).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <vector>

#include "../../csrc/activation_ops.h"
#include "../../csrc/checks.h"

namespace ops {
namespace {

at::Tensor linear_cpu(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                      c10::string_view activation) {
  check_linear_inputs("linear", input, weight, bias);
  const Activation act = parse_activation("linear", activation);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  // ATen's own linear (addmm on folded leading dimensions, as F.linear runs), then the activation in
  // place: the same BLAS calls as F.linear + activation, one output buffer. Where at::linear takes
  // at::matmul (an input of 3 or more dimensions, not contiguous or without bias), F.linear folds it into
  // rows (a copy) when the weight requires grad: at::matmul's should_fold reads that from weight.t(), a view
  // that below autograd no longer requires grad, so the fold is made here.
  const bool fused_bias = bias.has_value() && bias->defined() && input.is_contiguous();
  at::Tensor out;
  if (input.dim() >= 3 && weight.requires_grad() && !fused_bias) {
    std::vector<int64_t> sizes = input.sizes().vec();
    sizes.back() = weight.size(0);
    out = at::mm(input.reshape({-1, input.size(-1)}), weight.t()).view(sizes);
    if (bias.has_value() && bias->defined()) out.add_(*bias);
  } else {
    out = at::linear(input, weight, bias).contiguous();
  }
  apply_activation_(out, act);
  return out;
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("linear", &ops::linear_cpu); }
