// Autograd kernels of the ops that write their arguments in place and are not differentiable
// (cutlass_gemm.out, fused_add_rms_norm). Like torch.mm(..., out=), with grad mode on and an argument
// that requires grad they raise, instead of silently producing a result with no history; otherwise
// they run the op below autograd and bump the written tensors' versions. The differentiable ops'
// formulas are registered in Python (ops/gemm.py, ops/fused.py).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace ops {
namespace {

void fused_add_rms_norm_autograd(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight,
                                 double eps) {
  TORCH_CHECK(!(at::GradMode::is_enabled() &&
                (input.requires_grad() || residual.requires_grad() || weight.requires_grad())),
              "fused_add_rms_norm: an in-place inference op, it does not support automatic "
              "differentiation, but one of the arguments requires grad. Use ops.rms_norm(input + "
              "residual, weight) to differentiate, or run under torch.no_grad().");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::fused_add_rms_norm", "")
                             .typed<void(at::Tensor&, at::Tensor&, const at::Tensor&, double)>();
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.call(input, residual, weight, eps);
  }
  torch::autograd::impl::bump_version(input);
  torch::autograd::impl::bump_version(residual);
}

void cutlass_gemm_out_autograd(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  TORCH_CHECK(!(at::GradMode::is_enabled() &&
                (A.requires_grad() || B.requires_grad() || out.requires_grad())),
              "cutlass_gemm: the out= variant does not support automatic differentiation, but one of "
              "the arguments requires grad. Call ops.cutlass_gemm(A, B) without out= to differentiate, "
              "or run under torch.no_grad().");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::cutlass_gemm", "out")
                             .typed<void(const at::Tensor&, const at::Tensor&, at::Tensor&)>();
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.call(A, B, out);
  }
  torch::autograd::impl::bump_version(out);  // out was written in place (as ATen out= ops do)
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, Autograd, m) {
  m.impl("cutlass_gemm.out", &ops::cutlass_gemm_out_autograd);
  m.impl("fused_add_rms_norm", &ops::fused_add_rms_norm_autograd);
}
