// SM90 bf16 GEMMs on the stream-K scheduler (few output tiles, long K), rr and rc layouts (kernel_list.h).
#include "../sm90_gemm.cuh"

OPS_DEFINE_SM90_GEMM(sm90_bf16_rr_streamk)
OPS_DEFINE_SM90_GEMM(sm90_bf16_rc_streamk)
