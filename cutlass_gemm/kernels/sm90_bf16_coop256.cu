// SM90 bf16 GEMMs for large M and N (cooperative 128x256, 2x1 cluster), rr and rc layouts (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_bf16_rr_coop256)
OPS_DEFINE_SM90_GEMM(sm90_bf16_rc_coop256)
