// SM90 f16 GEMMs with bias + activation fused (ops.linear) on 128x256 tiles, for large M and N (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_f16_rc_none_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_relu_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_tanh_coop256)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_silu_coop256)
