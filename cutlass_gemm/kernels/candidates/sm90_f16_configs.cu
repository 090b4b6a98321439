// Candidate-only (built with OPS_CANDIDATE_KERNELS=1): the f16 SM90 configurations the references win
// with (kernel_list.h), for the GPU sweep to measure against the default ones. One TU per dtype: the
// CUTLASS templates they share are instantiated once.
#include "../sm90_gemm.cuh"

// Ping-pong 128x128, 2x1 cluster: plain and every ops.linear epilogue (overlapped with the mainloop).
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_ping128)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_ping128)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_none_ping128)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_relu_ping128)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_ping128)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_gelu_tanh_ping128)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_silu_ping128)

// Large tiles: cooperative 128x256 with a 1x2 cluster, cooperative 256x128 with a 2x1 cluster.
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_coop256c12)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_coop256c12)
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_coop256x128)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_coop256x128)

// M 32-256: ping-pong 64x128 with a 2x1 cluster.
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_pingc2)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_pingc2)

// Decode: swap-AB, data-parallel, 64x16 and 64x32 tiles of D^T.
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_swap64x16)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_swap64x16)
OPS_DEFINE_SM90_GEMM(sm90_f16_rr_swap64x32)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_swap64x32)
