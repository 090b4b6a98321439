// SM90 float32 GEMMs on tf32 wgmma (used when TF32 is allowed), one per operand layout.
#include "../sm90_gemm.cuh"

namespace {
using namespace cute;
using ops::cutlass_gemm::KernelId;
template <KernelId kId>
using Config = ops::cutlass_gemm::Sm90GemmConfig<kId, Shape<_128, _128, _32>, Shape<_2, _1, _1>>;
}  // namespace

OPS_DEFINE_CUTLASS_GEMM(sm90_tf32_rr, Config<KernelId::sm90_tf32_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_tf32_rc, Config<KernelId::sm90_tf32_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm90_tf32_cr, Config<KernelId::sm90_tf32_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_tf32_cc, Config<KernelId::sm90_tf32_cc>)
