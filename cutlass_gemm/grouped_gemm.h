// ops::grouped_gemm's paths (checks.h GroupedMode), shared by its CPU kernel (grouped_gemm.cpp) and its CUDA
// kernel (grouped_gemm_cuda.cpp).
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>

#include <string>

#include "../csrc/checks.h"

namespace ops::cutlass_gemm {

// One ATen mm per group on slices of A, B and a fresh output of p.out_sizes and `dtype` (A's, or float32 for
// half inputs: each operand converted, one rounding); rows or columns past the last end zeroed. The group
// ends are read on the host (on CUDA a copy of offs: a synchronization) and checked (check_group_offsets).
at::Tensor grouped_gemm_loop(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                             const GroupedProblem& p, at::ScalarType dtype);

// torch._grouped_mm on offs clamped on the tensors' device (cummax of clamp(offs, 0, extent): groups of the
// clamped offsets, a bad offset reads nothing out of bounds), rows or columns past the last end and 2D x 2D
// groups of no K zeroed (torch leaves them unwritten), a contiguous result; no host synchronization. An
// undefined tensor where torch's op does not take the problem (grouped_gemm_torch_takes: its dtypes with
// out_dtype = A's, nothing empty, layouts it takes directly or after a contiguous copy). The CUDA kernel's
// path; the test hook _grouped_gemm_torch_path runs it on CPU.
at::Tensor grouped_gemm_torch(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                              const GroupedProblem& p, at::ScalarType dtype);
bool grouped_gemm_torch_takes(const at::Tensor& A, const at::Tensor& B, at::ScalarType dtype);

// grouped_gemm and grouped_gemm.out around a path `compute(A, B, offs, problem, dtype)` returning a fresh
// result: the op's checks, and for .out the copy into out last (out never feeds its own computation).
template <typename Compute>
at::Tensor grouped_gemm_with(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                             c10::optional<at::ScalarType> out_dtype, Compute&& compute) {
  const at::ScalarType dtype = out_dtype.value_or(A.scalar_type());
  return compute(A, B, offs, check_grouped_gemm_inputs("grouped_gemm", A, B, offs, dtype), dtype);
}

template <typename Compute>
void grouped_gemm_out_with(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                           c10::optional<at::ScalarType> out_dtype, at::Tensor& out, Compute&& compute) {
  TORCH_CHECK(out.defined(), "grouped_gemm: out must be a defined tensor");
  const at::ScalarType dtype = out_dtype.value_or(out.scalar_type());  // without out_dtype, out's decides
  const GroupedProblem p = check_grouped_gemm_inputs("grouped_gemm", A, B, offs, dtype);
  check_grouped_gemm_out("grouped_gemm", p, A, B, offs, out, dtype, "out_dtype");
  const at::Tensor result = compute(A, B, offs, p, dtype);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  out.copy_(result);
}

// JSON of the path a call takes (mode, path, host_sync, offsets): ops.grouped.plan.
std::string grouped_gemm_plan(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                              c10::optional<at::ScalarType> out_dtype);
#if OPS_WITH_CUDA
std::string grouped_gemm_cuda_path(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                   at::ScalarType dtype);  // grouped_gemm_cuda.cpp
#endif

}  // namespace ops::cutlass_gemm
