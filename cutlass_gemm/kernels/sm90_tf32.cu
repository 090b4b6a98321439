// SM90 float32 GEMMs on tf32 wgmma (when TF32 is allowed), general config, every layout (kernel_list.h).
#include "sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_tf32_rr)
OPS_DEFINE_SM90_GEMM(sm90_tf32_rc)
OPS_DEFINE_SM90_GEMM(sm90_tf32_cr)
OPS_DEFINE_SM90_GEMM(sm90_tf32_cc)
