#include "replay.h"

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Float8_e4m3fn.h>

#include "../../csrc/activation_ops.h"
#include "../../csrc/checks.h"  // kScaleBlock

namespace ops::cutlass_gemm {

void emulate_launch(const GemmPlan& plan, const GemmLaunchArgs& args, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  auto strides = [](Layout layout, int64_t ld) {
    return layout == Layout::Row ? std::vector<int64_t>{ld, 1} : std::vector<int64_t>{1, ld};
  };
  // from_blob over exactly the memory the kernel would touch.
  const at::Tensor a = at::from_blob(const_cast<void*>(args.a), {args.m, args.k},
                                     strides(plan.a.layout, args.lda), options);
  const at::Tensor b = at::from_blob(const_cast<void*>(args.b), {args.k, args.n},
                                     strides(plan.b.layout, args.ldb), options);
  at::Tensor d = at::from_blob(args.d, {args.m, args.n}, {args.ldd, 1}, options);
  // fp32 accumulation (and epilogue) for half types, like the tensor-core kernels.
  const at::ScalarType compute = (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
  at::Tensor acc = at::mm(a.to(compute), b.to(compute));
  if (args.bias != nullptr) {
    acc.add_(at::from_blob(const_cast<void*>(args.bias), {args.n}, options).to(compute));
  }
  apply_activation_(acc, epilogue_activation(kernel_info(plan.tactic.kernel).epilogue));
  d.copy_(acc);
}

namespace {

// The kernel's own problem (scaled_kernel_problem: swapped, D^T = B^T A^T with the scales and the bias
// along the other mode of D^T and the blockwise scales in each other's place), computed from the raw
// pointers, leading dimensions and scale layouts, each K block's partial product scaled as the blockwise
// mainloop scales it.
void replay_scaled(const ScaledGemmLaunchArgs& args, at::ScalarType out_dtype) {
  const ScaledKernelProblem p = scaled_kernel_problem(args);
  // The kernel's can_implement: every dynamic stride a multiple of 16 bytes (CUTLASS detail::check_alignment),
  // whatever the extent along it.
  TORCH_CHECK(p.lda % 16 == 0 && p.ldb % 16 == 0 && args.ldd * c10::elementSize(out_dtype) % 16 == 0,
              "_scaled_gemm_emulate: CUTLASS's can_implement would refuse the leading dimensions lda = ", p.lda,
              ", ldb = ", p.ldb, " (FP8 elements), ldd = ", args.ldd, ": each must be 16 bytes");
  const bool swap = args.swap_ab;
  const auto* A = static_cast<const c10::Float8_e4m3fn*>(p.a);
  const auto* B = static_cast<const c10::Float8_e4m3fn*>(p.b);
  const int64_t k_blocks = (p.k + kScaleBlock - 1) / kScaleBlock;
  // CUTLASS's blockwise scale layouts: (ceil(extent / granularity), K blocks), the first mode fastest.
  const int ga = sfa_granularity(swap, args.block_n), gb = sfb_granularity(swap, args.block_n);
  const int64_t sfa_ld = (p.sfa_extent + ga - 1) / ga, sfb_ld = (p.sfb_extent + gb - 1) / gb;
  const auto scale = [](const float* s, bool vector, bool along_columns, int64_t i, int64_t j) {
    return s[vector ? (along_columns ? j : i) : 0];
  };
  at::Tensor z = at::empty({p.m, p.n}, at::kFloat);
  float* zp = z.data_ptr<float>();
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0;
      if (args.block_scaled) {
        for (int64_t kb = 0; kb < k_blocks; ++kb) {
          float part = 0;
          for (int64_t k = kb * kScaleBlock; k < std::min(p.k, (kb + 1) * kScaleBlock); ++k) {
            part += static_cast<float>(A[i * p.lda + k]) * static_cast<float>(B[j * p.ldb + k]);
          }
          acc += part * p.sfa[kb * sfa_ld + i / ga] * p.sfb[kb * sfb_ld + j / gb];
        }
      } else {
        for (int64_t k = 0; k < p.k; ++k) acc += static_cast<float>(A[i * p.lda + k]) * static_cast<float>(B[j * p.ldb + k]);
        acc = scale(args.scale_a, args.scale_a_per_row, scale_a_along_columns(swap), i, j) *
              (scale(args.scale_b, args.scale_b_per_column, scale_b_along_columns(swap), i, j) * acc);
      }
      zp[i * p.n + j] = acc;
    }
  }
  if (args.bias != nullptr) {
    const bool columns = bias_along_columns(swap);
    const at::Tensor bias = at::from_blob(const_cast<void*>(args.bias), {columns ? p.n : p.m},
                                          at::TensorOptions().dtype(out_dtype));
    z.add_(columns ? bias.to(at::kFloat).reshape({1, p.n}) : bias.to(at::kFloat).reshape({p.m, 1}));
  }
  apply_activation_(z, epilogue_activation(args.act));
  const std::vector<int64_t> strides = p.d_column_major ? std::vector<int64_t>{1, args.ldd}
                                                        : std::vector<int64_t>{args.ldd, 1};
  at::from_blob(args.d, {p.m, p.n}, strides, at::TensorOptions().dtype(out_dtype)).copy_(z);
}

// Group by group from the raw pointers, leading dimensions and offs, the ends clamped and the unwritten
// output zeroed as the device code does (grouped_args.h).
void replay_grouped(const GroupedGemmLaunchArgs& args, at::ScalarType dtype) {
  const at::TensorOptions options = at::TensorOptions().dtype(dtype);
  const int64_t bytes = c10::elementSize(dtype), extent = grouped_extent(args);
  auto* d = static_cast<char*>(args.d);
  const auto matrix = [&](const void* base, int64_t rows, int64_t cols, int64_t ld, bool row_major) {
    return at::from_blob(const_cast<void*>(base), {rows, cols}, row_major ? at::IntArrayRef{ld, 1} : at::IntArrayRef{1, ld},
                         options);
  };
  // The kernel's problem per group (grouped_kernel_group and grouped_kernel_layouts, as the device code
  // and with_grouped_config read them; swapped: D^T = B^T A^T, D^T column-major).
  const GroupedKernelLayouts l = grouped_kernel_layouts(args);
  int32_t end = 0;
  for (int g = 0; g < args.groups; ++g) {
    const int32_t start = end;
    if (args.offs != nullptr) end = std::max(end, clamped_offset(args.offs[g], extent));
    const GroupShape s = group_shape(args, g, start, end);
    if (grouped_zeroed_group(args, start, end)) {
      matrix(d + s.d * bytes, args.m, args.n, args.ldd, true).zero_();
      continue;
    }
    const GroupedKernelGroup k = grouped_kernel_group(args, s);
    if (k.m == 0 || k.n == 0) continue;
    const at::Tensor product =
        at::mm(matrix(static_cast<const char*>(k.a) + k.a_offset * bytes, k.m, k.k, k.lda, l.a_row_major).to(at::kDouble),
               matrix(static_cast<const char*>(k.b) + k.b_offset * bytes, k.k, k.n, k.ldb, l.b_row_major).to(at::kDouble));
    matrix(d + k.d_offset * bytes, k.m, k.n, args.ldd, l.d_row_major).copy_(product);
  }
  if (args.mode == GroupedKernelMode::RaggedM && end < args.m) {
    matrix(d + end * args.ldd * bytes, args.m - end, args.n, args.ldd, true).zero_();
  }
}

}  // namespace

void replay_launch(const GemmLaunch& launch) {
  switch (launch.kind) {
    case GemmKind::Dense:
      TORCH_INTERNAL_ASSERT(launch.plan != nullptr, "replay_launch: a dense launch needs its plan");
      emulate_launch(*launch.plan, *static_cast<const GemmLaunchArgs*>(launch.args), launch.dtype);
      return;
    case GemmKind::Scaled: replay_scaled(*static_cast<const ScaledGemmLaunchArgs*>(launch.args), launch.dtype); return;
    case GemmKind::Grouped: replay_grouped(*static_cast<const GroupedGemmLaunchArgs*>(launch.args), launch.dtype); return;
    case GemmKind::ScaledGrouped: break;
  }
  TORCH_INTERNAL_ASSERT(false, "replay_launch: the ", gemm_kind_name(launch.kind), " kind has no kernels");
}

}  // namespace ops::cutlass_gemm
