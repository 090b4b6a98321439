// The CPU kernels of ops::cutlass_gemm: the same checks and semantics as the CUDA path, computed by
// ATen's BLAS (MKL / OpenBLAS / oneDNN, whichever this torch uses). They call ATen's CPU mm kernel
// directly (at::cpu::mm): this kernel already is the CPU dispatch, and a second trip through the
// dispatcher is a measurable part of a small GEMM's cost (benchmarks.gemm --suite overhead).
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <torch/library.h>

#include <string>

#include "../../csrc/checks.h"
#include "../core/plan_json.h"

namespace ops {
namespace {

void cutlass_gemm_out_cpu(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  check_gemm_inputs("cutlass_gemm", A, B);
  const bool may_alias = check_gemm_out("cutlass_gemm", A, B, out);
  // A backend kernel: the ATen call inside must not be seen by autograd (the op's own autograd
  // formula, where registered, is above this kernel).
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (may_alias) {
    out.copy_(at::cpu::mm(A, B));  // out shares A's or B's buffer: never read what we are writing
  } else {
    at::cpu::mm_out(out, A, B);
  }
}

at::Tensor cutlass_gemm_cpu(const at::Tensor& A, const at::Tensor& B) {
  check_gemm_inputs("cutlass_gemm", A, B);
  return at::cpu::mm(A, B);  // a new row-major tensor, as the fake kernel says
}

// The plan on CPU: ATen's BLAS, as plan() says of every GEMM no CUTLASS kernel runs (core/plan_json.h).
std::string cutlass_gemm_plan_cpu(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& out) {
  check_gemm_inputs("cutlass_gemm", A, B);
  if (out.has_value()) check_gemm_out("cutlass_gemm", A, B, *out);
  return cutlass_gemm::aten_plan_json("the CPU runs ATen's BLAS (torch.mm's kernel)", A.size(0), B.size(1), A.size(1));
}

}  // namespace
}  // namespace ops

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("cutlass_gemm", &ops::cutlass_gemm_cpu);
  m.impl("cutlass_gemm.out", &ops::cutlass_gemm_out_cpu);
  m.impl("_cutlass_gemm_plan", &ops::cutlass_gemm_plan_cpu);
}
