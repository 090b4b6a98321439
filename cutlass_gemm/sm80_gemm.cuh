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

// The tile configurations the kernel TUs instantiate (threadblock, warp, instruction shape, stages).
template <KernelId kId>
using Sm80HalfConfig = Sm80GemmConfig<kId, cutlass::gemm::GemmShape<128, 128, 32>,
                                      cutlass::gemm::GemmShape<64, 64, 32>, cutlass::gemm::GemmShape<16, 8, 16>, 4>;
template <KernelId kId>
using Sm80Tf32Config = Sm80GemmConfig<kId, cutlass::gemm::GemmShape<128, 128, 16>,
                                      cutlass::gemm::GemmShape<64, 64, 16>, cutlass::gemm::GemmShape<16, 8, 8>, 4>;
// 3xTF32 runs three tf32 MMAs per product: smaller tiles, as in CUTLASS's example 27.
template <KernelId kId>
using Sm80Fast3xTf32Config = Sm80GemmConfig<kId, cutlass::gemm::GemmShape<128, 64, 16>,
                                            cutlass::gemm::GemmShape<64, 32, 16>, cutlass::gemm::GemmShape<16, 8, 8>, 3>;
template <KernelId kId>
using Sm80F64Config = Sm80GemmConfig<kId, cutlass::gemm::GemmShape<64, 64, 16>,
                                     cutlass::gemm::GemmShape<32, 32, 16>, cutlass::gemm::GemmShape<8, 8, 4>, 4>;

// The configuration of an sm80 entry of kernel_list.h, from its dtype and math.
template <KernelId kId, DType kDType = kernel_info(kId).dtype, Math kMath = kernel_info(kId).math>
struct Sm80Config : Sm80HalfConfig<kId> {
  static_assert(kDType == DType::Half || kDType == DType::BFloat16, "no SM80 configuration for this entry");
};
template <KernelId kId>
struct Sm80Config<kId, DType::Float, Math::TF32> : Sm80Tf32Config<kId> {};
template <KernelId kId>
struct Sm80Config<kId, DType::Float, Math::Fast3xTF32> : Sm80Fast3xTf32Config<kId> {};
template <KernelId kId, Math kMath>
struct Sm80Config<kId, DType::Double, kMath> : Sm80F64Config<kId> {};

}  // namespace ops::cutlass_gemm

// Defines the launcher of one sm80 entry of kernel_list.h, built from its dtype and math.
#define OPS_DEFINE_SM80_GEMM(name) \
  OPS_DEFINE_CUTLASS_GEMM(name, ops::cutlass_gemm::Sm80Config<ops::cutlass_gemm::KernelId::name>)
