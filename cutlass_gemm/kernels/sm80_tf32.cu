// SM80 float32 GEMMs on tf32 tensor cores (used when TF32 is allowed), one per operand layout.
#include "../sm80_gemm.cuh"

namespace {
using ops::cutlass_gemm::KernelId;
using cutlass::gemm::GemmShape;
template <KernelId kId>
using Config = ops::cutlass_gemm::Sm80GemmConfig<kId, GemmShape<128, 128, 16>, GemmShape<64, 64, 16>,
                                                 GemmShape<16, 8, 8>, 4>;
}  // namespace

OPS_DEFINE_CUTLASS_GEMM(sm80_tf32_rr, Config<KernelId::sm80_tf32_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_tf32_rc, Config<KernelId::sm80_tf32_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm80_tf32_cr, Config<KernelId::sm80_tf32_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_tf32_cc, Config<KernelId::sm80_tf32_cc>)
