// SM80 float32 3xTF32 GEMMs: fp32-accurate, used when TF32 is not allowed (also on Hopper).
#include "../sm80_gemm.cuh"

namespace {
using ops::cutlass_gemm::KernelId;
using cutlass::gemm::GemmShape;
template <KernelId kId>
using Config = ops::cutlass_gemm::Sm80GemmConfig<kId, GemmShape<128, 64, 16>, GemmShape<64, 32, 16>,
                                                 GemmShape<16, 8, 8>, 3>;
}  // namespace

OPS_DEFINE_CUTLASS_GEMM(sm80_3xtf32_rr, Config<KernelId::sm80_3xtf32_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_3xtf32_rc, Config<KernelId::sm80_3xtf32_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm80_3xtf32_cr, Config<KernelId::sm80_3xtf32_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_3xtf32_cc, Config<KernelId::sm80_3xtf32_cc>)
