// ops::grouped_gemm's paths (checks.h GroupedMode), shared by its CPU kernel (grouped_gemm.cpp) and its CUDA
// kernel (grouped_gemm_cuda.cpp).
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "../../csrc/checks.h"
#include "../core/kernel_names.h"
#include "../kernels/grouped_args.h"

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
// out_dtype = A's, nothing empty, layouts it takes directly or after a copy; for bfloat16, none where its
// kernel would check the groups' sizes on the device: 3D x 2D never). The CUDA kernel's path; the test hook
// _grouped_gemm_torch_path runs it on CPU.
at::Tensor grouped_gemm_torch(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                              const GroupedProblem& p, at::ScalarType dtype);
bool grouped_gemm_torch_takes(const at::Tensor& A, const at::Tensor& B, const GroupedProblem& p,
                              at::ScalarType dtype);

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
  const char* origin = out_dtype.has_value() ? "out_dtype" : "out's dtype";
  const GroupedProblem p = check_grouped_gemm_inputs("grouped_gemm", A, B, offs, dtype, origin);
  check_grouped_gemm_out("grouped_gemm", p, A, B, offs, out, dtype, origin);
  const at::Tensor result = compute(A, B, offs, p, dtype);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  out.copy_(result);
}

// The SM90 grouped kernels (sm90_grouped_gemm.cuh), host side (grouped_gemm_launch.cpp, ATen only).
// Why they do not take a checked problem, "" where they do (dtype, mode, emptiness, int32 extents, the
// 16-byte rows TMA reads).
std::string grouped_kernel_refusal(const at::Tensor& A, const at::Tensor& B, const GroupedProblem& p,
                                   at::ScalarType dtype);
// A launch: the operands as the kernels read them (the user's where TMA takes them in place, else copies),
// a fresh contiguous output (the op's result) and offs contiguous.
struct GroupedLaunch {
  GroupedGemmLaunchArgs args;  // device and sm_count left to the caller
  at::Tensor a, b, d, offs;
};
// The mode, operand layouts and swap_ab a launch of this problem runs with (the rest of the arguments unset).
GroupedGemmLaunchArgs grouped_kernel_layouts(const GroupedProblem& p, const at::Tensor& A, const at::Tensor& B);
GroupedLaunch prepare_grouped_launch(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                     const GroupedProblem& p, at::ScalarType dtype);

// JSON of the path a call takes (mode, path, host_sync, offsets): ops.grouped.plan.
std::string grouped_gemm_plan(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                              c10::optional<at::ScalarType> out_dtype);
#if OPS_WITH_CUDA
std::string grouped_gemm_cuda_path(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                   at::ScalarType dtype);  // grouped_gemm_cuda.cpp
#endif

}  // namespace ops::cutlass_gemm
