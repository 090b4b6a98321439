// CUTLASS 3.x SM90 (Hopper) GEMM configurations: TMA loads, wgmma, warp-specialized persistent
// kernels. Built from the collective builders as CUTLASS's Hopper examples do (epilogue builder ->
// mainloop builder with StageCountAutoCarveout -> GemmUniversal -> GemmUniversalAdapter).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

#include "cutlass_common.cuh"

namespace ops::cutlass_gemm {

// A CUTLASS 3.x stride (rows, cols, batch) with the one dynamic leading-dimension mode set to `ld`.
// CUTLASS 3.x treats B as N x K, so a column-major (K-major) B has stride (ldb, 1, batch).
template <typename Stride>
Stride stride_with_ld(int64_t ld, int64_t batch_stride) {
  Stride stride{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(stride))>>::value) {
    cute::get<1>(stride) = ld;
  } else {
    cute::get<0>(stride) = ld;
  }
  cute::get<2>(stride) = batch_stride;
  return stride;
}

// Elements spanned by one matrix of `rows` x `cols` (CUTLASS's layout tag for it) with leading dimension
// `ld`: the batch stride of a one-batch problem. It is not multiplied by anything (L = 1), but CUTLASS
// writes it into the TMA descriptor, whose strides must stay below 2^40 bytes: an over-estimate
// (e.g. M * lda for a column-major A) could fail the descriptor for a very large problem.
template <typename Layout>
int64_t matrix_extent(int64_t rows, int64_t cols, int64_t ld) {
  return (std::is_same_v<Layout, cutlass::layout::RowMajor> ? rows : cols) * ld;
}

// kId: an sm90 entry of kernel_list.h (f16, bf16, or float inputs run as tf32 on wgmma).
// TileScheduler: void (persistent data-parallel) or cutlass::gemm::StreamKScheduler.
// kSwapAB: the kernel runs the transposed problem D^T (N x M, written column-major, i.e. the row-major
// D) = B^T A^T, so that a small M becomes the kernel's N tile; kernel_list.h's layouts stay those of
// the GEMM it serves (A' = B^T has the flipped layout of B, B' = A^T the flipped layout of A).
template <KernelId kId, typename TileShape, typename ClusterShape,
          typename MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative,
          typename EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative,
          typename TileScheduler = void, bool kSwapAB = false>
struct Sm90GemmConfig {
  using Traits = KernelTraits<kId>;
  static_assert(Traits::info.sm == 90);
  using Element = typename Traits::Element;
  using LayoutA = std::conditional_t<kSwapAB, CutlassLayout<flip(Traits::info.b)>, typename Traits::LayoutA>;
  using LayoutB = std::conditional_t<kSwapAB, CutlassLayout<flip(Traits::info.a)>, typename Traits::LayoutB>;
  static constexpr int kAlignment = Traits::kAlignment;
  static_assert(kAlignment * sizeof(Element) == 16, "TMA needs 16-byte alignment");
  using ElementAccumulator = float;
  using LayoutD = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr bool kBias = Traits::kBias;
  static_assert(!(kSwapAB && kBias), "swapped kernels have no bias epilogue (it would be per row of D^T)");

  // Plain: D = acc. Bias<Act>: D = act(acc + bias[n]) (CUTLASS's per-column-bias + activation fusion).
  using FusionOp = std::conditional_t<
      kBias,
      cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
          ActivationTemplate<Traits::info.epilogue>::template type, Element, ElementAccumulator, Element>,
      cutlass::epilogue::fusion::LinearCombination<Element, ElementAccumulator, void, ElementAccumulator>>;

  // No C source (beta = 0): ElementC = void, so the epilogue never reads it.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator,
      void, LayoutD, kAlignment, Element, LayoutD, kAlignment, EpilogueSchedule,
      FusionOp>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element,
      LayoutB, kAlignment, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                      CollectiveMainloop, CollectiveEpilogue,
                                                      TileScheduler>;
  static constexpr bool kStreamK = std::is_same_v<TileScheduler, cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<OnlyOnSm90a<Kernel>>;

