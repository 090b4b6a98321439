// ops::scaled_grouped_gemm on CUDA: the SM90 FP8 grouped CUTLASS kernels (sm90_scaled_grouped_gemm.cuh: offs
// read on the device, no host synchronization) where they are built and take the call (2D x 3D and 3D x 3D, no
// bias, an sm_90a device); else the dequantized ATen formula per group (scaled_grouped_gemm.cpp), the group
// ends copied to the host.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "../../csrc/json.h"
#include "../core/kernel_names.h"
#include "../core/operands.h"  // to_dtype
#include "../core/plan_json.h"
#include "../core/scaled_formula.h"
#include "../cuda/services.h"
#include "scaled_grouped_gemm.h"

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "scaled_grouped_gemm";

// Why the SM90 FP8 grouped kernels do not take the call; "" where they do.
std::string why_not_cutlass(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& bias,
                            const ScaledGroupedProblem& p) {
  const std::string refusal = sm90a_candidates_refusal("FP8 grouped");
  return refusal.empty() ? scaled_grouped_kernel_refusal(A, B, bias, p) : refusal;
}

at::Tensor launch(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
                  const c10::optional<at::Tensor>& offs, const ScaledGroupedProblem& p, at::ScalarType dtype) {
  ScaledGroupedLaunch l = prepare_scaled_grouped_launch(A, B, scale_a, scale_b, offs, p, dtype);
  l.args.grouped.device = A.device().index();
  l.args.grouped.sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const GemmLaunch launch{GemmKind::ScaledGrouped, &l.args, dtype, static_cast<int>(to_dtype(dtype))};
  const LaunchStatus status = run_kernel(kOp, launch, A);
  TORCH_CHECK(status.ok, kOp, ": CUTLASS kernel ", scaled_grouped_kernel_name(dtype, l.args.block_n), " failed: ",
              status.message);
  return l.d;
}

at::Tensor run(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
               const c10::optional<at::Tensor>& offs, const c10::optional<at::Tensor>& bias,
               const ScaledGroupedProblem& p, at::ScalarType dtype) {
  const c10::cuda::CUDAGuard guard(A.device());
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: ATen calls unseen by autograd
  if (why_not_cutlass(A, B, bias, p).empty()) return launch(A, B, scale_a, scale_b, offs, p, dtype);
  return scaled_grouped_gemm_loop(A, B, scale_a, scale_b, offs, bias, p, dtype);
}

at::Tensor scaled_grouped_gemm_cuda(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                    const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                    const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype) {
  return scaled_grouped_gemm_with(A, B, scale_a, scale_b, offs, bias, out_dtype, run);
}

void scaled_grouped_gemm_out_cuda(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                  const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                  const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                                  at::Tensor& out) {
  scaled_grouped_gemm_out_with(A, B, scale_a, scale_b, offs, bias, out_dtype, out, run);
}

}  // namespace

std::string scaled_grouped_gemm_cuda_plan(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                          const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                          const c10::optional<at::Tensor>& bias, at::ScalarType dtype) {
  const ScaledGroupedProblem p = check_scaled_grouped_gemm_inputs(kOp, A, B, scale_a, scale_b, offs, bias, dtype);
  const c10::cuda::CUDAGuard guard(A.device());
  const std::string why = why_not_cutlass(A, B, bias, p);
  PlanHead head;
  head.kind = GemmKind::ScaledGrouped;
  if (why.empty()) {
    head.path = "cutlass";
    head.kernel = scaled_grouped_kernel_name(dtype, p.recipe == ScaleRecipe::Rowwise ? 1 : 128);
    head.candidates = {head.kernel};
    head.reason = "an SM90 FP8 grouped kernel takes the call (offsets read on the device)";
  } else {
    head.path = "formula";
    head.reason = why + "; the dequantized ATen formula per group, the group ends copied to the host";
  }
  return plan_json(head, [&](JsonObject& o) {
    o.add("mode", grouped_mode_name(p.grouped.mode))
        .add("recipe", scale_recipe_name(p.recipe))
        .add("host_sync", !why.empty() && p.grouped.mode != GroupedMode::Batched);
  });
}

}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("scaled_grouped_gemm", &ops::cutlass_gemm::scaled_grouped_gemm_cuda);
  m.impl("scaled_grouped_gemm.out", &ops::cutlass_gemm::scaled_grouped_gemm_out_cuda);
}
