// SM90 float32 GEMMs on tf32 wgmma (used when TF32 is allowed), general config, one per operand layout (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_tf32_rr)
OPS_DEFINE_SM90_GEMM(sm90_tf32_rc)
OPS_DEFINE_SM90_GEMM(sm90_tf32_cr)
OPS_DEFINE_SM90_GEMM(sm90_tf32_cc)
