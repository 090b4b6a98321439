// SM90 f16 GEMMs, ping-pong 64x128 (under one wave, short K), rr and rc layouts (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_f16_rr_ping)
OPS_DEFINE_SM90_GEMM(sm90_f16_rc_ping)
