// SM90 f16 GEMMs with bias + activation fused into the epilogue (ops.linear), see kernel_list.h.
#include "../sm90_gemm.cuh"

using ops::cutlass_gemm::KernelId;
using ops::cutlass_gemm::Sm90HalfConfig;

OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_none, Sm90HalfConfig<KernelId::sm90_f16_rc_none>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_relu, Sm90HalfConfig<KernelId::sm90_f16_rc_relu>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_gelu, Sm90HalfConfig<KernelId::sm90_f16_rc_gelu>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_gelu_tanh, Sm90HalfConfig<KernelId::sm90_f16_rc_gelu_tanh>)
OPS_DEFINE_CUTLASS_GEMM(sm90_f16_rc_silu, Sm90HalfConfig<KernelId::sm90_f16_rc_silu>)
