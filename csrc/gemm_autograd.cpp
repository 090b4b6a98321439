// Autograd kernel of ops::cutlass_gemm.out. Like torch.mm(..., out=), the out variant is not
// differentiable: with grad mode on and an argument that requires grad it raises, instead of silently
// producing a result with no history. The functional ops::cutlass_gemm is the differentiable one
// (its formula is registered in ops/gemm.py).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

namespace ops {
namespace {

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
}
