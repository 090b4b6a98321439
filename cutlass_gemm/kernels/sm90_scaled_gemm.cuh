// CUTLASS 3.x SM90 FP8 scaled GEMM (scaled_launch.h): e4m3 A (row-major) and B (column-major), TMA
// warp-specialized cooperative mainloop on 128x128x128 tiles with a 2x1 cluster (at small M swapped:
// D^T = B^T A^T on 128x32x128 tiles), fast or two-level accumulation, and an epilogue visitor tree D = act(scale_a[m] * (scale_b[n] * acc) + bias[n]) in float32,
// rounded once to D's dtype. The scales broadcast as vectors or as scalars, chosen at run time
// (CUTLASS's dynamic row/column broadcast); a null bias adds 0. Blockwise scales (Sm90BlockScaledGemmConfig):
// CUTLASS's FP8 blockwise mainloop (example 67) scales each 128-deep K block's partial product by its
// scale_a row and scale_b block as it accumulates in float32; the epilogue is act(acc + bias[n]); at small
// M swapped on 128x32x128 tiles as well.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/kernel_hardware_info.h>

#include "cutlass_common.cuh"
#include "scaled_launch.h"
#include "sm90_gemm.cuh"  // stride_with_ld, matrix_extent

namespace ops::cutlass_gemm {

// The kernel's problem (m, n, k), its operand pointers and strides, and the hardware info of a launch, from
// scaled_kernel_problem (scaled_args.h, which the CPU replay reads too): A row-major, B column-major, D
// row-major or (swapped) column-major.
template <typename Kernel>
struct ScaledOperands {
  ScaledKernelProblem p;
  int m, n, k;
  const cutlass::float_e4m3_t* pa;
  const cutlass::float_e4m3_t* pb;
  typename Kernel::StrideA a;
  typename Kernel::StrideB b;
  typename Kernel::StrideD d;
  cutlass::KernelHardwareInfo hw_info;

  explicit ScaledOperands(const ScaledGemmLaunchArgs& args)
      : p(scaled_kernel_problem(args)),
        m(static_cast<int>(p.m)),
        n(static_cast<int>(p.n)),
        k(static_cast<int>(p.k)),
        pa(static_cast<const cutlass::float_e4m3_t*>(p.a)),
        pb(static_cast<const cutlass::float_e4m3_t*>(p.b)),
        a(stride_with_ld<typename Kernel::StrideA>(p.lda, matrix_extent<cutlass::layout::RowMajor>(m, k, p.lda))),
        b(stride_with_ld<typename Kernel::StrideB>(p.ldb, matrix_extent<cutlass::layout::ColumnMajor>(k, n, p.ldb))),
        d(stride_with_ld<typename Kernel::StrideD>(
            args.ldd, p.d_column_major ? matrix_extent<cutlass::layout::ColumnMajor>(m, n, args.ldd)
                                       : matrix_extent<cutlass::layout::RowMajor>(m, n, args.ldd))) {
    hw_info.device_id = args.device;
    hw_info.sm_count = args.sm_count;
  }
};

// The stride of a scale's broadcast node (ScaleA/ScaleB below): its one dynamic (bool) mode 1 for a vector
// along that mode, 0 for a scalar.
template <typename Node>
typename Node::StrideMNL broadcast_stride(bool vector) {
  typename Node::StrideMNL stride{};
  if constexpr (std::is_same_v<cute::remove_cvref_t<decltype(cute::get<0>(stride))>, bool>) {
    cute::get<0>(stride) = vector;
  } else {
    cute::get<1>(stride) = vector;
  }
  return stride;
}

// The epilogue D = act(Tree) (Tree: a visitor tree of the accumulator in float32), rounded once to ElementD
// and stored by TMA in LayoutD; no C source.
template <typename ElementD, Epilogue kAct, typename Tree, typename TileShape, typename ClusterShape,
          typename LayoutD = cutlass::layout::RowMajor>
using ScaledEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD,
    16 / sizeof(ElementD), ElementD, LayoutD, 16 / sizeof(ElementD),
    cutlass::epilogue::TmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<ActivationTemplate<kAct>::template type, ElementD, float,
                                               cutlass::FloatRoundStyle::round_to_nearest>,
        Tree>>::CollectiveOp;

// The tile, D's layout and the bias broadcast of both kernel families: 128x128x128 tiles, D row-major;
// swapped (kSwapAB), 128x32x128 tiles, D^T column-major; the bias along the columns or rows of the kernel's
// D as bias_along_columns says.
template <typename ElementD, bool kSwapAB>
struct ScaledTiling {
  using TileShape = std::conditional_t<kSwapAB, cute::Shape<cute::_128, cute::_32, cute::_128>,
                                       cute::Shape<cute::_128, cute::_128, cute::_128>>;
  using LayoutD = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using Bias = std::conditional_t<
      bias_along_columns(kSwapAB),
      cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementD, float, cute::Stride<cute::_0, cute::_1, int64_t>>,
      cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, ElementD, float, cute::Stride<cute::_1, cute::_0, int64_t>>>;
};

// kSwapAB (ScaledGemmLaunchArgs::swap_ab): the transposed problem on 128x32x128 tiles, D^T column-major;
// scale_a then broadcasts along the kernel's rows (one per column of D^T), scale_b and the bias along its
// columns. The tree is the same expression either way: scale_a * (scale_b * acc) + bias.
template <typename ElementD, Epilogue kAct, bool kFastAccum, bool kSwapAB = false>
struct Sm90ScaledGemmConfig {
  using TileShape = typename ScaledTiling<ElementD, kSwapAB>::TileShape;
  using ClusterShape = std::conditional_t<kSwapAB, cute::Shape<cute::_1, cute::_1, cute::_1>,
                                          cute::Shape<cute::_2, cute::_1, cute::_1>>;
  using LayoutD = typename ScaledTiling<ElementD, kSwapAB>::LayoutD;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  // A vector of one value per row (Col) or per column (Row) of the kernel's D, or one scalar (the bool stride).
  using PerRow = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                                             cute::Stride<bool, cute::_0, int64_t>>;
  using PerColumn = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float,
                                                                cute::Stride<cute::_0, bool, int64_t>>;
  using ScaleA = std::conditional_t<scale_a_along_columns(kSwapAB), PerColumn, PerRow>;
  using ScaleB = std::conditional_t<scale_b_along_columns(kSwapAB), PerColumn, PerRow>;
  using Bias = typename ScaledTiling<ElementD, kSwapAB>::Bias;
  using TimesB = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, ScaleB,
      cutlass::epilogue::fusion::Sm90AccFetch>;
  using Affine = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiply_add, float, float, kRound>, ScaleA, TimesB, Bias>;
  using CollectiveEpilogue = ScaledEpilogue<ElementD, kAct, Affine, TileShape, ClusterShape, LayoutD>;
  using MainloopSchedule = std::conditional_t<kFastAccum, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                                              cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::float_e4m3_t, cutlass::layout::RowMajor, 16,
      cutlass::float_e4m3_t, cutlass::layout::ColumnMajor, 16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<OnlyOnSm90a<Kernel>>;

