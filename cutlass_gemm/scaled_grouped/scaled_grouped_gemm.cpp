// ops::scaled_grouped_gemm (FP8 grouped GEMM, torch._scaled_grouped_mm's modes and scales) on CPU, and on CUDA
// where the SM90 kernels do not take the call (scaled_grouped_gemm_cuda.cpp): the dequantized formula of
// scaled_gemm (core/scaled_formula.h) on each group's slices: codes times scales, product and bias in float32,
// one rounding to out_dtype.
#include "scaled_grouped_gemm.h"

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <vector>

#include "../../csrc/json.h"
#include "../core/group_ends.h"
#include "../core/plan_json.h"
#include "../core/scaled_formula.h"

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "scaled_grouped_gemm";

// Group g's operands, scales (as the formula's recipe takes them: rowwise (rows, 1) and (1, columns)),
// bias and output slice.
struct Group {
  at::Tensor a, b, scale_a, scale_b, bias, out;
};

Group group_of(const at::Tensor& A, const at::Tensor& B, const at::Tensor& sa, const at::Tensor& sb,
               const at::Tensor& bias, const ScaledGroupedProblem& p, at::Tensor& out, int64_t g, int64_t start,
               int64_t end) {
  const bool rowwise = p.recipe == ScaleRecipe::Rowwise;
  const int64_t M = A.size(-2), N = B.size(-1);
  Group r;
  switch (p.grouped.mode) {
    case GroupedMode::RaggedM:
      r = {A.slice(0, start, end), B[g], sa.slice(0, start, end), sb[g], bias.defined() ? bias[g] : bias,
           out.slice(0, start, end)};
      break;
    case GroupedMode::Batched:
      r = {A[g], B[g], sa[g], sb[g], bias.defined() ? bias[g] : bias, out[g]};
      break;
    case GroupedMode::RaggedN:
      r = {A[g], B.slice(1, start, end), sa[g], sb.slice(0, start, end),
           bias.defined() ? bias.slice(0, start, end) : bias, out.slice(1, start, end)};
      break;
    case GroupedMode::RaggedK:
      r = {A.slice(1, start, end), B.slice(0, start, end), sa.slice(0, g * M, (g + 1) * M),
           sb.slice(0, g * N, (g + 1) * N), bias.defined() ? bias[g] : bias, out[g]};
      break;
  }
  if (rowwise) r.scale_a = r.scale_a.unsqueeze(1), r.scale_b = r.scale_b.unsqueeze(0);
  return r;
}

}  // namespace

at::Tensor scaled_grouped_gemm_loop(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                    const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                    const c10::optional<at::Tensor>& bias, const ScaledGroupedProblem& p,
                                    at::ScalarType dtype) {
  const std::vector<int32_t> ends = group_ends(kOp, p.grouped, offs);
  at::Tensor out = at::empty(p.grouped.out_sizes, A.options().dtype(dtype));
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: ATen calls unseen by autograd
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  int64_t start = 0;
  for (int64_t g = 0; g < p.grouped.groups; ++g) {
    const int64_t end = p.grouped.mode == GroupedMode::Batched ? 0 : ends[g];
    Group group = group_of(A, B, scale_a, scale_b, b, p, out, g, start, end);
    scaled_gemm_formula_into(group.a, group.b, group.scale_a, group.scale_b,
                             group.bias.defined() ? c10::optional<at::Tensor>(group.bias) : c10::nullopt, p.recipe,
                             Activation::None, group.out);
    start = end;
  }
  if (p.grouped.mode == GroupedMode::RaggedM) out.slice(0, start, p.grouped.extent).zero_();
  if (p.grouped.mode == GroupedMode::RaggedN) out.slice(1, start, p.grouped.extent).zero_();
  return out;
}

at::Tensor scaled_grouped_gemm_with(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                    const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                    const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                                    const ScaledGroupedCompute& compute) {
  const at::ScalarType dtype = scaled_gemm_out_dtype(out_dtype);
  const ScaledGroupedProblem p = check_scaled_grouped_gemm_inputs(kOp, A, B, scale_a, scale_b, offs, bias, dtype);
  return compute(A, B, scale_a, scale_b, offs, bias, p, dtype);
}

void scaled_grouped_gemm_out_with(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                  const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                  const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                                  at::Tensor& out, const ScaledGroupedCompute& compute) {
  TORCH_CHECK(out.defined(), kOp, ": out must be a defined tensor");
  const at::ScalarType dtype = out_dtype.value_or(out.scalar_type());  // without out_dtype, out's decides
  const char* origin = out_dtype.has_value() ? "out_dtype" : "out's dtype";
  const ScaledGroupedProblem p =
      check_scaled_grouped_gemm_inputs(kOp, A, B, scale_a, scale_b, offs, bias, dtype, origin);
  check_scaled_grouped_gemm_out(kOp, p.grouped, A, B, scale_a, scale_b, offs, bias, out, dtype, origin);
  // Computed apart from out, then copied: out never feeds its own computation.
  const at::Tensor result = compute(A, B, scale_a, scale_b, offs, bias, p, dtype);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  out.copy_(result);
}

