// Autograd kernels registered in C++.
//
// cutlass_gemm: its formula lives here rather than in Python (torch.library.register_autograd) for
// two reasons: a Python autograd kernel costs a round trip through the interpreter on every call,
// with or without grad (~4-5 us, more than a 64x64x64 GEMM on a CPU), and C++ programs that load the
// library (tests/cpp) get a differentiable op too. The other differentiable ops (linear, rms_norm,
// silu_and_mul) keep their formulas in Python (ops/linear.py, ops/fused.py).
//
// cutlass_gemm.out and fused_add_rms_norm write their arguments in place and are not differentiable.
// Like torch.mm(..., out=), with grad mode on and an argument that requires grad they raise, instead
// of silently producing a result with no history; otherwise they run the op below autograd and bump
// the written tensors' versions.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "checks.h"

namespace ops {
namespace {

const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&)>& cutlass_gemm_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ops::cutlass_gemm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op;
}

// C = A B; dA = dC B^T, dB = A^T dC. The backward calls the op itself (through the dispatcher, on
// transposed views, which the CUDA kernels read in place), so it is differentiable again: double
// backward works. Only what the needed gradients use is saved.
class CutlassGemmFunction : public torch::autograd::Function<CutlassGemmFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& A,
                            const at::Tensor& B) {
    ctx->save_for_backward({B.requires_grad() ? A : at::Tensor(), A.requires_grad() ? B : at::Tensor()});
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return cutlass_gemm_op().call(A, B);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& grad = grad_outputs[0];
    at::Tensor grad_A, grad_B;
    if (grad.defined()) {
      if (ctx->needs_input_grad(0)) grad_A = cutlass_gemm_op().call(grad, saved[1].t());
      if (ctx->needs_input_grad(1)) grad_B = cutlass_gemm_op().call(saved[0].t(), grad);
    }
    return {grad_A, grad_B};
  }
};

at::Tensor cutlass_gemm_autograd(const at::Tensor& A, const at::Tensor& B) {
  // Only what autograd itself needs: the shape and dtype checks are the backend's and the fake
  // kernel's (reading sizes here would specialize symbolic shapes under torch.export / compile).
  check_gemm_defined("cutlass_gemm", A, B);
  if (at::GradMode::is_enabled() && (A.requires_grad() || B.requires_grad())) {
    return CutlassGemmFunction::apply(A, B);
  }
  // Nothing to record (as ATen's generated autograd kernels do): skip the autograd node entirely.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return cutlass_gemm_op().call(A, B);
}

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
  m.impl("cutlass_gemm", &ops::cutlass_gemm_autograd);
  m.impl("cutlass_gemm.out", &ops::cutlass_gemm_out_autograd);
  m.impl("fused_add_rms_norm", &ops::fused_add_rms_norm_autograd);
}
