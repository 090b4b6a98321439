// The launch of an SM90 grouped GEMM kernel as the CUDA kernel of ops::grouped_gemm builds it
// (prepare_grouped_launch: operands in the layouts the kernels read, a fresh output), and its CPU replay:
// what the kernels compute from those arguments, group by group from the raw pointers, leading dimensions
// and offs, with the ends clamped and the unwritten output zeroed as the device code does (grouped_args.h).
// The test hook _grouped_gemm_emulate runs both on CPU tensors, so the host side of the CUDA path and the
// per-group arithmetic of its device code are checked without a GPU.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <limits>

#include "../../csrc/json.h"
#include "grouped_gemm.h"
#include "../core/operands.h"
#include "../core/replay.h"
#include "../core/choice.h"  // json_names

namespace ops::cutlass_gemm {
namespace {

GroupedKernelMode kernel_mode(GroupedMode mode) {
  switch (mode) {
    case GroupedMode::RaggedM: return GroupedKernelMode::RaggedM;
    case GroupedMode::RaggedK: return GroupedKernelMode::RaggedK;
    default: return GroupedKernelMode::Batched;
  }
}

bool multiple_of_16_bytes(int64_t extent, const at::Tensor& t) { return extent * t.element_size() % 16 == 0; }

}  // namespace

std::string grouped_kernel_refusal(const at::Tensor& A, const at::Tensor& B, const GroupedProblem& p,
                                   at::ScalarType dtype) {
  const at::ScalarType t = A.scalar_type();
  if ((t != at::kBFloat16 && t != at::kHalf) || dtype != t) {
    return "the grouped kernels take bfloat16 or float16 A and B with out_dtype = their dtype";
  }
  if (p.mode == GroupedMode::RaggedN) {
    return "3D x 2D is not among the grouped kernels' modes: its groups start at any column of B and the "
           "output, where TMA needs 16-byte aligned addresses";
  }
  if (p.groups == 0 || A.numel() == 0 || B.numel() == 0) return "an empty problem";
  const int64_t m = A.size(-2), k = A.size(-1), n = B.size(-1);
  const std::string extents = int32_extents_refusal({m, n, k});
  if (!extents.empty()) return extents;
  // The rows of each operand the kernel reads: K for a row-major A and a column-major B, N for a row-major
  // B and D, M for RaggedK's column-major A.
  const bool aligned = multiple_of_16_bytes(n, A) &&
                       (p.mode == GroupedMode::RaggedK ? multiple_of_16_bytes(m, A) : multiple_of_16_bytes(k, A));
  if (!aligned) {
    return p.mode == GroupedMode::RaggedK ? "M and N must be multiples of 16 bytes (TMA rows)"
                                          : "K and N must be multiples of 16 bytes (TMA rows)";
  }
  if (p.mode == GroupedMode::RaggedK && p.groups > 65535) return "more than 65535 groups of K";
  return "";
}

GroupedGemmLaunchArgs grouped_kernel_layouts(const GroupedProblem& p, const at::Tensor& A, const at::Tensor& B) {
  GroupedGemmLaunchArgs args;
  args.mode = kernel_mode(p.mode);
  // RaggedK reads A column-major (its K, cut by offs, is the column index); the others row-major. B: in place
  // in either layout, else a row-major copy; RaggedK's B is cut along K, its rows: row-major.
  args.a_row_major = args.mode != GroupedKernelMode::RaggedK;
  args.b_row_major = args.mode == GroupedKernelMode::RaggedK || !tma_in_place(B, /*row_major=*/false);
  args.swap_ab = grouped_swap_ab(args.mode, A.size(-2), p.groups);
  return args;
}

GroupedLaunch prepare_grouped_launch(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                     const GroupedProblem& p, at::ScalarType dtype) {
  GroupedLaunch l;
  GroupedGemmLaunchArgs& args = l.args;
  args = grouped_kernel_layouts(p, A, B);
  args.groups = static_cast<int>(p.groups);
  args.m = A.size(-2);
  args.k = A.size(-1);
  args.n = B.size(-1);
  l.a = tma_operand(A, args.a_row_major);
  l.b = tma_operand(B, args.b_row_major);
  l.d = at::empty(p.out_sizes, A.options().dtype(dtype));
  if (args.mode != GroupedKernelMode::Batched) l.offs = offs->contiguous();
  const int64_t last = l.a.dim() - 1;
  args.a = l.a.const_data_ptr();
  args.b = l.b.const_data_ptr();
  args.d = l.d.data_ptr();
  args.offs = l.offs.defined() ? l.offs.const_data_ptr<int32_t>() : nullptr;
  args.lda = args.a_row_major ? l.a.stride(last - 1) : l.a.stride(last);
  args.ldb = args.b_row_major ? l.b.stride(l.b.dim() - 2) : l.b.stride(l.b.dim() - 1);
  args.ldd = args.n;
  args.group_stride_a = l.a.dim() == 3 ? l.a.stride(0) : 0;
  args.group_stride_b = l.b.dim() == 3 ? l.b.stride(0) : 0;
  return l;
}

namespace {

// The CUDA path's SM90 launch on CPU tensors: prepared as on CUDA, computed by the replay.
at::Tensor grouped_gemm_emulate(const at::Tensor& A, const at::Tensor& B, const c10::optional<at::Tensor>& offs,
                                c10::optional<at::ScalarType> out_dtype) {
  return grouped_gemm_with(A, B, offs, out_dtype, [](const at::Tensor& a, const at::Tensor& b,
                                                      const c10::optional<at::Tensor>& o, const GroupedProblem& p,
                                                      at::ScalarType dtype) {
    const std::string refusal = grouped_kernel_refusal(a, b, p, dtype);
    TORCH_CHECK(refusal.empty(), "_grouped_gemm_emulate: the SM90 grouped kernels do not take this problem: ", refusal);
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    GroupedLaunch l = prepare_grouped_launch(a, b, o, p, dtype);
    l.d.fill_(std::numeric_limits<double>::quiet_NaN());  // an element the kernels would leave unwritten shows
    replay_launch({GemmKind::Grouped, &l.args, dtype});
    return l.d;
  });
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) { m.impl("_grouped_gemm_emulate", &ops::cutlass_gemm::grouped_gemm_emulate); }
