// SM80 bfloat16 GEMMs, one per operand layout (see kernel_list.h).
#include "../sm80_gemm.cuh"

namespace {
using ops::cutlass_gemm::KernelId;
using cutlass::gemm::GemmShape;
template <KernelId kId>
using Config = ops::cutlass_gemm::Sm80GemmConfig<kId, GemmShape<128, 128, 32>, GemmShape<64, 64, 32>,
                                                 GemmShape<16, 8, 16>, 4>;
}  // namespace

OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_rr, Config<KernelId::sm80_bf16_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_rc, Config<KernelId::sm80_bf16_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_cr, Config<KernelId::sm80_bf16_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_cc, Config<KernelId::sm80_bf16_cc>)
