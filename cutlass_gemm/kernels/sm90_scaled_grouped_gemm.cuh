// CUTLASS 3.x SM90 FP8 grouped GEMM (scaled_grouped_launch.h), as CUTLASS example 68 builds it: a pointer-array
// TMA warp-specialized cooperative kernel on 128x128x128 tiles whose FP8 blockwise mainloop scales each 128-deep
// K block's partial product by its scale_a rows and scale_b block as it accumulates in float32, D rounded once
// to its dtype. The per-group problem sizes, operand and scale pointers, strides and scale layouts are built on
// the device from offs by one warp (the grouped kernels' for_each_group), and scale_a comes packed per group
// (scaled_grouped_gemm_launch.cpp, ATen ops on the device), so that no call reads offs on the host; rows past
// the last end are zero-filled as the grouped kernels do.
#pragma once

#include <cutlass/detail/blockwise_scale_layout.hpp>

#include "scaled_grouped_launch.h"
#include "sm90_grouped_gemm.cuh"  // GroupedArrays, for_each_group, fill_group, launch_grouped_zero

namespace ops::cutlass_gemm {

// kBlockN: the columns one scale_b entry covers (128: DeepSeek-V3's 128x128 blocks of B; 1: the rowwise recipe's
// per-column scales, repeated along K). scale_a: one per row and 128 of K. Both scale tensors M/N-major.
template <typename ElementD_, int kBlockN>
struct Sm90ScaledGroupedGemmConfig {
  using ElementAB = cutlass::float_e4m3_t;
  using ElementD = ElementD_;
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kBlockN, 128, cute::GMMA::Major::MN,
                                                                cute::GMMA::Major::MN>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using CollectiveEpilogue = GroupedEpilogue<ElementD, LayoutD, TileShape, ClusterShape>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cute::tuple<LayoutA*, LayoutSFA*>, 16,
      ElementAB, cute::tuple<LayoutB*, LayoutSFB*>, 16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<OnlyOnSm90a<Kernel>>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename ProblemShape::UnderlyingProblemShape;

  // A group's scale layouts, compact: CUTLASS's mainloop builds the same ones from each group's shape (its
  // layout arguments are not read in CUTLASS 4.2; they are given, equal, for a version that reads them).
  CUTLASS_HOST_DEVICE static LayoutSFA layout_sfa(int m, int n, int k) {
    return ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
  }
  CUTLASS_HOST_DEVICE static LayoutSFB layout_sfb(int m, int n, int k) {
    return ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
  }
};

// The groups' scale pointers and layouts, after GroupedArrays in the launch's workspace.
template <typename Config>
struct ScaleArrays {
  const float** sfa = nullptr;
  typename Config::LayoutSFA* layout_sfa = nullptr;
  const float** sfb = nullptr;
  typename Config::LayoutSFB* layout_sfb = nullptr;

  static size_t bytes(int groups) {
    const size_t g = static_cast<size_t>(groups);
    return 2 * workspace_round(g * sizeof(void*)) + workspace_round(g * sizeof(typename Config::LayoutSFA)) +
           workspace_round(g * sizeof(typename Config::LayoutSFB));
  }
  ScaleArrays(void* base, int groups) {
    char* p = static_cast<char*>(base);
    carve(p, sfa, groups);
    carve(p, layout_sfa, groups);
    carve(p, sfb, groups);
    carve(p, layout_sfb, groups);
  }
};

template <typename Config>
__global__ void __launch_bounds__(32) scaled_grouped_prepare_kernel(ScaledGroupedGemmLaunchArgs args,
                                                                    GroupedArrays<Config> arrays,
                                                                    ScaleArrays<Config> scales) {
  for_each_group(args.grouped, [&](int g, int32_t start, int32_t end) {
    const GroupShape shape = fill_group(args.grouped, arrays, g, start, end);
    const ScaledGroupScales s = scaled_group_scales(args, g, start, shape.m);
    scales.sfa[g] = args.scale_a + s.sfa;
    scales.layout_sfa[g] = Config::layout_sfa(shape.m, shape.n, shape.k);
    scales.sfb[g] = args.scale_b + s.sfb;
    scales.layout_sfb[g] = Config::layout_sfb(shape.m, shape.n, shape.k);
  });
}

template <typename Config>
typename Config::Gemm::Arguments scaled_grouped_arguments(const ScaledGroupedGemmLaunchArgs& args,
                                                          const GroupedArrays<Config>& arrays,
                                                          const ScaleArrays<Config>& scales) {
  using ElementD = typename Config::ElementD;
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = args.grouped.device;
  hw_info.sm_count = args.grouped.sm_count;
  typename Config::Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {args.grouped.groups, arrays.shapes, nullptr},
      {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b, scales.sfa, scales.layout_sfa, scales.sfb,
       scales.layout_sfb},
      {{}, const_cast<const ElementD**>(arrays.d), arrays.stride_d, arrays.d, arrays.stride_d},
      hw_info};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 0.0f;
  arguments.epilogue.thread.dAlpha = {cute::_0{}, cute::_0{}, 0};
  arguments.epilogue.thread.dBeta = {cute::_0{}, cute::_0{}, 0};
  return arguments;
}

