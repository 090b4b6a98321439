// ops::grouped_gemm (torch._grouped_mm's modes, checks.h GroupedMode) on CPU: one ATen mm per group on slices
// of A, B and out, in A's dtype, or in float32 for out_dtype float32 (each operand converted, one rounding).
// That is torch._grouped_mm's own CPU path (equal bit for bit: tests/test_grouped_gemm.py). The CUDA kernel
// (grouped_gemm_cuda.cpp) runs torch._grouped_mm on offsets clamped on the device (grouped_gemm_torch, here:
// ATen calls only, so the tests run it on CPU too) and falls back to the same loop where it cannot.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <utility>
#include <vector>

#include "../../csrc/checks.h"
#include "../../csrc/json.h"
#include "../core/group_ends.h"
#include "../core/plan_json.h"
#include "grouped_gemm.h"
#include "../core/operands.h"  // tma_operand

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "grouped_gemm";

void grouped_gemm_into(const at::Tensor& A, const at::Tensor& B, const GroupedProblem& p,
                       const std::vector<int32_t>& ends, at::Tensor& out) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: ATen calls unseen by autograd
  const at::Tensor a = A.to(out.scalar_type()), b = B.to(out.scalar_type());
  int64_t start = 0;
  switch (p.mode) {
    case GroupedMode::Batched:
      at::bmm_out(out, a, b);
      return;
    case GroupedMode::RaggedM:
      for (int64_t g = 0; g < p.groups; start = ends[g++]) {
        at::Tensor rows = out.slice(0, start, ends[g]);
        at::mm_out(rows, a.slice(0, start, ends[g]), b[g]);
      }
      out.slice(0, start, p.extent).zero_();
      return;
    case GroupedMode::RaggedK:
      for (int64_t g = 0; g < p.groups; start = ends[g++]) {
        at::Tensor group = out[g];
        at::mm_out(group, a.slice(1, start, ends[g]), b.slice(0, start, ends[g]));
      }
      return;
    case GroupedMode::RaggedN:
      for (int64_t g = 0; g < p.groups; start = ends[g++]) {
        at::Tensor columns = out.slice(1, start, ends[g]);
        at::mm_out(columns, a[g], b.slice(1, start, ends[g]));
      }
      out.slice(1, start, p.extent).zero_();
      return;
  }
}

// `t`, or a contiguous copy where its layout is not one torch takes; undefined if neither is.
at::Tensor for_torch(const at::Tensor& t) {
  if (torch_grouped_layout(t)) return t;
  const at::Tensor c = t.contiguous();
  return torch_grouped_layout(c) ? c : at::Tensor();
}

// Whether torch._grouped_mm computes this problem: its dtypes with out_dtype = A's dtype, nothing empty.
bool torch_runs(const at::Tensor& A, const at::Tensor& B, at::ScalarType dtype) {
  const at::ScalarType t = A.scalar_type();
  return dtype == t && (t == at::kBFloat16 || t == at::kHalf || t == at::kFloat) && A.numel() > 0 && B.numel() > 0;
}

// torch's bfloat16 kernel (SM90, SM100) asserts on the device, a sticky error, that every group but the last
// spans a multiple of 16 bytes along the cut dimension where its TMA strides over it (GroupMMCommon.cuh,
// prepare_grouped_gemm_data; row-major means stride(-1) == 1, as GroupMM.cu reads it): the rows of a
// column-major A (2D x 3D), K of a row-major A or of a column-major B (2D x 2D), N of the output (3D x 2D,
// always). Any offsets must run, so the operands get the layouts it leaves unchecked.
bool torch_checks_group_sizes(const at::Tensor& a, const at::Tensor& b, GroupedMode mode) {
  switch (mode) {
    case GroupedMode::RaggedM: return a.stride(-1) != 1;
    case GroupedMode::RaggedK: return a.stride(-1) == 1 || b.stride(-1) != 1;
    case GroupedMode::RaggedN: return true;
    case GroupedMode::Batched: return false;
  }
  return true;
}

