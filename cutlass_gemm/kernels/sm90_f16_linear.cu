// SM90 f16 GEMMs with bias + activation fused into the epilogue (ops.linear), see kernel_list.h.
#include "../sm90_gemm.cuh"

namespace {
using namespace cute;
using ops::cutlass_gemm::KernelId;
template <KernelId kId>
using Config = ops::cutlass_gemm::Sm90GemmConfig<kId, Shape<_128, _128, _64>, Shape<_2, _1, _1>>;
}  // namespace

OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_none, Config<KernelId::sm90_f16_rc_none>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_relu, Config<KernelId::sm90_f16_rc_relu>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_gelu, Config<KernelId::sm90_f16_rc_gelu>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_gelu_tanh, Config<KernelId::sm90_f16_rc_gelu_tanh>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_silu, Config<KernelId::sm90_f16_rc_silu>)