namespace {

at::Tensor scaled_grouped_gemm_cpu(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                   const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                   const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype) {
  return scaled_grouped_gemm_with(A, B, scale_a, scale_b, offs, bias, out_dtype, scaled_grouped_gemm_loop);
}

void scaled_grouped_gemm_out_cpu(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                 const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                 const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                                 at::Tensor& out) {
  scaled_grouped_gemm_out_with(A, B, scale_a, scale_b, offs, bias, out_dtype, out, scaled_grouped_gemm_loop);
}

}  // namespace

std::string scaled_grouped_gemm_plan(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                     const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                     const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = scaled_gemm_out_dtype(out_dtype);
#if OPS_WITH_CUDA
  if (A.is_cuda()) return scaled_grouped_gemm_cuda_plan(A, B, scale_a, scale_b, offs, bias, dtype);
#endif
  const ScaledGroupedProblem p = check_scaled_grouped_gemm_inputs(kOp, A, B, scale_a, scale_b, offs, bias, dtype);
  PlanHead head;
  head.kind = GemmKind::ScaledGrouped;
  head.path = "formula";
  head.reason = A.is_cuda() ? "a CPU-only build: the dequantized ATen formula per group, the group ends copied to "
                              "the host"
                            : "the CPU runs the dequantized ATen formula per group";
  return plan_json(head, [&](JsonObject& o) {
    o.add("mode", grouped_mode_name(p.grouped.mode))
        .add("recipe", scale_recipe_name(p.recipe))
        .add("host_sync", A.is_cuda() && p.grouped.mode != GroupedMode::Batched);
  });
}

TorchRaggedOperands torch_ragged_operands(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                          const at::Tensor& scale_b, const at::Tensor& offs, GroupedMode mode) {
  TORCH_CHECK(mode == GroupedMode::RaggedK || mode == GroupedMode::RaggedN,
              "torch_ragged_operands: 2D x 2D or 3D x 2D, not ", grouped_mode_name(mode));
  const bool cut_k = mode == GroupedMode::RaggedK;  // else N: B's columns and scale_b
  const AlignedGroups groups = align_groups(offs, cut_k ? A.size(1) : B.size(1));
  TorchRaggedOperands t;
  t.a = cut_k ? spread_groups(A, 1, groups) : torch_row_major(A);
  t.b = spread_groups(B.t(), cut_k ? 1 : 0, groups).t();
  t.scale_a = scale_a.contiguous();
  t.scale_b = cut_k ? scale_b.contiguous() : spread_groups(scale_b, 0, groups);
  t.ends = groups.ends;
  t.clamped = groups.clamped;
  if (!cut_k) t.columns = groups.dest;
  return t;
}

namespace {

// torch_ragged_operands on these tensors: a test hook.
std::vector<at::Tensor> scaled_grouped_gemm_torch_operands(const at::Tensor& A, const at::Tensor& B,
                                                           const at::Tensor& scale_a, const at::Tensor& scale_b,
                                                           const at::Tensor& offs) {
  constexpr const char* kHook = "_scaled_grouped_gemm_torch_operands";
  TORCH_CHECK(B.dim() == 2 && (A.dim() == 2 || A.dim() == 3) && A.size(-1) == B.size(0), kHook,
              ": expected A (M, K) or (G, M, K) and B (K, N)");
  TORCH_CHECK(offs.dim() == 1 && offs.scalar_type() == at::kInt && offs.numel() > 0, kHook,
              ": expected offs to be 1-D int32 of at least one group");
  const TorchRaggedOperands t = torch_ragged_operands(
      A, B, scale_a, scale_b, offs, A.dim() == 2 ? GroupedMode::RaggedK : GroupedMode::RaggedN);
  return {t.a, t.b, t.scale_a, t.scale_b, t.ends, t.columns.defined() ? t.columns : at::empty({0}, t.ends.options())};
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CompositeExplicitAutograd, m) {
  m.impl("_scaled_grouped_gemm_torch_operands", &ops::cutlass_gemm::scaled_grouped_gemm_torch_operands);
}

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("scaled_grouped_gemm", &ops::cutlass_gemm::scaled_grouped_gemm_cpu);
  m.impl("scaled_grouped_gemm.out", &ops::cutlass_gemm::scaled_grouped_gemm_out_cpu);
}

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_scaled_grouped_gemm_plan", &ops::cutlass_gemm::scaled_grouped_gemm_plan);
}
