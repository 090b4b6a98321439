// SM80 f16 GEMMs with bias + activation fused into the epilogue (ops.linear), see kernel_list.h.
#include "../sm80_gemm.cuh"

namespace {
using ops::cutlass_gemm::KernelId;
using cutlass::gemm::GemmShape;
template <KernelId kId>
using Config = ops::cutlass_gemm::Sm80GemmConfig<kId, GemmShape<128, 128, 32>, GemmShape<64, 64, 32>,
                                                 GemmShape<16, 8, 16>, 4>;
}  // namespace

OPS_DEFINE_CUTLASS_GEMM(sm80_f16_rc_none, Config<KernelId::sm80_f16_rc_none>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f16_rc_relu, Config<KernelId::sm80_f16_rc_relu>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f16_rc_gelu, Config<KernelId::sm80_f16_rc_gelu>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f16_rc_gelu_tanh, Config<KernelId::sm80_f16_rc_gelu_tanh>)
OPS_DEFINE_CUTLASS_GEMM(sm80_f16_rc_silu, Config<KernelId::sm80_f16_rc_silu>)
