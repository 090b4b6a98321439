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
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
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

// The backward node of C = A B: dA = dC B^T, dB = A^T dC. Written the way ATen's generated autograd
// kernels are (a graph Node with SavedVariables, attached with set_history), not as a
// torch::autograd::Function: that is what torch.func transforms (grad, vjp, jacrev) support, and
// compiled autograd traces it like an ATen node (apply_with_saved). The backward calls the op itself
// (through the dispatcher, on transposed views, which the CUDA kernels read in place), so it is
// differentiable again: double backward works. Only what the needed gradients use is saved.
struct CutlassGemmBackward : public torch::autograd::TraceableFunction {
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::autograd::variable_list result(2);
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return result;
    if (task_should_compute_output(0)) result[0] = cutlass_gemm_op().call(grad, B_.unpack().t());
    if (task_should_compute_output(1)) result[1] = cutlass_gemm_op().call(A_.unpack().t(), grad);
    return result;
  }

  std::string name() const override { return "CutlassGemmBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    A_.reset_data();
    B_.reset_data();
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(A_, false);
    args.collect(B_, false);
  }

  torch::autograd::variable_list apply_with_saved(
      const torch::autograd::variable_list& grads,
      torch::dynamo::autograd::SwapSavedVariables& saved) override {
    saved.before(A_);
    saved.before(B_);
    torch::autograd::variable_list result = apply(torch::autograd::variable_list(grads));
    saved.after(A_);
    saved.after(B_);
    return result;
  }

  torch::autograd::SavedVariable A_;  // saved when B needs a gradient
  torch::autograd::SavedVariable B_;  // saved when A needs a gradient
};

at::Tensor cutlass_gemm_autograd(const at::Tensor& A, const at::Tensor& B) {
  // Only what autograd itself needs: the shape and dtype checks are the backend's and the fake
  // kernel's (reading sizes here would specialize symbolic shapes under torch.export / compile).
  check_gemm_defined("cutlass_gemm", A, B);
  c10::intrusive_ptr<CutlassGemmBackward> grad_fn;
  if (torch::autograd::compute_requires_grad(A, B)) {  // grad mode on and A or B requires grad
    grad_fn = c10::make_intrusive<CutlassGemmBackward>();
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(A, B));
    if (grad_fn->should_compute_output(1)) grad_fn->A_ = torch::autograd::SavedVariable(A, false);
    if (grad_fn->should_compute_output(0)) grad_fn->B_ = torch::autograd::SavedVariable(B, false);
  }
  at::Tensor C;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    C = cutlass_gemm_op().call(A, B);
  }
  if (grad_fn) torch::autograd::set_history(C, grad_fn);
  // Forward-mode AD (torch.autograd.forward_ad, torch.func.jvp / jacfwd): dC = dA B + A dB, by the op
  // on the primal values (through the dispatcher: differentiable again for forward-over-reverse).
  const at::Tensor dA = A._fw_grad(/*level=*/0);
  const at::Tensor dB = B._fw_grad(/*level=*/0);
  if (dA.defined() || dB.defined()) {
    at::Tensor dC;
    if (dA.defined()) dC = cutlass_gemm_op().call(dA, B._fw_primal(0));
    if (dB.defined()) {
      const at::Tensor term = cutlass_gemm_op().call(A._fw_primal(0), dB);
      dC = dC.defined() ? dC + term : term;
    }
    C._set_fw_grad(dC, /*level=*/0, /*is_inplace_op=*/false);
  }
  return C;
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
