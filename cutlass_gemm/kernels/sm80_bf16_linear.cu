// SM80 bf16 GEMMs with bias + activation fused into the epilogue (ops.linear), see kernel_list.h.
#include "../sm80_gemm.cuh"

OPS_DEFINE_SM80_GEMM(sm80_bf16_rc_none)
OPS_DEFINE_SM80_GEMM(sm80_bf16_rc_relu)
OPS_DEFINE_SM80_GEMM(sm80_bf16_rc_gelu)
OPS_DEFINE_SM80_GEMM(sm80_bf16_rc_gelu_tanh)
OPS_DEFINE_SM80_GEMM(sm80_bf16_rc_silu)