  static typename Gemm::Arguments arguments(const ScaledGemmLaunchArgs& a) {
    const ScaledOperands<Kernel> o(a);
    typename Gemm::Arguments arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                                       {o.m, o.n, o.k, 1},
                                       {o.pa, o.a, o.pb, o.b},
                                       {{}, nullptr, o.d, static_cast<ElementD*>(a.d), o.d},
                                       o.hw_info};
    // The tree's arguments: {Affine's {scale_a, TimesB's {scale_b, acc, op}, bias, op}, act's op}.
    arguments.epilogue.thread = {
        {{a.scale_a, 0.0f, broadcast_stride<ScaleA>(a.scale_a_per_row)},
         {{a.scale_b, 0.0f, broadcast_stride<ScaleB>(a.scale_b_per_column)}, {}, {}},
         {static_cast<const ElementD*>(a.bias), ElementD(0), {}},
         {}},
        {}};
    return arguments;
  }
};

// kBlockN: the columns one scale_b entry covers (128 or 1); scale_a covers one row, both 128 of K. kSwapAB:
// D^T = B^T A^T on 128x32x128 tiles as above; the user's scale_b then scales the kernel's A (kBlockN rows
// per entry) and scale_a its B (one column per entry), the bias broadcasts along the kernel's rows.
template <typename ElementD, Epilogue kAct, int kBlockN, bool kSwapAB = false>
struct Sm90BlockScaledGemmConfig {
  using TileShape = typename ScaledTiling<ElementD, kSwapAB>::TileShape;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using LayoutD = typename ScaledTiling<ElementD, kSwapAB>::LayoutD;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  // Both scale tensors M/N-major: scale_a stored (ceil(K/128), M), scale_b (ceil(K/128), ceil(N/kBlockN)).
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<sfa_granularity(kSwapAB, kBlockN), sfb_granularity(kSwapAB, kBlockN),
                                                128, cute::GMMA::Major::MN, cute::GMMA::Major::MN>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using Bias = typename ScaledTiling<ElementD, kSwapAB>::Bias;
  using PlusBias = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, float, float, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, Bias>;
  using CollectiveEpilogue = ScaledEpilogue<ElementD, kAct, PlusBias, TileShape, ClusterShape, LayoutD>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::float_e4m3_t,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, 16, cutlass::float_e4m3_t,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, 16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<OnlyOnSm90a<Kernel>>;