template <typename Config>
size_t scaled_grouped_workspace_size(const ScaledGroupedGemmLaunchArgs& args) {
  const int groups = args.grouped.groups;
  const GroupedArrays<Config> none(nullptr, groups);
  const ScaleArrays<Config> no_scales(nullptr, groups);
  return GroupedArrays<Config>::bytes(groups) + ScaleArrays<Config>::bytes(groups) +
         Config::Gemm::get_workspace_size(scaled_grouped_arguments(args, none, no_scales));
}

template <typename Config>
LaunchStatus scaled_grouped_run(const ScaledGroupedGemmLaunchArgs& args, void* workspace, size_t workspace_bytes,
                                cudaStream_t stream) {
  if (workspace_bytes < scaled_grouped_workspace_size<Config>(args)) return {false, "workspace too small"};
  const int groups = args.grouped.groups;
  const size_t arrays_bytes = GroupedArrays<Config>::bytes(groups) + ScaleArrays<Config>::bytes(groups);
  const GroupedArrays<Config> arrays(workspace, groups);
  const ScaleArrays<Config> scales(static_cast<char*>(workspace) + GroupedArrays<Config>::bytes(groups), groups);
  scaled_grouped_prepare_kernel<Config><<<1, 32, 0, stream>>>(args, arrays, scales);
  if (cudaGetLastError() != cudaSuccess) return {false, "the FP8 grouped arguments' kernel failed to launch"};
  const LaunchStatus zeroed = launch_grouped_zero<typename Config::ElementD>(args.grouped, arrays.ends, stream);
  if (!zeroed.ok) return zeroed;
  return run_adapter<typename Config::Gemm>(scaled_grouped_arguments(args, arrays, scales),
                                            static_cast<char*>(workspace) + arrays_bytes,
                                            workspace_bytes - arrays_bytes, stream);
}

// fn.template operator()<Config>() for the row of OPS_SCALED_GROUPED_GEMM_KERNELS that serves `args`, else
// `none()` (a swapped launch or another block_n: scaled_grouped_gemm_launch.cpp never asks for one).
template <typename ElementD, typename Fn, typename None>
auto with_scaled_grouped_config(const ScaledGroupedGemmLaunchArgs& args, Fn&& fn, None&& none) {
  if (!args.grouped.swap_ab && args.grouped.a_row_major && !args.grouped.b_row_major) {
#define OPS_SCALED_GROUPED_ROW(row_block_n)                                                    \
    if (args.block_n == row_block_n) {                                                         \
      return fn.template operator()<Sm90ScaledGroupedGemmConfig<ElementD, row_block_n>>();    \
    }
    OPS_SCALED_GROUPED_GEMM_KERNELS(OPS_SCALED_GROUPED_ROW)
#undef OPS_SCALED_GROUPED_ROW
  }
  return none();
}

struct ScaledGroupedKind {  // a grouped kind (sm90_grouped_gemm.cuh's KindRun)
  using Args = ScaledGroupedGemmLaunchArgs;
  template <typename Config>
  static size_t workspace_size(const Args& args) { return scaled_grouped_workspace_size<Config>(args); }
  template <typename Config>
  static LaunchStatus run(const Args& args, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    return scaled_grouped_run<Config>(args, workspace, workspace_bytes, stream);
  }
  template <typename Element, typename Fn, typename None>
  static auto with_config(const Args& args, Fn&& fn, None&& none) {
    return with_scaled_grouped_config<Element>(args, fn, none);
  }
};

}  // namespace ops::cutlass_gemm

// Defines scaled_grouped_gemm_sm90_<out>_{workspace_size,run} (scaled_grouped_launch.h) for D of `Element`.
#define OPS_DEFINE_SM90_SCALED_GROUPED_GEMM(out, Element) \
  OPS_DEFINE_KIND_ENTRY_POINTS(scaled_grouped_gemm_sm90_##out, ScaledGroupedKind, Element, \
                               "no FP8 grouped kernel is built for this configuration")
