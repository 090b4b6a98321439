// ops::grouped_gemm (torch._grouped_mm's modes, checks.h GroupedMode) on CPU, and on CUDA until its CUTLASS
// kernel lands: one ATen mm per group on slices of A, B and out, in A's dtype, or in float32 for
// out_dtype float32 (each operand converted, one rounding). That is torch._grouped_mm's own CPU path
// (equal bit for bit: tests/test_grouped_gemm.py). The group ends are read on the host: on CUDA a copy of
// offs (a host sync), which is why this path does not capture in a CUDA graph.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <vector>

#include "../csrc/checks.h"

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

// out: a fresh tensor of p.out_sizes and out_dtype. Rows (RaggedM) or columns (RaggedN) past the last
// group end are zeroed.
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

at::Tensor grouped_gemm(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                        c10::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = out_dtype.value_or(A.scalar_type());
  const GroupedProblem p = check_grouped_gemm_inputs(kOp, A, B, offs, dtype);
  const std::vector<int32_t> ends = group_ends(p, offs);
  at::Tensor out = at::empty(p.out_sizes, A.options().dtype(dtype));
  grouped_gemm_into(A, B, p, ends, out);
  return out;
}

void grouped_gemm_out(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                      c10::optional<at::ScalarType> out_dtype, at::Tensor& out) {
  TORCH_CHECK(out.defined(), kOp, ": out must be a defined tensor");
  // Without out_dtype, out's dtype decides.
  const at::ScalarType dtype = out_dtype.value_or(out.scalar_type());
  const GroupedProblem p = check_grouped_gemm_inputs(kOp, A, B, offs, dtype);
  check_grouped_gemm_out(kOp, p, A, B, offs, out, dtype, "out_dtype");
  const std::vector<int32_t> ends = group_ends(p, offs);
  // Computed apart from out and copied in last: out never feeds its own computation, any strides.
  at::Tensor result = at::empty(p.out_sizes, A.options().dtype(dtype));
  grouped_gemm_into(A, B, p, ends, result);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  out.copy_(result);
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("grouped_gemm", &ops::cutlass_gemm::grouped_gemm);
  m.impl("grouped_gemm.out", &ops::cutlass_gemm::grouped_gemm_out);
}

TORCH_LIBRARY_IMPL(ops, CUDA, m) {
  m.impl("grouped_gemm", &ops::cutlass_gemm::grouped_gemm);
  m.impl("grouped_gemm.out", &ops::cutlass_gemm::grouped_gemm_out);
}
