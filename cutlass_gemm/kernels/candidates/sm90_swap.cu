// Candidate-only (built with OPS_CANDIDATE_KERNELS=1): swap-AB GEMMs for small M (D^T = B^T A^T on
// 128x32 tiles, stream-K scheduler), f16 and bf16, rr and rc layouts (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_f16_rr_swap)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_swap)
OPS_DEFINE_SM90_GEMM(sm90_bf16_rr_swap)
OPS_DEFINE_SM90_GEMM(sm90_bf16_rc_swap)
