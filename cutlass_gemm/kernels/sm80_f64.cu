// SM80 fp64 (DMMA) GEMMs, one per operand layout; also built into the sm_90a image (kernel_list.h).
#include "../sm80_gemm.cuh"

namespace {
using ops::cutlass_gemm::KernelId;
using cutlass::gemm::GemmShape;
template <KernelId kId>
using Config = ops::cutlass_gemm::Sm80GemmConfig<kId, GemmShape<64, 64, 16>, GemmShape<32, 32, 16>,
                                                 GemmShape<8, 8, 4>, 4>;
}  // namespace

OPS_DEFINE_CUTLASS_GEMM(sm80_f64_rr, Config<KernelId::sm80_f64_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f64_rc, Config<KernelId::sm80_f64_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f64_cr, Config<KernelId::sm80_f64_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f64_cc, Config<KernelId::sm80_f64_cc>)
