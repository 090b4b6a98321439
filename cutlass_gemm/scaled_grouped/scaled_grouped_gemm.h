// ops::scaled_grouped_gemm's paths (checks.h ScaledGroupedProblem), shared by its CPU kernel
// (scaled_grouped_gemm.cpp) and its CUDA kernel (scaled_grouped_gemm_cuda.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "../../csrc/checks.h"
#include "../kernels/scaled_grouped_args.h"

namespace ops::cutlass_gemm {

// The dequantized formula per group (core/scaled_formula.h) on slices of A, B, the scales, the bias and a
// fresh output of the problem's shape and `dtype`; rows (2D x 3D) or columns (3D x 2D) past the last end
// zeroed. The group ends are read on the host (on CUDA a copy of offs: a synchronization) and checked
// (check_group_offsets).
at::Tensor scaled_grouped_gemm_loop(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                    const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                    const c10::optional<at::Tensor>& bias, const ScaledGroupedProblem& p,
                                    at::ScalarType dtype);

// What computes a checked call: scaled_grouped_gemm_loop, or the CUDA kernel's choice of path.
using ScaledGroupedCompute = std::function<at::Tensor(
    const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
    const c10::optional<at::Tensor>& offs, const c10::optional<at::Tensor>& bias, const ScaledGroupedProblem& p,
    at::ScalarType dtype)>;

// The op and its out variant around `compute`: the inputs checked (and out: its shape, dtype, device and
// overlap), out_dtype bfloat16 by default (out's dtype for the out variant), the result copied into out.
at::Tensor scaled_grouped_gemm_with(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                    const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                    const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                                    const ScaledGroupedCompute& compute);
void scaled_grouped_gemm_out_with(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                  const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                  const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                                  at::Tensor& out, const ScaledGroupedCompute& compute);

// Why the SM90 FP8 grouped kernels do not take a call (mode, bias, extents), "" where they do
// (scaled_grouped_gemm_launch.cpp); the build and the device are the caller's to check.
std::string scaled_grouped_kernel_refusal(const at::Tensor& A, const at::Tensor& B,
                                          const c10::optional<at::Tensor>& bias, const ScaledGroupedProblem& p);

// One launch's arguments (device and sm_count left to the caller) and the tensors they point into.
struct ScaledGroupedLaunch {
  ScaledGroupedGemmLaunchArgs args;
  at::Tensor a, b, d, offs, scale_a, scale_b;
};
ScaledGroupedLaunch prepare_scaled_grouped_launch(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                                  const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                                  const ScaledGroupedProblem& p, at::ScalarType dtype);

// What torch._scaled_grouped_mm is given for 2D x 2D (the groups' K) and 3D x 2D (the groups' columns of B and
// scale_b) so that its device assertions hold for any offs (core/group_ends.h align_groups): a row-major, b
// column-major, the scales, the new group ends; `columns` (3D x 2D) picks the output's columns back from its
// result; `clamped`: the group ends zero_outside_groups takes. ATen ops on A's device, no synchronization.
struct TorchRaggedOperands {
  at::Tensor a, b, scale_a, scale_b, ends, columns, clamped;
};
TorchRaggedOperands torch_ragged_operands(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                          const at::Tensor& scale_b, const at::Tensor& offs, GroupedMode mode);

// The plan of a call on a CUDA tensor (scaled_grouped_gemm_cuda.cpp; CUDA builds).
std::string scaled_grouped_gemm_cuda_plan(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                          const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                          const c10::optional<at::Tensor>& bias, at::ScalarType dtype);

// JSON of the path a call takes (mode, recipe, path, host_sync): ops.fp8.grouped_plan.
std::string scaled_grouped_gemm_plan(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                     const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                     const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype);

}  // namespace ops::cutlass_gemm