// The operands torch._grouped_mm gets (its layouts, and for bfloat16 none whose group sizes it checks), or
// undefined tensors where it takes none.
std::pair<at::Tensor, at::Tensor> torch_operands(const at::Tensor& A, const at::Tensor& B, GroupedMode mode,
                                                 at::ScalarType dtype) {
  if (!torch_runs(A, B, dtype)) return {};
  at::Tensor a = for_torch(A), b = for_torch(B);
  if (!a.defined() || !b.defined() || dtype != at::kBFloat16 || !torch_checks_group_sizes(a, b, mode)) return {a, b};
  if (mode == GroupedMode::RaggedM) a = tma_operand(A, /*row_major=*/true);
  if (mode == GroupedMode::RaggedK) {
    if (a.stride(-1) == 1) a = tma_operand(A, /*row_major=*/false);
    if (b.stride(-1) != 1) b = tma_operand(B, /*row_major=*/true);
  }
  if (!torch_grouped_layout(a) || !torch_grouped_layout(b) || torch_checks_group_sizes(a, b, mode)) return {};
  return {a, b};
}

}  // namespace

bool grouped_gemm_torch_takes(const at::Tensor& A, const at::Tensor& B, const GroupedProblem& p,
                              at::ScalarType dtype) {
  return torch_operands(A, B, p.mode, dtype).first.defined();
}

at::Tensor grouped_gemm_torch(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                              const GroupedProblem& p, at::ScalarType dtype) {
  const auto [a, b] = torch_operands(A, B, p.mode, dtype);
  if (!a.defined() || !b.defined()) return {};
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // a backend kernel: ATen calls unseen by autograd
  const c10::optional<at::Tensor> ends =
      p.mode == GroupedMode::Batched ? c10::nullopt : c10::optional<at::Tensor>(device_group_ends(*offs, p.extent));
  at::Tensor out = at::_grouped_mm(a, b, ends, c10::nullopt, dtype);
  if (ends.has_value()) zero_outside_groups(out, *ends, p);
  // torch pads the last dimension's stride to 16 bytes; the op returns a contiguous tensor (its fake kernel's).
  return out.is_contiguous() ? out : out.contiguous();
}

at::Tensor grouped_gemm_loop(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                             const GroupedProblem& p, at::ScalarType dtype) {
  const std::vector<int32_t> ends = group_ends(kOp, p, offs);
  at::Tensor out = at::empty(p.out_sizes, A.options().dtype(dtype));
  grouped_gemm_into(A, B, p, ends, out);
  return out;
}

std::string grouped_gemm_plan(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                              c10::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = out_dtype.value_or(A.scalar_type());
#if OPS_WITH_CUDA
  if (A.is_cuda()) return grouped_gemm_cuda_path(A, B, offs, dtype);
#endif
  const GroupedProblem p = check_grouped_gemm_inputs(kOp, A, B, offs, dtype);
  PlanHead head;
  head.kind = GemmKind::Grouped;
  head.path = "loop";
  head.reason = "the CPU runs one ATen mm per group";
  return plan_json(head, [&](JsonObject& o) {
    o.add("mode", grouped_mode_name(p.mode)).add("host_sync", false).add("offsets", "checked on the host");
  });
}

namespace {

at::Tensor grouped_gemm(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                        c10::optional<at::ScalarType> out_dtype) {
  return grouped_gemm_with(A, B, offs, out_dtype, grouped_gemm_loop);
}

void grouped_gemm_out(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                      c10::optional<at::ScalarType> out_dtype, at::Tensor& out) {
  grouped_gemm_out_with(A, B, offs, out_dtype, out, grouped_gemm_loop);
}

// The CUDA kernel's torch._grouped_mm path on these (CPU) tensors: a test hook.
at::Tensor grouped_gemm_torch_path(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                   c10::optional<at::ScalarType> out_dtype) {
  return grouped_gemm_with(A, B, offs, out_dtype, [](const at::Tensor& a, const at::Tensor& b,
                                                      const c10::optional<at::Tensor>& o, const GroupedProblem& p,
                                                      at::ScalarType dtype) {
    at::Tensor out = grouped_gemm_torch(a, b, o, p, dtype);
    TORCH_CHECK(out.defined(), "_grouped_gemm_torch_path: torch._grouped_mm does not take this problem");
    return out;
  });
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_grouped_gemm_plan", &ops::cutlass_gemm::grouped_gemm_plan);
}

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("grouped_gemm", &ops::cutlass_gemm::grouped_gemm);
  m.impl("grouped_gemm.out", &ops::cutlass_gemm::grouped_gemm_out);
  m.impl("_grouped_gemm_torch_path", &ops::cutlass_gemm::grouped_gemm_torch_path);
}
