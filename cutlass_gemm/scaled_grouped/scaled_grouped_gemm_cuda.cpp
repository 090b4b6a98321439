// ops::scaled_grouped_gemm on CUDA: the SM90 FP8 grouped CUTLASS kernels (sm90_scaled_grouped_gemm.cuh: offs
// read on the device, no host synchronization) where they are built and take the call (2D x 3D and 3D x 3D, no
// bias, an sm_90a device); else torch._scaled_grouped_mm where it takes the call (rowwise, bfloat16 out, no
// bias, SM90, under 1024 groups, every mode; offs read on the device too); else the dequantized ATen formula
// per group (scaled_grouped_gemm.cpp), the group ends copied to the host.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <utility>

#include "../../csrc/json.h"
#include "../core/group_ends.h"
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

// The operands torch._scaled_grouped_mm takes: A row-major, B column-major (K-major, as (G, N, K) weights
// transposed), each a view it takes (torch_grouped_layout), copied where it is not; undefined where a copy is
// no such view either.
std::pair<at::Tensor, at::Tensor> torch_operands(const at::Tensor& A, const at::Tensor& B) {
  at::Tensor a = torch_row_major(A);
  at::Tensor b = B.stride(-2) == 1 && torch_grouped_layout(B) ? B : B.transpose(-2, -1).contiguous().transpose(-2, -1);
  if (a.stride(-1) != 1 || !torch_grouped_layout(a) || b.stride(-2) != 1 || !torch_grouped_layout(b)) return {};
  return {a, b};
}

// Why torch._scaled_grouped_mm does not take the call, "" where it does: its rowwise FP8 kernel
// (aten/src/ATen/native/cuda/GroupedBlas.cpp and ScaledGroupMM.cu: SM90, under 1024 groups, bfloat16 out, no
// bias; 2D x 3D with offs, 3D x 3D, 2D x 2D (offs over K), 3D x 2D (offs over N); K and N multiples of 16, as
// this op checks). For 2D x 3D with a row-major A its prepare_grouped_gemm_data asserts nothing on the device
// (GroupMMCommon.cuh); offs reach it clamped. For 2D x 2D and 3D x 2D it asserts on the group sizes: they get
// operands on which its assertions hold (torch_ragged_operands).
std::string why_not_torch(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& bias,
                          const ScaledGroupedProblem& p, at::ScalarType dtype) {
  if (p.recipe != ScaleRecipe::Rowwise) return "torch._scaled_grouped_mm has no blockwise recipe";
  if (dtype != at::kBFloat16) return "torch._scaled_grouped_mm's rowwise kernel writes bfloat16 only";
  if (bias.has_value()) return "torch._scaled_grouped_mm takes no bias";
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(A.device().index());
  if (prop->major != 9 || prop->minor != 0)
    return c10::str("torch._scaled_grouped_mm's rowwise kernel is built for SM90 only (ScaledGroupMM.cu), not "
                    "compute capability ", prop->major, ".", prop->minor);
  if (p.grouped.groups >= 1024) return "torch._scaled_grouped_mm takes fewer than 1024 groups";
  if (A.numel() == 0 || B.numel() == 0) return "an empty operand";
  if (p.grouped.groups == 0) return "no group";
  return "";
}

// torch._scaled_grouped_mm's result (why_not_torch ""), or undefined where its operands take no layout it reads.
at::Tensor torch_scaled_grouped(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                const ScaledGroupedProblem& p) {
  if (p.grouped.mode == GroupedMode::RaggedK || p.grouped.mode == GroupedMode::RaggedN) {
    const TorchRaggedOperands t = torch_ragged_operands(A, B, scale_a, scale_b, *offs, p.grouped.mode);
    at::Tensor out = at::_scaled_grouped_mm(t.a, t.b, t.scale_a, t.scale_b, t.ends, c10::nullopt, c10::nullopt,
                                            at::kBFloat16, /*use_fast_accum=*/false);
    if (p.grouped.mode == GroupedMode::RaggedN) out = out.index_select(1, t.columns);
    zero_outside_groups(out, t.clamped, p.grouped);  // an empty group's 0 * a NaN or infinite scale: NaN there
    return out.is_contiguous() ? out : out.contiguous();
  }
  const auto [a, b] = torch_operands(A, B);
  if (!a.defined()) return {};
  const bool ragged = p.grouped.mode == GroupedMode::RaggedM;
  const c10::optional<at::Tensor> ends =
      ragged ? c10::optional<at::Tensor>(device_group_ends(*offs, p.grouped.extent)) : c10::nullopt;
  at::Tensor out = at::_scaled_grouped_mm(a, b, scale_a.contiguous(), scale_b.contiguous(), ends, c10::nullopt,
                                          c10::nullopt, at::kBFloat16, /*use_fast_accum=*/false);
  if (ends.has_value()) zero_outside_groups(out, *ends, p.grouped);
  return out.is_contiguous() ? out : out.contiguous();
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
  if (why_not_torch(A, B, bias, p, dtype).empty()) {
    if (at::Tensor out = torch_scaled_grouped(A, B, scale_a, scale_b, offs, p); out.defined()) return out;
  }
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
  std::string why_torch = why.empty() ? "" : why_not_torch(A, B, bias, p, dtype);
  const bool ragged = p.grouped.mode == GroupedMode::RaggedK || p.grouped.mode == GroupedMode::RaggedN;
  if (!why.empty() && why_torch.empty() && !ragged && !torch_operands(A, B).first.defined())
    why_torch = "no layout torch._scaled_grouped_mm takes";
  PlanHead head;
  head.kind = GemmKind::ScaledGrouped;
  if (why.empty()) {
    head.path = "cutlass";
    head.kernel = scaled_grouped_kernel_name(dtype, p.recipe == ScaleRecipe::Rowwise ? 1 : 128);
    head.candidates = {head.kernel};
    head.reason = "an SM90 FP8 grouped kernel takes the call (offsets read on the device)";
  } else if (why_torch.empty()) {
    head.path = "torch._scaled_grouped_mm";
    head.reason = why + "; torch._scaled_grouped_mm takes the call (offsets read on the device" +
                  (ragged ? "; each group moved to a 16-aligned start)" : ")");
  } else {
    head.path = "formula";
    head.reason =
        why + "; " + why_torch + "; the dequantized ATen formula per group, the group ends copied to the host";
  }
  const bool host_sync = head.path == "formula" && p.grouped.mode != GroupedMode::Batched;
  return plan_json(head, [&](JsonObject& o) {
    o.add("mode", grouped_mode_name(p.grouped.mode))
        .add("recipe", scale_recipe_name(p.recipe))
        .add("host_sync", host_sync);
  });
}

}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("scaled_grouped_gemm", &ops::cutlass_gemm::scaled_grouped_gemm_cuda);
  m.impl("scaled_grouped_gemm.out", &ops::cutlass_gemm::scaled_grouped_gemm_out_cuda);
}
