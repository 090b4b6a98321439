// SM80 bf16 GEMMs with bias + activation fused into the epilogue (ops.linear), see kernel_list.h.
#include "../sm80_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm80HalfConfig;

OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_rc_none, Sm80HalfConfig<KernelId::sm80_bf16_rc_none>)
OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_rc_relu, Sm80HalfConfig<KernelId::sm80_bf16_rc_relu>)
OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_rc_gelu, Sm80HalfConfig<KernelId::sm80_bf16_rc_gelu>)
OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_rc_gelu_tanh, Sm80HalfConfig<KernelId::sm80_bf16_rc_gelu_tanh>)
OPS_DEFINE_CUTLASS_GEMM(sm80_bf16_rc_silu, Sm80HalfConfig<KernelId::sm80_bf16_rc_silu>)
