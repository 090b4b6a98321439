// SM90 float16 GEMMs, one per operand layout (see kernel_list.h).
#include "../sm90_gemm.cuh"

namespace {
using namespace cute;
using ops::cutlass_gemm::KernelId;
template <KernelId kId>
using Config = ops::cutlass_gemm::Sm90GemmConfig<kId, Shape<_128, _128, _64>, Shape<_2, _1, _1>>;
}  // namespace

OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rr, Config<KernelId::sm90_f16_rr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc, Config<KernelId::sm90_f16_rc>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_cr, Config<KernelId::sm90_f16_cr>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_cc, Config<KernelId::sm90_f16_cc>)