  static typename Gemm::Arguments arguments(const ScaledGemmLaunchArgs& a) {
    const ScaledOperands<Kernel> o(a);
    // Each scale layout spans its extent along M (SFA) or N (SFB): the padded scale_a's row length there.
    const auto sfa_shape = cute::make_shape(static_cast<int>(o.p.sfa_extent), o.n, o.k, 1);
    const auto sfb_shape = cute::make_shape(o.m, static_cast<int>(o.p.sfb_extent), o.k, 1);
    typename Gemm::Arguments arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {o.m, o.n, o.k, 1},
        {o.pa, o.a, o.pb, o.b, o.p.sfa, ScaleConfig::tile_atom_to_shape_SFA(sfa_shape), o.p.sfb,
         ScaleConfig::tile_atom_to_shape_SFB(sfb_shape)},
        {{}, nullptr, o.d, static_cast<ElementD*>(a.d), o.d},
        o.hw_info};
    // The tree's arguments: {PlusBias's {acc, bias, op}, act's op}.
    arguments.epilogue.thread = {{{}, {static_cast<const ElementD*>(a.bias), ElementD(0), {}}, {}}, {}};
    return arguments;
  }
};

template <typename ElementD, bool kBlockScaled, int kBlockN, bool kFastAccum, bool kSwapAB>
struct ScaledRow {
  template <Epilogue kAct>
  using type = std::conditional_t<kBlockScaled, Sm90BlockScaledGemmConfig<ElementD, kAct, kBlockN, kSwapAB>,
                                  Sm90ScaledGemmConfig<ElementD, kAct, kFastAccum, kSwapAB>>;
};

// fn.template operator()<Config<kAct>>() for the activation of `act`.
template <template <Epilogue> class Config, typename Fn>
auto with_activation(Epilogue act, Fn&& fn) {
  switch (act) {
    case Epilogue::BiasReLU: return fn.template operator()<Config<Epilogue::BiasReLU>>();
    case Epilogue::BiasGELU: return fn.template operator()<Config<Epilogue::BiasGELU>>();
    case Epilogue::BiasGELUTanh: return fn.template operator()<Config<Epilogue::BiasGELUTanh>>();
    case Epilogue::BiasSiLU: return fn.template operator()<Config<Epilogue::BiasSiLU>>();
    default: return fn.template operator()<Config<Epilogue::BiasIdentity>>();
  }
}

// fn.template operator()<Config>() for the row of OPS_SCALED_GEMM_CONFIGS that serves `args`, else `none()`.
template <typename ElementD, typename Fn, typename None>
auto with_scaled_config(const ScaledGemmLaunchArgs& args, Fn&& fn, None&& none) {
#define OPS_SCALED_ROW(block, block_n, fast, swap)                                                         \
  if (scaled_config_serves(block, block_n, fast, swap, args)) {                                          \
    return with_activation<ScaledRow<ElementD, block, (block_n > 0 ? block_n : 128), fast, swap>::template type>( \
        args.act, fn);                                                                                    \
  }
  OPS_SCALED_GEMM_CONFIGS(OPS_SCALED_ROW)
#undef OPS_SCALED_ROW
  return none();
}

// with_scaled_config's callables (function objects with a template operator(): C++17, which a lambda with
// template parameters is not; torch 2.11's extension builder compiles with -std=c++17).
struct ScaledWorkspaceSize {
  const ScaledGemmLaunchArgs& args;
  template <typename Config>
  size_t operator()() const { return Config::Gemm::get_workspace_size(Config::arguments(args)); }
};

struct ScaledRun {
  const ScaledGemmLaunchArgs& args;
  void* workspace;
  size_t workspace_bytes;
  cudaStream_t stream;
  template <typename Config>
  LaunchStatus operator()() const {
    return run_adapter<typename Config::Gemm>(Config::arguments(args), workspace, workspace_bytes, stream);
  }
};

}  // namespace ops::cutlass_gemm

// Defines scaled_gemm_sm90_<out>_{workspace_size,run} (scaled_launch.h) for D of `Element`.
#define OPS_DEFINE_SM90_SCALED_GEMM(out, Element)                                                        \
  namespace ops::cutlass_gemm {                                                                        \
  size_t scaled_gemm_sm90_##out##_workspace_size(const ScaledGemmLaunchArgs& args) {                   \
    return with_scaled_config<Element>(args, ScaledWorkspaceSize{args}, [] { return size_t{0}; });                                \
  }                                                                                                    \
  LaunchStatus scaled_gemm_sm90_##out##_run(const ScaledGemmLaunchArgs& args, void* workspace,         \
                                            size_t workspace_bytes, cudaStream_t stream) {             \
    return with_scaled_config<Element>(args, ScaledRun{args, workspace, workspace_bytes, stream}, \
        [] { return LaunchStatus{false, "no FP8 kernel is built for this configuration"}; });      \
  }                                                                                                    \
  }
