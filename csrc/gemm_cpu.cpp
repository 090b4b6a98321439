// The CPU kernels of ops::cutlass_gemm: the same checks and semantics as the CUDA path, computed by
// ATen's BLAS (at::mm_out: MKL / OpenBLAS / oneDNN, whichever this torch uses).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include "checks.h"

namespace ops {
namespace {

void cutlass_gemm_out_cpu(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  check_gemm_inputs("cutlass_gemm", A, B);
  const bool may_alias = check_gemm_out("cutlass_gemm", A, B, out);
  // A backend kernel: the ATen call inside must not be seen by autograd (the op's own autograd
  // formula, where registered, is above this kernel).
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (may_alias) {
    out.copy_(at::mm(A, B));  // out shares A's or B's buffer: never read what we are writing
  } else {
    at::mm_out(out, A, B);
  }
}

at::Tensor cutlass_gemm_cpu(const at::Tensor& A, const at::Tensor& B) {
  check_gemm_inputs("cutlass_gemm", A, B);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return at::mm(A, B).contiguous();  // at::mm returns a new row-major tensor: contiguous() is a no-op
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("cutlass_gemm", &ops::cutlass_gemm_cpu);
  m.impl("cutlass_gemm.out", &ops::cutlass_gemm_out_cpu);
}