  static typename Gemm::Arguments arguments(const GemmLaunchArgs& args) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    // The kernel's problem: (m, n, k) with A (m x k, lda) and B (k x n, ldb), or swapped: (n, m, k)
    // with the user's B^T as A (same memory and leading dimension) and A^T as B.
    const int64_t m = kSwapAB ? args.n : args.m, n = kSwapAB ? args.m : args.n;
    const void* a = kSwapAB ? args.b : args.a;
    const void* b = kSwapAB ? args.a : args.b;
    const int64_t lda = kSwapAB ? args.ldb : args.lda, ldb = kSwapAB ? args.lda : args.ldb;
    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = args.device;
    hw_info.sm_count = args.sm_count;
    // Batch strides: each operand's extent (one batch). A is m x k, B is k x n, D is m x n.
    const int64_t k = args.k;
    const int64_t d_extent = matrix_extent<LayoutD>(m, n, args.ldd);
    typename Gemm::Arguments arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1},
        {static_cast<const Element*>(a), stride_with_ld<StrideA>(lda, matrix_extent<LayoutA>(m, k, lda)),
         static_cast<const Element*>(b), stride_with_ld<StrideB>(ldb, matrix_extent<LayoutB>(k, n, ldb))},
        {{},
         nullptr,
         stride_with_ld<StrideC>(args.ldd, d_extent),
         static_cast<Element*>(args.d),
         stride_with_ld<StrideD>(args.ldd, d_extent)},
        hw_info};
    arguments.epilogue.thread.alpha = 1.0f;
    arguments.epilogue.thread.beta = 0.0f;
    if constexpr (kBias) {
      arguments.epilogue.thread.bias_ptr = static_cast<const Element*>(args.bias);  // null: no bias
    }
    // The tactic's scheduler settings (tactic.h): swizzle and raster order (of the kernel's problem,
    // the transposed one for swap-AB), the decomposition for the stream-K scheduler.
    arguments.scheduler.max_swizzle_size = args.swizzle;
    using RasterOrder = decltype(arguments.scheduler.raster_order);
    switch (args.raster) {
      case Raster::Heuristic: arguments.scheduler.raster_order = RasterOrder::Heuristic; break;
      case Raster::AlongM: arguments.scheduler.raster_order = RasterOrder::AlongM; break;
      case Raster::AlongN: arguments.scheduler.raster_order = RasterOrder::AlongN; break;
    }
    if constexpr (kStreamK) {
      using Mode = decltype(arguments.scheduler.decomposition_mode);
      switch (args.decomposition) {
        case Decomposition::DataParallel: arguments.scheduler.decomposition_mode = Mode::DataParallel; break;
        case Decomposition::SplitK: arguments.scheduler.decomposition_mode = Mode::SplitK; break;
        case Decomposition::StreamK: arguments.scheduler.decomposition_mode = Mode::StreamK; break;
      }
      arguments.scheduler.splits = args.decomposition == Decomposition::SplitK ? args.splits : 1;
    }
    return arguments;
  }
};

// The CUTLASS schedules of a config_shape() schedule (kernel_list.h).
template <Schedule> struct Sm90Schedules;
template <>
struct Sm90Schedules<Schedule::Cooperative> {  // 2 consumer warpgroups on one tile
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
template <>
struct Sm90Schedules<Schedule::Pingpong> {  // 2 consumer warpgroups on alternate tiles
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

template <KernelId kId>
inline constexpr ConfigShape kSm90Shape = config_shape(kernel_info(kId));
template <KernelId kId>
using Sm90TileShape = cute::Shape<cute::Int<kSm90Shape<kId>.tile_m>, cute::Int<kSm90Shape<kId>.tile_n>,
                                  cute::Int<kSm90Shape<kId>.tile_k>>;
template <KernelId kId>
using Sm90ClusterShape = cute::Shape<cute::Int<kSm90Shape<kId>.cluster_m>, cute::Int<kSm90Shape<kId>.cluster_n>, cute::_1>;

// The kernel of an sm90 entry of kernel_list.h, built from its config_shape(): tile, cluster,
// schedule, tile scheduler, swap-AB.
template <KernelId kId>
struct Sm90Config
    : Sm90GemmConfig<kId, Sm90TileShape<kId>, Sm90ClusterShape<kId>,
                     typename Sm90Schedules<kSm90Shape<kId>.schedule>::Mainloop,
                     typename Sm90Schedules<kSm90Shape<kId>.schedule>::Epilogue,
                     std::conditional_t<kSm90Shape<kId>.stream_k, cutlass::gemm::StreamKScheduler, void>,
                     kSm90Shape<kId>.swap_ab> {
  static_assert(kSm90Shape<kId>.stages == 0, "SM90 kernels take CUTLASS's automatic stage count");
};

}  // namespace ops::cutlass_gemm

// Defines the launcher of one sm90 entry of kernel_list.h, built from its config_shape().
#define OPS_DEFINE_SM90_GEMM(name) \
  OPS_DEFINE_CUTLASS_GEMM(name, ops::cutlass_gemm::Sm90Config<ops::cutlass_gemm::KernelId::name>)
