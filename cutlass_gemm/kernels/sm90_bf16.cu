// SM90 bf16 GEMMs, general config (cooperative 128x128, 2x1 cluster), one per operand layout (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_bf16_rr)
OPS_DEFINE_SM90_GEMM(sm90_bf16_rc)
OPS_DEFINE_SM90_GEMM(sm90_bf16_cr)
OPS_DEFINE_SM90_GEMM(sm90_bf16_cc)
