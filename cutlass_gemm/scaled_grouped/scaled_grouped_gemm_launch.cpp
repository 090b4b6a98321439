// The launch of an SM90 FP8 grouped GEMM kernel as the CUDA kernel of ops::scaled_grouped_gemm builds it
// (prepare_scaled_grouped_launch: operands in the kernels' layouts, scales where the blockwise mainloop reads
// them, a fresh output), and its CPU replay. The test hook _scaled_grouped_gemm_emulate runs both on CPU tensors,
// so the host side of the CUDA path and the per-group arithmetic of its device code are checked without a GPU.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <limits>

#include "../core/group_ends.h"
#include "../core/operands.h"
#include "../core/replay.h"
#include "../core/scaled_formula.h"
#include "scaled_grouped_gemm.h"

namespace ops::cutlass_gemm {

std::string scaled_grouped_kernel_refusal(const at::Tensor& A, const at::Tensor& B,
                                          const c10::optional<at::Tensor>& bias, const ScaledGroupedProblem& p) {
  if (p.grouped.mode != GroupedMode::RaggedM && p.grouped.mode != GroupedMode::Batched) {
    return "the FP8 grouped kernels run 2D x 3D and 3D x 3D";
  }
  if (bias.has_value() && bias->defined()) return "the FP8 grouped kernels take no bias";
  if (p.grouped.groups == 0 || A.numel() == 0 || B.numel() == 0) return "an empty problem";
  return int32_extents_refusal({A.size(-2), B.size(-1), A.size(-1), A.size(-2) * ((A.size(-1) + 127) / 128)});
}

namespace {

// scale_a (M rows, K blocks) of 2D x 3D packed per group: group g's (K blocks, its rows) M-major at element
// K blocks * its first row, with the groups cut by offs as the kernels cut them (device_group_ends). Rows past
// the last end go to one slot past the packed scales, never read.
at::Tensor pack_scale_a(const at::Tensor& rows_by_blocks, const at::Tensor& offs) {
  const int64_t m = rows_by_blocks.size(0), k_blocks = rows_by_blocks.size(1);
  const auto longs = offs.options().dtype(at::kLong);
  const at::Tensor ends = device_group_ends(offs.to(at::kLong), m);
  const at::Tensor bounds = at::cat({at::zeros({1}, longs), ends});  // group g: [bounds[g], bounds[g + 1])
  const at::Tensor row = at::arange(m, longs);
  const at::Tensor group = at::searchsorted(ends, row, /*out_int32=*/false, /*right=*/true).clamp_max(ends.size(0) - 1);
  const at::Tensor start = bounds.index_select(0, group), rows = bounds.index_select(0, group + 1) - start;
  const at::Tensor in_group = (row < rows + start).unsqueeze(1);
  const at::Tensor block = at::arange(k_blocks, longs).unsqueeze(0);
  const at::Tensor dest = at::where(in_group, (k_blocks * start + row - start).unsqueeze(1) + block * rows.unsqueeze(1),
                                    m * k_blocks);
  at::Tensor packed = at::empty({m * k_blocks + 1}, rows_by_blocks.options());
  packed.scatter_(0, dest.flatten(), rows_by_blocks.contiguous().flatten());
  return packed;
}

}  // namespace

ScaledGroupedLaunch prepare_scaled_grouped_launch(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                                  const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                                  const ScaledGroupedProblem& p, at::ScalarType dtype) {
  ScaledGroupedLaunch l;
  GroupedGemmLaunchArgs& g = l.args.grouped;
  const bool batched = p.grouped.mode == GroupedMode::Batched;
  g.mode = batched ? GroupedKernelMode::Batched : GroupedKernelMode::RaggedM;
  g.a_row_major = true;  // FP8 wgmma reads K-major A and B only
  g.b_row_major = false;
  g.swap_ab = false;
  g.groups = static_cast<int>(p.grouped.groups);
  g.m = A.size(-2);
  g.k = A.size(-1);
  g.n = B.size(-1);
  l.a = tma_operand(A, /*row_major=*/true);
  l.b = tma_operand(B, /*row_major=*/false);
  l.d = at::empty(p.grouped.out_sizes, A.options().dtype(dtype));
  if (!batched) l.offs = offs->contiguous();
  g.a = l.a.const_data_ptr();
  g.b = l.b.const_data_ptr();
  g.d = l.d.data_ptr();
  g.offs = l.offs.defined() ? l.offs.const_data_ptr<int32_t>() : nullptr;
  g.lda = l.a.stride(-2);
  g.ldb = l.b.stride(-1);
  g.ldd = g.n;
  g.group_stride_a = batched ? l.a.stride(0) : 0;
  g.group_stride_b = l.b.stride(0);
  // The scales as the mainloop reads them, by ATen ops on A's device (no synchronization): scale_a per group
  // (K blocks, its rows) M-major (scaled_grouped_args.h), scale_b (G, K blocks, N / block_n); rowwise scales
  // repeated along K.
  const int64_t k_blocks = (g.k + 127) / 128;
  const bool rowwise = p.recipe == ScaleRecipe::Rowwise;
  const int64_t groups = p.grouped.groups;
  if (batched) {
    l.scale_a = (rowwise ? scale_a.unsqueeze(1).expand({groups, k_blocks, g.m}) : scale_a.transpose(1, 2)).contiguous();
  } else {
    l.scale_a = pack_scale_a(rowwise ? scale_a.unsqueeze(1).expand({g.m, k_blocks}) : scale_a, l.offs);
  }
  l.scale_b = (rowwise ? scale_b.unsqueeze(1).expand({groups, k_blocks, g.n}) : scale_b).contiguous();
  ScaledGroupedGemmLaunchArgs& args = l.args;
  args.scale_a = l.scale_a.const_data_ptr<float>();
  args.scale_b = l.scale_b.const_data_ptr<float>();
  args.block_n = rowwise ? 1 : 128;
  return l;
}

namespace {

// The CUDA path's SM90 launch on CPU tensors: checked and prepared as on CUDA, computed by the replay.
at::Tensor scaled_grouped_gemm_emulate(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a,
                                       const at::Tensor& scale_b, const c10::optional<at::Tensor>& offs,
                                       const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype) {
  constexpr const char* kHook = "_scaled_grouped_gemm_emulate";
  const at::ScalarType dtype = scaled_gemm_out_dtype(out_dtype);
  const ScaledGroupedProblem p = check_scaled_grouped_gemm_inputs(kHook, A, B, scale_a, scale_b, offs, bias, dtype);
  const std::string refusal = scaled_grouped_kernel_refusal(A, B, bias, p);
  TORCH_CHECK(refusal.empty(), kHook, ": the SM90 FP8 grouped kernels do not take this problem: ", refusal);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  ScaledGroupedLaunch l = prepare_scaled_grouped_launch(A, B, scale_a, scale_b, offs, p, dtype);
  l.d.fill_(std::numeric_limits<double>::quiet_NaN());  // an element the kernels would leave unwritten shows
  replay_launch({GemmKind::ScaledGrouped, &l.args, dtype});
  return l.d;
}

}  // namespace
}  // namespace ops::cutlass_gemm

TORCH_LIBRARY_IMPL(ops, CPU, m) {
  m.impl("_scaled_grouped_gemm_emulate", &ops::cutlass_gemm::scaled_grouped_gemm_emulate);
}
