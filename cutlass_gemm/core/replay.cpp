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

// z (m x n, float32) = A (m x k, row-major, lda) @ B (k x n, column-major, ldb) of e4m3 codes: each 128-deep
// K block's partial product times sfa[kb * sfa_ld + i / ga] and sfb[kb * sfb_ld + j / gb] (CUTLASS's blockwise
// mainloop), or with no scales (sfa null) one running sum over K.
at::Tensor fp8_product(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                       const float* sfa = nullptr, int64_t sfa_ld = 0, int ga = 1, const float* sfb = nullptr,
                       int64_t sfb_ld = 0, int gb = 1) {
  const auto* A = static_cast<const c10::Float8_e4m3fn*>(a);
  const auto* B = static_cast<const c10::Float8_e4m3fn*>(b);
  const int64_t k_blocks = (k + kScaleBlock - 1) / kScaleBlock;
  at::Tensor z = at::empty({m, n}, at::kFloat);
  float* zp = z.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const auto dot = [&](int64_t from, int64_t to) {
        float sum = 0;
        for (int64_t kk = from; kk < to; ++kk) {
          sum += static_cast<float>(A[i * lda + kk]) * static_cast<float>(B[j * ldb + kk]);
        }
        return sum;
      };
      float acc = 0;
      if (sfa == nullptr) {
        acc = dot(0, k);
      } else {
        for (int64_t kb = 0; kb < k_blocks; ++kb) {
          acc += dot(kb * kScaleBlock, std::min(k, (kb + 1) * kScaleBlock)) * sfa[kb * sfa_ld + i / ga] *
                 sfb[kb * sfb_ld + j / gb];
        }
      }
      zp[i * n + j] = acc;
    }
  }
  return z;
}

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
  // CUTLASS's blockwise scale layouts: (ceil(extent / granularity), K blocks), the first mode fastest.
  const int ga = sfa_granularity(swap, args.block_n), gb = sfb_granularity(swap, args.block_n);
  at::Tensor z = args.block_scaled
                     ? fp8_product(p.a, p.lda, p.b, p.ldb, p.m, p.n, p.k, p.sfa, (p.sfa_extent + ga - 1) / ga, ga,
                                   p.sfb, (p.sfb_extent + gb - 1) / gb, gb)
                     : fp8_product(p.a, p.lda, p.b, p.ldb, p.m, p.n, p.k);
  if (!args.block_scaled) {
    const at::Tensor sa = at::from_blob(const_cast<float*>(args.scale_a), {args.scale_a_per_row ? (swap ? p.n : p.m) : 1});
    const at::Tensor sb = at::from_blob(const_cast<float*>(args.scale_b), {args.scale_b_per_column ? (swap ? p.m : p.n) : 1});
    // scale_a * (scale_b * acc), each a vector along the kernel's rows or columns, or a scalar.
    const auto along = [&](const at::Tensor& s, bool columns) { return columns ? s.reshape({1, -1}) : s.reshape({-1, 1}); };
    z = along(sa, scale_a_along_columns(swap)) * (along(sb, scale_b_along_columns(swap)) * z);
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

// Group by group as the FP8 grouped kernels run it: the ends clamped (grouped_args.h), each group's operands
// and scales where the device code points them (grouped_kernel_group, scaled_group_scales), rows past the
// last end zeroed.
void replay_scaled_grouped(const ScaledGroupedGemmLaunchArgs& args, at::ScalarType dtype) {
  const GroupedGemmLaunchArgs& grouped = args.grouped;
  const int64_t bytes = c10::elementSize(dtype), extent = grouped_extent(grouped);
  auto* d = static_cast<char*>(grouped.d);
  const auto rows = [&](int64_t first, int64_t count) {
    return at::from_blob(d + first * grouped.ldd * bytes, {count, grouped.n}, {grouped.ldd, 1},
                         at::TensorOptions().dtype(dtype));
  };
  int32_t end = 0;
  for (int g = 0; g < grouped.groups; ++g) {
    const int32_t start = end;
    if (grouped.offs != nullptr) end = std::max(end, clamped_offset(grouped.offs[g], extent));
    const GroupShape shape = group_shape(grouped, g, start, end);
    const GroupedKernelGroup k = grouped_kernel_group(grouped, shape);
    if (k.m == 0) continue;
    const ScaledGroupScales s = scaled_group_scales(args, g, start, shape.m);
    const at::Tensor z = fp8_product(static_cast<const char*>(k.a) + k.a_offset, k.lda,
                                     static_cast<const char*>(k.b) + k.b_offset, k.ldb, k.m, k.n, k.k,
                                     args.scale_a + s.sfa, s.sfa_ld, 1, args.scale_b + s.sfb, s.sfb_ld, args.block_n);
    rows(k.d_offset / grouped.ldd, k.m).copy_(z);
  }
  if (grouped.mode == GroupedKernelMode::RaggedM && end < grouped.m) rows(end, grouped.m - end).zero_();
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
    case GemmKind::ScaledGrouped:
      replay_scaled_grouped(*static_cast<const ScaledGroupedGemmLaunchArgs*>(launch.args), launch.dtype);
      return;
  }
  TORCH_INTERNAL_ASSERT(false, "replay_launch: an unknown kind");
}

}  // namespace ops::cutlass_gemm
