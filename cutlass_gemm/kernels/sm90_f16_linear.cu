// SM90 f16 GEMMs with bias + activation fused into the epilogue (ops.linear), general config (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_f16_rc_none)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_relu)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_tanh)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_silu)
