// CUTLASS 2.x SM80 (Ampere) GEMM configurations: mma.sync tensor cores with multistage cp.async
// pipelines. They also serve Hopper for the math the SM90 kernels lack (3xTF32, fp64).
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/epilogue/thread/linear_combination_generic.h>
#include <cutlass/gemm/device/gemm_universal_base.h>
#include <cutlass/gemm/gemm.h>
#include <cutlass/gemm/kernel/default_gemm_universal.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>

#include "cutlass_common.cuh"

namespace ops::cutlass_gemm {

// kId: an sm80 entry of kernel_list.h. Float inputs use tf32 tensor cores (Math::TF32, CUTLASS's
// OpMultiplyAdd) or the 3xTF32 split (Math::Fast3xTF32, OpMultiplyAddFastF32).
template <KernelId kId, typename ThreadblockShape, typename WarpShape, typename InstructionShape,
          int kStages>
struct Sm80GemmConfig {
  using Traits = KernelTraits<kId>;
  static_assert(Traits::info.sm == 80);
  using Element = typename Traits::Element;
  using LayoutA = typename Traits::LayoutA;
  using LayoutB = typename Traits::LayoutB;
  static constexpr int kAlignment = Traits::kAlignment;
  using MathOperator = std::conditional_t<Traits::info.math == Math::Fast3xTF32,
                                          cutlass::arch::OpMultiplyAddFastF32,
                                          cutlass::arch::OpMultiplyAdd>;
  using Accumulator = std::conditional_t<std::is_same_v<Element, double>, double, float>;
  using LayoutD = cutlass::layout::RowMajor;

  static constexpr bool kBias = Traits::kBias;
  // Plain: D = acc. Bias<Act>: D = act(acc + C) where C is the bias read with a zero row stride
  // (every row of C is the same length-N vector), i.e. beta = 1, ldc = 0; beta = 0 without a bias.
  using EpilogueOp = std::conditional_t<
      kBias,
      cutlass::epilogue::thread::LinearCombinationGeneric<
          ActivationTemplate<Traits::info.epilogue>::template type, Element, kAlignment, Accumulator,
          Accumulator, cutlass::epilogue::thread::ScaleType::Default,
          cutlass::FloatRoundStyle::round_to_nearest, /*IsHeavy=*/true>,
      cutlass::epilogue::thread::LinearCombination<Element, kAlignment, Accumulator, Accumulator>>;

  using Kernel = typename cutlass::gemm::kernel::DefaultGemmUniversal<
      Element, LayoutA, cutlass::ComplexTransform::kNone, kAlignment,  //
      Element, LayoutB, cutlass::ComplexTransform::kNone, kAlignment,  //
      Element, LayoutD, Accumulator, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      ThreadblockShape, WarpShape, InstructionShape, EpilogueOp,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, kStages,
      MathOperator>::GemmKernel;
  // GemmUniversalBase, not the 2.x GemmUniversalAdapter: for a row-major C the adapter passes the
  // kernel the transposed problem (m<->n, A<->B, lda<->ldb; kInternalTranspose) and expects a kernel
  // built for it, as CUTLASS's generator builds them; this kernel is built for D = A B as given. Through
  // the adapter it computed (AB)^T into a row-major D: partly unwritten outputs, writes past the end of
  // D, wrong values (found on an H200, benchmarks/results/2026-11-30-h200). Arguments go to the kernel
  // unchanged here (kernel_side_problem checks that on CPU).
  using Gemm = cutlass::gemm::device::GemmUniversalBase<OnlyOnSm80Family<Kernel, Traits::info.on_sm90>>;

  static typename Gemm::Arguments arguments(const GemmLaunchArgs& args) {
    // beta = 0: the epilogue does not read C (is_source_needed() is false).
    const bool bias = kBias && args.bias != nullptr;
    return typename Gemm::Arguments(
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(args.m), static_cast<int>(args.n), static_cast<int>(args.k)},
        /*batch_count=*/1, typename EpilogueOp::Params(Accumulator(1), Accumulator(bias ? 1 : 0)),
        args.a, args.b, bias ? args.bias : args.d, args.d, /*batch strides*/ 0, 0, 0, 0, args.lda,
        args.ldb, /*ldc=*/bias ? 0 : args.ldd, args.ldd);
  }
};

// The mma.sync instruction of a dtype and math: 16x8x16 for 16-bit types, 16x8x8 for tf32 (also 3xTF32),
// 8x8x4 DMMA for fp64.
template <DType kDType>
using Sm80Instruction = std::conditional_t<
    kDType == DType::Double, cutlass::gemm::GemmShape<8, 8, 4>,
    std::conditional_t<kDType == DType::Float, cutlass::gemm::GemmShape<16, 8, 8>, cutlass::gemm::GemmShape<16, 8, 16>>>;

template <KernelId kId>
inline constexpr ConfigShape kSm80Shape = config_shape(kernel_info(kId));

// The kernel of an sm80 entry of kernel_list.h, built from its config_shape(): threadblock tile and
// stages; four warps, each a quarter (half of M by half of N) of the tile.
template <KernelId kId>
struct Sm80Config
    : Sm80GemmConfig<kId,
                     cutlass::gemm::GemmShape<kSm80Shape<kId>.tile_m, kSm80Shape<kId>.tile_n, kSm80Shape<kId>.tile_k>,
                     cutlass::gemm::GemmShape<kSm80Shape<kId>.tile_m / 2, kSm80Shape<kId>.tile_n / 2,
                                              kSm80Shape<kId>.tile_k>,
                     Sm80Instruction<kernel_info(kId).dtype>, kSm80Shape<kId>.stages> {
  static_assert(kSm80Shape<kId>.schedule == Schedule::Multistage && kSm80Shape<kId>.stages > 0);
};

}  // namespace ops::cutlass_gemm

// Defines the launcher of one sm80 entry of kernel_list.h, built from its config_shape().
#define OPS_DEFINE_SM80_GEMM(name) \
  OPS_DEFINE_CUTLASS_GEMM(name, ops::cutlass_gemm::Sm80Config<ops::cutlass_gemm::KernelId::name>)
