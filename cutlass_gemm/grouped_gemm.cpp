// ops::grouped_gemm (torch._grouped_mm's modes, checks.h GroupedMode) on CPU: one ATen mm per group on slices
// of A, B and out, in A's dtype, or in float32 for out_dtype float32 (each operand converted, one rounding).
// That is torch._grouped_mm's own CPU path (equal bit for bit: tests/test_grouped_gemm.py). The CUDA kernel
// (grouped_gemm_cuda.cpp) falls back to the same loop where torch's grouped kernel cannot run.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <vector>

#include "../csrc/checks.h"
#include "../csrc/json.h"
#include "grouped_gemm.h"

namespace ops::cutlass_gemm {
namespace {

constexpr const char* kOp = "grouped_gemm";

std::vector<int32_t> group_ends(const GroupedProblem& p, const c10::optional<at::Tensor>& offs) {
  if (p.mode == GroupedMode::Batched) return {};
  const at::Tensor host = offs->to(at::kCPU);  // on CUDA: a copy to the host, synchronizing with the stream
  std::vector<int32_t> ends(host.data_ptr<int32_t>(), host.data_ptr<int32_t>() + p.groups);
  check_group_offsets(kOp, p, ends.data());
  return ends;
}

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

}  // namespace

at::Tensor grouped_gemm_loop(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                             const GroupedProblem& p, at::ScalarType dtype) {
  const std::vector<int32_t> ends = group_ends(p, offs);
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
  JsonObject plan;
  plan.add("mode", grouped_mode_name(p.mode));
  plan.add("path", "loop");
  plan.add("host_sync", false);
  plan.add("offsets", "checked on the host");
  return plan.str();
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

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CompositeImplicitAutograd, m) {
  m.impl("_grouped_gemm_plan", &ops::cutlass_gemm::grouped_gemm_plan);
}

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("grouped_gemm", &ops::cutlass_gemm::grouped_gemm);
  m.impl("grouped_gemm.out", &ops::cutlass_gemm::grouped_gemm_out);
}
